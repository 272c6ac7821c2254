"""Deprecated alias of :mod:`doors.torchserve.handler`, kept for one release (archives built before the move import
``handlers.base.ExplanationHandler`` from their entry file)."""

from doors.torchserve.handler import ExplanationHandler

__all__ = ["ExplanationHandler"]
