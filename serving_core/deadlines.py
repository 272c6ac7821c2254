"""A request's deadline as the doors receive it: the Unix time in milliseconds by which its answer is due
(``explain.deadline_ms`` in JSON, the ``deadline_ms`` parameter of the KServe/OIP and OpenAI doors), or a gRPC
deadline's time remaining; turned into an :class:`explainers.Deadline` that the explanation checks between chunks
(docs/SERVING.md, "Time budgets and deadlines")."""

from __future__ import annotations

from typing import Any

from explainers import Deadline

from .errors import RowError


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


#: The HTTP header a REST request may carry its deadline in (Unix milliseconds, as ``explain.deadline_ms``).
DEADLINE_HEADER = "explain-deadline-ms"


def header_deadline(value: Any) -> Deadline | None:
    """The deadline of an :data:`DEADLINE_HEADER` header's value (``None``: absent).

    Raises:
        RowError: ``invalid_request`` for a value that is not a positive integer.
    """
    if value is None or value == "":
        return None
    if isinstance(value, bytes | bytearray):
        value = bytes(value).decode("latin-1")
    text = str(value).strip()
    return decode_deadline_ms(int(text) if text.isdigit() else text, f"the {DEADLINE_HEADER} header")


def grpc_deadline(time_remaining: float | None) -> Deadline | None:
    """The deadline of a gRPC call from its ``context.time_remaining()`` (``None``: the caller set none)."""
    return None if time_remaining is None else Deadline.within(time_remaining)
