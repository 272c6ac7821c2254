"""The request headers the doors read (gRPC metadata too), found whatever their case: plain Python, no torch (the
router in front of TorchServe imports it).

- ``Explain-Deadline-Ms``: the Unix time in milliseconds by which the answer is due (docs/SERVING.md, "Time budgets
  and deadlines"); :func:`deadline_ms` reads it, :func:`serving_core.deadlines.header_deadline` turns it into a
  deadline.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: The header (gRPC: metadata key) a request may carry its deadline in, as HTTP/2 and gRPC spell it (lower case).
DEADLINE_HEADER = "explain-deadline-ms"


def header(headers: Mapping[Any, Any] | None, name: str) -> Any:
    """The value of header ``name`` in ``headers``, matched whatever its case (``None``: absent)."""
    wanted = name.lower()
    return next((value for key, value in (headers or {}).items() if str(key).lower() == wanted), None)


def deadline_ms(value: Any) -> int | None:
    """The Unix milliseconds of an :data:`DEADLINE_HEADER` value (``str`` or ``bytes``; ``None`` or empty: none).

    Raises:
        ValueError: naming the header, for a value that is not a positive integer.
    """
    if value is None or value in ("", b""):
        return None
    text = (bytes(value).decode("latin-1") if isinstance(value, bytes | bytearray) else str(value)).strip()
    if not text.isdigit() or int(text) <= 0:
        raise ValueError(
            f"the {DEADLINE_HEADER} header must be the Unix time in milliseconds by which the answer is due (a "
            f"positive integer), got {value!r}"
        )
    return int(text)
