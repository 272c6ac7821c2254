"""The generation answers of a :class:`~serving_core.openai_api.requests.Translated` request as OpenAI answers them:
``chat.completion`` / ``text_completion`` objects, their stream chunks (``chat.completion.chunk`` /
``text_completion``) as server-sent events, and the ``GET /v1/models`` list.

Each choice is one generation answer (the REST door's JSON, docs/SERVING.md "Generation models"): its ``text`` is the
message's ``content`` (or the completion's ``text``), its ``stop_reason`` the ``finish_reason`` (``eos`` and ``stop``:
``stop``; ``length``: ``length``), its steps the ``usage.completion_tokens`` and, when asked, the ``logprobs``; with
``explain``, the choice carries ``explanation``: the REST answer's ``explanation`` (``method``, ``options``,
``granularity``, ``context``, and ``sentences`` with their ``documents``, or ``span``, or ``sum``) with ``steps`` as
a list of the explained steps, each with its ``scores``, and where the messages and documents landed in the rendered
prompt (``rendered_prompt``, ``messages``, ``documents``, ``documents_placement``) when the request had them.

A stream of choices already served (:func:`~serving_core.openai_api.streams.stream_chunks`) is per choice the role,
then the whole content (with its ``logprobs``), then ``finish_reason`` with the ``explanation``; with
``stream_options.include_usage`` a last chunk with ``usage`` and no choices; then ``data: [DONE]``. The doors stream
the tokens as they are written instead (:mod:`~serving_core.openai_api.streams`: the same chunks, one per token
event).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .. import tracing
from .errors import OpenAIError, row_failure
from .requests import Translated

#: ``finish_reason`` of each generation ``stop_reason``.
_FINISH = {"eos": "stop", "stop": "stop", "length": "length", "given": "stop"}
#: Where the answer says the messages and documents went: copied into each choice's explanation.
_PLACEMENT = ("rendered_prompt", "messages", "documents", "documents_placement")
#: ``owned_by`` of the listed models.
OWNER = "transformer-explain-service"


def _checked(translated: Translated, answers: Sequence[Mapping[str, Any]]) -> None:
    """Raise the first failed choice's error (OpenAI answers a request whole or not at all).

    Raises:
        OpenAIError: the error table's code and status of the first failed answer.
    """
    if len(answers) != len(translated.documents):
        raise OpenAIError("internal", f"{len(answers)} answers for {len(translated.documents)} choices")
    for answer in answers:
        failure = row_failure(answer)
        if failure is not None:
            raise failure


def completion_answer(translated: Translated, answers: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The ``chat.completion`` (or ``text_completion``) object of the served choices.

    Args:
        translated: the request.
        answers: one generation answer (JSON document) per document of ``translated``, in order.

    Raises:
        OpenAIError: if a choice failed.
    """
    _checked(translated, answers)
    chat = translated.kind == "chat"
    choices = []
    for index, answer in enumerate(answers):
        choice: dict[str, Any] = {"index": index}
        if chat:
            choice["message"] = {"role": "assistant", "content": answer["text"]}
        else:
            choice["text"] = answer["text"]
        choice["logprobs"] = _logprobs(translated, answer)
        choice["finish_reason"] = _finish(answer)
        explanation = _explanation(answer)
        if explanation is not None:
            choice["explanation"] = explanation
        choices.append(choice)
    return {**_header(translated, "chat.completion" if chat else "text_completion"), "choices": choices,
            "usage": usage(translated, answers)}  # fmt: skip


def events(chunks: Iterable[Mapping[str, Any]]) -> bytes:
    """Server-sent events: ``data: <chunk>`` for each chunk, then ``data: [DONE]``."""
    lines = [f"data: {json.dumps(chunk, separators=(',', ':'))}\n\n" for chunk in chunks]
    return ("".join(lines) + "data: [DONE]\n\n").encode("utf-8")


def model_list(names: Iterable[str], created: int) -> dict[str, Any]:
    """The ``GET /v1/models`` answer for the served generation models ``names``."""
    data = [{"id": name, "object": "model", "created": created, "owned_by": OWNER} for name in names]
    return {"object": "list", "data": data}


def _header(translated: Translated, kind: str) -> dict[str, Any]:
    return {"id": translated.id, "object": kind, "created": translated.created, "model": translated.model}


def _finish(answer: Mapping[str, Any]) -> str:
    return _FINISH.get(str(answer.get("stop_reason")), "stop")


def trace_usage(translated: Translated, answers: Sequence[Mapping[str, Any]]) -> None:
    """The GenAI attributes (:func:`serving_core.tracing.generation_attributes`) on the current span, the
    request's: call it once the answer is built from ``answers`` (which checks them)."""
    if tracing.active():
        counts = usage(translated, answers)
        attributes = tracing.generation_attributes(
            translated.kind, translated.model, counts["prompt_tokens"], counts["completion_tokens"]
        )
        tracing.set_attributes(attributes)


def usage(translated: Translated, answers: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """Prompt tokens (each prompt once, whatever ``n``), completion tokens (every choice's steps), their total."""
    prompt = sum(len(answers[first]["prompt_tokens"]) for first in range(0, len(answers), translated.n))
    completion = sum(len(answer["steps"]) for answer in answers)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _logprobs(translated: Translated, answer: Mapping[str, Any]) -> dict[str, Any] | None:
    """A choice's ``logprobs``: chat's ``{"content": [...]}``, completions' ``tokens``/``token_logprobs``/
    ``top_logprobs``/``text_offset`` (offsets into the completion's text); ``None`` when not asked."""
    if translated.logprobs is None:
        return None
    steps = answer["steps"]
    if translated.kind == "chat":
        content = [{**_token(step), "top_logprobs": [_token(top) for top in step["top_logprobs"]]} for step in steps]
        return {"content": content, "refusal": None}
    offsets, offset = [], 0
    for step in steps:
        offsets.append(offset)
        offset += len(step["text"])
    top_logprobs = []
    for step in steps:
        alternatives: dict[str, float] = {}
        for top in step["top_logprobs"]:
            alternatives.setdefault(top["text"], top["logprob"])
        top_logprobs.append(alternatives)
    return {
        "tokens": [step["text"] for step in steps],
        "token_logprobs": [step["logprob"] for step in steps],
        "top_logprobs": top_logprobs,
        "text_offset": offsets,
    }


def _token(entry: Mapping[str, Any]) -> dict[str, Any]:
    return {"token": entry["text"], "logprob": entry["logprob"], "bytes": entry["bytes"]}


def _explanation(answer: Mapping[str, Any]) -> dict[str, Any] | None:
    """A choice's ``explanation`` (module docstring), or ``None`` when the request asked for none."""
    source = answer.get("explanation")
    if not isinstance(source, Mapping):
        return None
    explanation = dict(source)
    if isinstance(explanation.get("steps"), list):
        steps = answer["steps"]
        explanation["steps"] = [{"step": index, **steps[index]} for index in source["steps"]]
    for key in _PLACEMENT:
        if key in answer:
            explanation[key] = answer[key]
    return explanation
