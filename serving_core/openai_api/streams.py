"""A streamed OpenAI answer made from the generation task's events (:mod:`serving_core.streaming`) as they come: each
choice's token events become chunks with ``delta.content`` (completions: ``text``) and, when asked, that chunk's
``logprobs``; its answer event the chunk with ``finish_reason`` and the ``explanation``; with
``stream_options.include_usage`` a last chunk with ``usage`` once every choice is answered; then ``data: [DONE]``.
An error after the first chunk (a choice's error event: a passed deadline, a failed batch) ends the stream with an
OpenAI ``error`` object event (``data: {"error": {...}}``, what the ``openai`` client raises as an ``APIError``), the
text sent so far kept by the client; nothing follows it.

Each door reads its choices' events its own way (TorchServe's door: JSON lines from ``/predictions``; the KServe door:
its listeners) and hands them here one by one (:meth:`ChunkStream.event`), in the order they come: chunks of
different choices interleave, each chunk naming its choice's ``index``.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from ..streaming import ANSWER, ERROR, TOKEN, answer_events
from .answers import _checked, _explanation, _finish, _header, _logprobs, usage
from .errors import OpenAIError, row_failure
from .requests import Translated

#: The last event of an OpenAI stream.
DONE = b"data: [DONE]\n\n"


def sse(document: Mapping[str, Any]) -> bytes:
    """One server-sent event ``data: <document>``."""
    return f"data: {json.dumps(document, separators=(',', ':'))}\n\n".encode()


class ChunkStream:
    """The chunks of one streamed OpenAI request, from its choices' events."""

    def __init__(self, translated: Translated) -> None:
        """Stream the answer of ``translated`` (its choices: one generation document each)."""
        self.translated = translated
        chat = translated.kind == "chat"
        self._chat = chat
        self._header = _header(translated, "chat.completion.chunk" if chat else "text_completion")
        if translated.include_usage:
            self._header["usage"] = None
        self._opened: set[int] = set()
        self._offsets = [0] * len(translated.documents)
        self._answers: dict[int, Mapping[str, Any]] = {}
        self.failed = False

    def event(self, choice: int, event: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The chunks of one event of choice ``choice`` (an ``error`` event: the one ``error`` object that ends the
        stream; any event after it: none)."""
        if self.failed:
            return []
        kind = event.get("event")
        if kind == ERROR or (kind == ANSWER and row_failure(event) is not None):
            self.failed = True
            failure = row_failure(event) or OpenAIError("internal", "the choice failed")
            return [failure.to_dict()]
        chunks = self._opening(choice)
        if kind == TOKEN:
            steps = list(event.get("steps", ()))
            text = str(event.get("text", ""))
            if text or steps:
                chunks.append(self._chunk(choice, self._content(text), self._step_logprobs(choice, steps, text)))
        elif kind == ANSWER:
            self._answers[choice] = event
            last: dict[str, Any] = {"delta": {}} if self._chat else {"text": ""}
            last.update({"logprobs": None, "finish_reason": _finish(event)})
            explanation = _explanation(event)
            if explanation is not None:
                last["explanation"] = explanation
            chunks.append({**self._header, "choices": [{"index": choice, **last}]})
            if self.translated.include_usage and len(self._answers) == len(self.translated.documents):
                answers = [self._answers[index] for index in range(len(self.translated.documents))]
                chunks.append({**self._header, "choices": [], "usage": usage(self.translated, answers)})
        return chunks

    def _opening(self, choice: int) -> list[dict[str, Any]]:
        """The role chunk of a chat choice's first event (none for a completion or after the first)."""
        if choice in self._opened:
            return []
        self._opened.add(choice)
        if not self._chat:
            return []
        role = {"delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        return [{**self._header, "choices": [{"index": choice, **role}]}]

    def _content(self, text: str) -> dict[str, Any]:
        return {"delta": {"content": text}} if self._chat else {"text": text}

    def _chunk(self, choice: int, content: dict[str, Any], logprobs: dict[str, Any] | None) -> dict[str, Any]:
        return {**self._header, "choices": [{"index": choice, **content, "logprobs": logprobs, "finish_reason": None}]}

    def _step_logprobs(self, choice: int, steps: list[Any], text: str) -> dict[str, Any] | None:
        """The ``logprobs`` of a chunk's steps (completions: their offsets counted from the choice's start)."""
        logprobs = _logprobs(self.translated, {"steps": steps})
        if logprobs is not None and "text_offset" in logprobs:
            logprobs["text_offset"] = [offset + self._offsets[choice] for offset in logprobs["text_offset"]]
        self._offsets[choice] += sum(len(step.get("text", "")) for step in steps)
        return logprobs


def stream_chunks(translated: Translated, answers: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The stream of choices already served whole (:mod:`~serving_core.openai_api.answers`' docstring): their
    chunks in order, ``[DONE]`` not included.

    Raises:
        OpenAIError: if a choice failed (before any chunk: the error keeps its HTTP status).
    """
    _checked(translated, answers)
    stream = ChunkStream(translated)
    return [chunk for choice, event in answered_events(answers) for chunk in stream.event(choice, event)]


def streamed_events(translated: Translated, events: Iterable[tuple[int, Mapping[str, Any]]]) -> Iterator[bytes]:
    """The server-sent events of a streamed request from its choices' events ``(choice, event)`` as they come:
    each chunk's ``data:`` line, then ``data: [DONE]`` (none after an error object)."""
    stream = ChunkStream(translated)
    for choice, event in events:
        for chunk in stream.event(choice, event):
            yield sse(chunk)
        if stream.failed:
            return
    yield DONE


def opened(events: Iterator[tuple[int, Mapping[str, Any]]]) -> Iterator[tuple[int, Mapping[str, Any]]]:
    """The events of a stream, its first one read now: an error before any chunk is answered with its HTTP status.

    Raises:
        OpenAIError: the error of a first event that is an error (or a failed answer).
    """
    first = next(events, None)
    if first is None:
        return iter(())
    failure = row_failure(first[1])
    if failure is not None:
        raise failure
    return itertools.chain([first], events)


def answered_events(answers: Iterable[Mapping[str, Any]]) -> Iterator[tuple[int, dict[str, Any]]]:
    """The events of choices answered whole (:func:`serving_core.streaming.answer_events`), choice by choice."""
    for choice, answer in enumerate(answers):
        for event in answer_events(answer):
            yield choice, event
