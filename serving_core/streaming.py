"""Streams are events, door-neutral: a streaming row (a generation request with ``"stream": true``) is answered as a
sequence of JSON events, which each door maps to its protocol's chunks (TorchServe: one JSON document a line, or one
gRPC message each; the OpenAI API: server-sent events of its chunks; KServe: server-sent events). Nothing buffers a
stream whole.

The events of one row, in order (docs/SERVING.md, "Streaming"):

- ``{"event": "token", "text": ..., "steps": [...]}``, as the decoding loop writes the tokens: ``text`` the answer's
  new characters (the texts of a row's token events, joined, are the start of its answer's ``text``), ``steps`` the
  new steps in the answer's ``steps`` shape (``token``, ``token_id``, ``probability``, and the log-probabilities when
  the row asked for them);
- then exactly one last event: ``{"event": "answer", ...}``, the row's whole answer (the same document as without a
  stream: its ``text``, ``steps``, ``explanation``) with ``"event"`` added; or ``{"event": "error", "error": {...},
  "text": ...}``, the error table's error of a row that failed (a deadline passed, the batch failed) with the text
  its token events had carried.

Plain Python (no torch): the router and the clients read it too.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

#: The ``event`` of each kind of event.
TOKEN, ANSWER, ERROR = "token", "answer", "error"
#: The content type of a stream of JSON events, one a line (TorchServe's REST stream).
JSON_LINES = "application/jsonl"

#: What a streaming row's service is given: called with each token event (a JSON document) as it is written.
Listener = Callable[[dict[str, Any]], None]


def token_event(text: str, steps: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A token event: the answer's new characters ``text`` and its new ``steps``."""
    return {"event": TOKEN, "text": text, "steps": [dict(step) for step in steps]}


def final_event(answer: Mapping[str, Any], text: str = "") -> dict[str, Any]:
    """The last event of a row: its ``answer`` (the task's JSON document) as an ``answer`` event, or, for a failed row
    (``{"error": {...}}``), an ``error`` event keeping ``text``, what its token events carried."""
    if isinstance(answer.get("error"), Mapping):
        return {"event": ERROR, "error": dict(answer["error"]), "text": text}
    return {"event": ANSWER, **answer}


def answer_events(answer: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The events of a row answered whole (where its door could not stream it as it was written): its text as one
    token event, then its answer event; a failed row: its error event."""
    if isinstance(answer.get("error"), Mapping):
        return [final_event(answer)]
    return [token_event(str(answer.get("text", "")), answer.get("steps", ())), final_event(answer)]


def json_line(event: Mapping[str, Any]) -> bytes:
    """One event as a line of JSON (``\\n``-terminated)."""
    return json.dumps(event, separators=(",", ":")).encode("utf-8") + b"\n"


def read_lines(chunks: Iterable[bytes]) -> Iterator[dict[str, Any]]:
    """The events of a stream of JSON lines, as its chunks arrive (a chunk may hold part of a line, or many).

    Raises:
        ValueError: for a line that is not a JSON object.
    """
    pending = b""
    for chunk in chunks:
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if line.strip():
                yield _event(line)
    if pending.strip():
        yield _event(pending)


def _event(line: bytes) -> dict[str, Any]:
    document = json.loads(line)
    if not isinstance(document, dict):
        raise ValueError(f"a stream's line is not a JSON object: {line[:80]!r}")
    return document


class RowStream:
    """One streaming row at a door: sends its token events as they come (:attr:`listener`) and keeps their text, so
    that its last event (:meth:`final`) keeps the text of a row that then failed.

    Attributes:
        tokens: the steps its token events carried so far.
        sent: the token events sent so far (none: the door may still answer with an HTTP status of its own).
    """

    def __init__(self, send: Callable[[dict[str, Any]], None]) -> None:
        """Send each event with ``send``."""
        self._send = send
        self._parts: list[str] = []
        self.tokens = 0
        self.sent = 0

    @property
    def text(self) -> str:
        """The text the token events sent so far carried."""
        return "".join(self._parts)

    def listener(self, event: dict[str, Any]) -> None:
        """Send one token event (the row's :data:`Listener`)."""
        self._parts.append(str(event.get("text", "")))
        self.tokens += len(event.get("steps", ()))
        self.sent += 1
        self._send(event)

    def final(self, answer: Mapping[str, Any]) -> dict[str, Any]:
        """The row's last event for its answer (:func:`final_event`)."""
        return final_event(answer, self.text)
