"""Errors raised by the explainers.

Every error is a ``ValueError`` subclass so that callers who only know the standard library can still catch
it; the subclasses let the serving layer map each kind to an HTTP status and a gRPC code (one table, in
``handlers/``). Messages say what was wrong and what the valid choices are.
"""

from __future__ import annotations


class ExplainError(ValueError):
    """Base class of every error the explainers raise for a bad call."""


class UnknownMethodError(ExplainError):
    """The requested attribution method is not registered."""


class InvalidTargetError(ExplainError):
    """The target class is out of range, of the wrong shape or of the wrong type."""


class InvalidInputError(ExplainError):
    """The inputs mapping has missing, unexpected or malformed entries."""


class InvalidOptionError(ExplainError):
    """A method option is unknown or out of range (for example ``start_layer``)."""


class UnsupportedModelError(ExplainError):
    """The model's architecture is not one the explainers know how to explain."""


class NonFiniteScoresError(ExplainError):
    """A row's attribution came out NaN or infinite: a numerical breakdown on that input, not a bad call. Raised
    per row by :func:`explainers.explain_batch` (the serving path), so that no NaN ever reaches a response."""


class UnsupportedMethodError(ExplainError):
    """The method is undefined on this model's architecture (the message names the model type, the reason and the
    methods that do work); see :mod:`explainers.architectures.support`."""
