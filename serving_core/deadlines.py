"""A request's deadline as the doors receive it: the Unix time in milliseconds by which its answer is due
(``explain.deadline_ms`` in JSON, ``ExplainRequest.deadline_ms``, the ``explain_deadline_ms`` parameter of the OIP,
the ``Explain-Deadline-Ms`` header); turned into an :class:`explainers.Deadline` that the explanation checks between
chunks (docs/SERVING.md, "Time budgets and deadlines")."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from explainers import Deadline

from .errors import RowError
from .headers import DEADLINE_HEADER, deadline_ms, header


def decode_deadline_ms(value: Any, where: str = "deadline_ms") -> Deadline | None:
    """The deadline of a request field holding Unix milliseconds (``None``: no deadline).

    Raises:
        RowError: ``invalid_request`` for a value that is not a positive integer.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise RowError(
            "invalid_request",
            f"'{where}' must be the Unix time in milliseconds by which the answer is due (a positive integer), "
            f"got {value!r}",
        )
    return Deadline.at_unix(value / 1000)


def earliest(first: Deadline | None, second: Deadline | None) -> Deadline | None:
    """The earlier of two deadlines (a request's own field and the one its door received); ``None`` when neither."""
    if first is None or second is None:
        return first or second
    return first if first.expires <= second.expires else second


def proto_deadline(deadline_ms: int) -> Deadline | None:
    """The deadline of an ``ExplainRequest.deadline_ms`` (0: none).

    Raises:
        RowError: ``invalid_request`` for a negative value.
    """
    return None if deadline_ms == 0 else decode_deadline_ms(int(deadline_ms), "ExplainRequest.deadline_ms")


def header_deadline(value: Any) -> Deadline | None:
    """The deadline of an ``Explain-Deadline-Ms`` header's value (:func:`serving_core.headers.deadline_ms`;
    ``None``: absent).

    Raises:
        RowError: ``invalid_request`` for a value that is not a positive integer.
    """
    try:
        due = deadline_ms(value)
    except ValueError as error:
        raise RowError("invalid_request", str(error)) from None
    return None if due is None else Deadline.at_unix(due / 1000)


def headers_deadline(headers: Mapping[Any, Any] | None) -> Deadline | None:
    """The deadline of the ``Explain-Deadline-Ms`` entry of request headers or gRPC metadata, whatever its case.

    Raises:
        RowError: ``invalid_request`` for a value that is not a positive integer.
    """
    return header_deadline(header(headers, DEADLINE_HEADER))
