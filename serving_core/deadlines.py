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


def grpc_deadline(time_remaining: float | None) -> Deadline | None:
    """The deadline of a gRPC call from its ``context.time_remaining()`` (``None``: the caller set none)."""
    return None if time_remaining is None else Deadline.within(time_remaining)
