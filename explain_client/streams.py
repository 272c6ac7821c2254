"""A streamed generation (:meth:`~explain_client.client.ExplainClient.generate_stream`): the model's tokens as the
service writes them, then the whole answer with its explanation.

The service answers a streaming request (``"stream": true``) with JSON events, one a line over REST (chunked) and one
a message over gRPC ``StreamPredictions`` (docs/SERVING.md, "Streaming"): ``{"event": "token", "text", "steps"}`` as
the tokens are written, then ``{"event": "answer", ...}`` (the answer, as :meth:`Generation.from_dict` reads it) or
``{"event": "error", "error": {...}, "text"}``; every event carries the answer's ``id`` (the id of its record). A
:class:`GenerationStream` yields the token events as
:class:`TokenEvent` objects while they arrive, and keeps the answer (:attr:`GenerationStream.generation`) or raises
the error (the text written before it stays in :attr:`GenerationStream.text`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from .generation import Generation
from .results import ServiceError, answer_id


@dataclass(frozen=True)
class TokenEvent:
    """New tokens of a streamed answer.

    Attributes:
        text: the answer's new characters (the events' texts, joined, are the start of the answer's text).
        steps: the new steps as the answer's ``steps`` show them (``token``, ``token_id``, ``probability``, and
            their log-probabilities when asked).
    """

    text: str
    steps: list[dict[str, Any]] = field(default_factory=list)


def json_lines(chunks: Iterable[bytes]) -> Iterator[dict[str, Any]]:
    """The JSON objects of a stream of JSON lines as its chunks arrive (a chunk may hold part of a line, or many).

    Raises:
        ServiceError: ``internal`` for a line that is not a JSON object.
    """
    pending = b""
    for chunk in chunks:
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if line.strip():
                yield _object(line)
    if pending.strip():
        yield _object(pending)


def _object(line: bytes) -> dict[str, Any]:
    try:
        document = json.loads(line)
    except ValueError:
        document = None
    if not isinstance(document, dict):
        raise ServiceError("internal", f"the service's stream has a line that is not a JSON object: {line[:80]!r}")
    return document


class GenerationStream:
    """A streamed generation: iterate it for its :class:`TokenEvent` objects as they arrive; then
    :attr:`generation` is the answer.

    Attributes:
        text: the text the token events carried so far.
        generation: the answer, once the stream has ended with it (``None`` before).
        request_id: the answer's id (its record's), from the first event that carries it (``None`` before, or from a
            service that sends none).
    """

    def __init__(self, events: Iterator[Mapping[str, Any]]) -> None:
        """Read the service's events as they come.

        Args:
            events: the stream's events (JSON documents), as the transport receives them.
        """
        self._events = events
        self.text = ""
        self.generation: Generation | None = None
        self.request_id: str | None = None

    def __iter__(self) -> Iterator[TokenEvent]:
        """The token events as they arrive.

        Raises:
            ServiceError: the stream's error event (its code and message; :attr:`text` keeps what came before), or
                a stream that ended without an answer.
        """
        for event in self._events:
            if self.request_id is None:
                self.request_id = answer_id(event)
            kind = event.get("event")
            if kind == "token":
                token = TokenEvent(str(event.get("text", "")), list(event.get("steps", [])))
                self.text += token.text
                yield token
            elif kind == "answer":
                self.generation = Generation.from_dict(event)
                return
            elif kind == "error" or "error" in event:
                error = event.get("error") or {}
                raise ServiceError(str(error.get("code", "internal")), str(error.get("message", "the stream failed")),
                                   error.get("http_status"), error.get("grpc_code"),
                                   request_id=answer_id(event))  # fmt: skip
        if self.generation is None:
            raise ServiceError("internal", "the service's stream ended without an answer")

    def result(self) -> Generation:
        """The answer, once the rest of the stream is read.

        Raises:
            ServiceError: see :meth:`__iter__`.
        """
        for _ in self:
            pass
        assert self.generation is not None
        return self.generation
