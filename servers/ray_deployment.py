"""Deprecated alias of :mod:`doors.kserve.ray_deployment`, kept for one release (``import_path:
servers.ray_deployment:build_app`` in Serve configs and RayServices written before the move)."""

from doors.kserve.ray_deployment import build_app

__all__ = ["build_app"]
