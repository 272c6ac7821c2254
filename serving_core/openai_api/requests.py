"""An OpenAI request (``/v1/chat/completions`` or ``/v1/completions``) as the generation task's JSON documents, one per
choice: what the doors send to the model, unchanged from what the REST door takes (docs/SERVING.md, "Generation
models" and "Chat, words and citations").

What maps onto what:

- ``messages`` (chat; a ``content`` may be a list of ``{"type": "text", "text"}`` parts; the ``developer`` role is
  ``system``) or ``prompt`` (completions: a string, or a list of strings, each its own choices) → ``messages`` /
  ``prompt``;
- ``max_completion_tokens`` (or ``max_tokens``) → ``max_new_tokens`` (absent: the model's ``default_new_tokens``);
- ``temperature`` (> 0 samples; 0, or absent without ``top_p``/``top_k``: greedy, the REST door's default),
  ``top_p``, ``top_k`` (vLLM's extension), ``seed`` → ``generation``; choice ``j`` of ``n`` samples with ``seed + j``;
- ``stop`` → ``stop``; ``logprobs``/``top_logprobs`` (chat) or ``logprobs: k`` (completions) → ``logprobs``;
- the extensions ``explain``, ``documents`` and ``deadline_ms`` (the Unix time in milliseconds by which the answer is
  due; also the ``Explain-Deadline-Ms`` header, :func:`with_deadline_header`: the earlier wins) → the same fields.

Parameters that would change the answer in a way this service cannot honour (tools, functions, a JSON
``response_format``, ``logit_bias``, penalties, audio, ``echo``, ``suffix``, ``best_of`` above ``n``, token-id prompts)
are refused with ``invalid_request`` naming the parameter; the others (``user``, ``metadata``, ``store``, ...) and
unknown fields are ignored, as vLLM's OpenAI server does.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..headers import DEADLINE_HEADER, deadline_ms, header
from .errors import OpenAIError

#: The most choices one request may ask for (``n`` times the number of prompts).
MAX_CHOICES = 16
#: OpenAI's bound on ``top_logprobs`` (and on the service's ``logprobs``).
MAX_TOP_LOGPROBS = 20
#: Parameters refused unless they have their neutral value, and that value.
_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "tools": (None, []),
    "functions": (None, []),
    "function_call": (None, "none"),
    "tool_choice": (None, "none"),
    "logit_bias": (None, {}),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "repetition_penalty": (None, 1, 1.0),
    "audio": (None,),
    "prediction": (None,),
    "web_search_options": (None,),
    "echo": (None, False),
    "suffix": (None, ""),
    "modalities": (None, ["text"]),
}
_WHY = {
    "tools": "tool calls are not supported",
    "functions": "function calls are not supported",
    "function_call": "function calls are not supported",
    "tool_choice": "tool calls are not supported",
    "logit_bias": "the answer is explained as the model wrote it: logit_bias is not supported",
    "presence_penalty": "penalties are not supported",
    "frequency_penalty": "penalties are not supported",
    "repetition_penalty": "penalties are not supported",
    "audio": "only text is supported",
    "prediction": "predicted outputs are not supported",
    "web_search_options": "web search is not supported",
    "echo": "echo is not supported: the answer holds the completion only",
    "suffix": "suffix (insertion) is not supported",
    "modalities": "only text is supported",
}


@dataclass(frozen=True)
class Translated:
    """An OpenAI request translated: the generation documents to serve and what the answer needs.

    Attributes:
        kind: ``chat`` or ``completion``.
        model: the model asked for.
        documents: one generation JSON document per choice, prompt by prompt (``prompts × n``).
        n: choices per prompt.
        stream: answer as server-sent events.
        include_usage: ``stream_options.include_usage``: a last chunk with ``usage``.
        logprobs: ``None``: no ``logprobs`` in the answer; else the alternatives per step.
        id: the answer's ``id``.
        created: the answer's ``created`` (seconds since the epoch).
    """

    kind: str
    model: str
    documents: tuple[Mapping[str, Any], ...]
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    logprobs: int | None = None
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def prompts(self) -> int:
        """How many prompts (completions may send several; a chat is one)."""
        return len(self.documents) // self.n

    def distinct(self) -> tuple[list[Mapping[str, Any]], list[int]]:
        """The documents to serve, each once (the greedy choices of one prompt are one document; sampled choices, even
        unseeded, are never merged), and for each choice the index of its document among them."""
        keys = [
            json.dumps(document, sort_keys=True) if "generation" not in document else f"sampled {index}"
            for index, document in enumerate(self.documents)
        ]
        first = {key: index for index, key in reversed(list(enumerate(keys)))}
        order = sorted(set(first.values()))
        position = {index: rank for rank, index in enumerate(order)}
        return [self.documents[index] for index in order], [position[first[key]] for key in keys]


def chat_request(body: Any) -> Translated:
    """``POST /v1/chat/completions`` → one generation document per choice.

    Raises:
        OpenAIError: ``invalid_json``/``invalid_request`` for a body that is not an object, a missing or malformed
            field, or a refused parameter (``param`` names it).
    """
    request = _object(body)
    _refuse_unsupported(request)
    messages = request.get("messages")
    if not isinstance(messages, list) or not messages:
        raise OpenAIError("invalid_request", "'messages' must be a non-empty list of {role, content}", "messages")
    base: dict[str, Any] = {"messages": [_message(message, index) for index, message in enumerate(messages)]}
    logprobs = _chat_logprobs(request)
    return _translated("chat", request, [base], logprobs)


def completion_request(body: Any) -> Translated:
    """``POST /v1/completions`` → one generation document per prompt and choice.

    Raises:
        OpenAIError: as :func:`chat_request`; token-id prompts are refused.
    """
    request = _object(body)
    _refuse_unsupported(request)
    prompt = request.get("prompt")
    prompts = [prompt] if isinstance(prompt, str) else prompt
    if not isinstance(prompts, list) or not prompts or not all(isinstance(item, str) for item in prompts):
        raise OpenAIError(
            "invalid_request",
            "'prompt' must be a string or a non-empty list of strings (token-id prompts are not supported: send text)",
            "prompt",
        )
    logprobs = request.get("logprobs")
    if logprobs is not None and (
        isinstance(logprobs, bool) or not isinstance(logprobs, int) or not 0 <= logprobs <= MAX_TOP_LOGPROBS
    ):
        raise OpenAIError("invalid_request", f"'logprobs' must be an integer from 0 to {MAX_TOP_LOGPROBS}", "logprobs")
    best_of = request.get("best_of")
    if best_of is not None and best_of != _choices(request):
        raise OpenAIError("invalid_request", "'best_of' is not supported (other than equal to n)", "best_of")
    return _translated("completion", request, [{"prompt": text} for text in prompts], logprobs)


def _object(body: Any) -> Mapping[str, Any]:
    if not isinstance(body, Mapping):
        raise OpenAIError("invalid_request", "the body must be a JSON object")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise OpenAIError("invalid_request", "'model' must name a served model (GET /v1/models lists them)", "model")
    return body


def _refuse_unsupported(request: Mapping[str, Any]) -> None:
    for name, neutral in _NEUTRAL.items():
        if name in request and not any(request[name] == value for value in neutral):
            raise OpenAIError("invalid_request", f"'{name}': {_WHY[name]} by this server", name)
    response_format = request.get("response_format")
    if response_format is not None and response_format != {"type": "text"}:
        raise OpenAIError(
            "invalid_request", "'response_format': only {'type': 'text'} is supported by this server", "response_format"
        )


def _message(message: Any, index: int) -> dict[str, Any]:
    """One chat message as the generation task takes it (``{"role", "content"}``)."""
    param = f"messages[{index}]"
    if not isinstance(message, Mapping):
        raise OpenAIError("invalid_messages", f"{param} must be an object {{role, content}}", "messages")
    role = message.get("role")
    content = message.get("content")
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise OpenAIError(
                    "invalid_messages", f"{param}.content: only text parts {{'type': 'text', 'text'}} are supported"
                )
            texts.append(part["text"])
        content = "".join(texts)
    if message.get("tool_calls"):
        raise OpenAIError("invalid_messages", f"{param}: tool calls are not supported by this server")
    if not isinstance(content, str):
        raise OpenAIError("invalid_messages", f"{param}.content must be a string or a list of text parts")
    return {"role": "system" if role == "developer" else role, "content": content}


def _chat_logprobs(request: Mapping[str, Any]) -> int | None:
    logprobs = request.get("logprobs")
    top = request.get("top_logprobs")
    if logprobs not in (None, True, False):
        raise OpenAIError("invalid_request", "'logprobs' must be true or false", "logprobs")
    if top is not None and (isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= MAX_TOP_LOGPROBS):
        raise OpenAIError(
            "invalid_request", f"'top_logprobs' must be an integer from 0 to {MAX_TOP_LOGPROBS}", "top_logprobs"
        )
    if top and not logprobs:
        raise OpenAIError("invalid_request", "'top_logprobs' needs 'logprobs': true", "top_logprobs")
    return (top or 0) if logprobs else None


def _choices(request: Mapping[str, Any]) -> int:
    n = request.get("n")
    if n is None:
        return 1
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise OpenAIError("invalid_request", f"'n' must be an integer >= 1, got {n!r}", "n")
    return n


def _translated(
    kind: str, request: Mapping[str, Any], bases: Sequence[dict[str, Any]], logprobs: int | None
) -> Translated:
    n = _choices(request)
    if n * len(bases) > MAX_CHOICES:
        raise OpenAIError(
            "invalid_request",
            f"{n * len(bases)} choices asked (n per prompt); this server answers at most {MAX_CHOICES} per request",
            "n",
        )
    shared = _shared_fields(request, logprobs)
    sampling = _sampling(request)
    documents = []
    for base in bases:
        for choice in range(n):
            document = {**base, **shared}
            if sampling is not None:
                settings = dict(sampling)
                if "seed" in settings:
                    settings["seed"] = settings["seed"] + choice
                document["generation"] = settings
            documents.append(document)
    stream = request.get("stream")
    if stream not in (None, True, False):
        raise OpenAIError("invalid_request", "'stream' must be true or false", "stream")
    options = request.get("stream_options")
    if options is not None and not isinstance(options, Mapping):
        raise OpenAIError("invalid_request", "'stream_options' must be an object", "stream_options")
    include_usage = bool(stream) and bool((options or {}).get("include_usage"))
    prefix = "chatcmpl-" if kind == "chat" else "cmpl-"
    return Translated(
        kind, str(request["model"]), tuple(documents), n, bool(stream), include_usage, logprobs,
        id=prefix + uuid.uuid4().hex,
    )  # fmt: skip


def _shared_fields(request: Mapping[str, Any], logprobs: int | None) -> dict[str, Any]:
    """The fields every choice's document has: the token budget, stop sequences, logprobs, the extensions."""
    shared: dict[str, Any] = {}
    budget = request.get("max_completion_tokens")
    param = "max_completion_tokens"
    if budget is None:
        budget, param = request.get("max_tokens"), "max_tokens"
    if budget is not None:
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
            raise OpenAIError("invalid_request", f"'{param}' must be an integer >= 1, got {budget!r}", param)
        shared["max_new_tokens"] = budget
    stop = request.get("stop")
    if stop is not None and stop != []:
        shared["stop"] = stop
    if logprobs is not None:
        shared["logprobs"] = logprobs
    for extension in ("explain", "documents", "deadline_ms"):
        if request.get(extension) is not None:
            shared[extension] = request[extension]
    return shared


def with_deadline_header(body: Any, headers: Mapping[str, str] | None) -> Any:
    """The request ``body`` due by the earlier of its ``deadline_ms`` and the ``Explain-Deadline-Ms`` header of
    ``headers`` (Unix milliseconds; matched whatever its case); the body unchanged without the header.

    Raises:
        OpenAIError: ``invalid_request`` for a header that is not a positive integer.
    """
    try:
        due = deadline_ms(header(headers, DEADLINE_HEADER))
    except ValueError as error:
        raise OpenAIError("invalid_request", str(error)) from None
    if due is None or not isinstance(body, Mapping):
        return body
    own = body.get("deadline_ms")
    if isinstance(own, int) and not isinstance(own, bool) and 0 < own < due:
        return body
    return {**body, "deadline_ms": due}


def _sampling(request: Mapping[str, Any]) -> dict[str, Any] | None:
    """The ``generation`` settings (``None``: greedy)."""
    temperature = _number(request, "temperature", 0.0, 2.0)
    top_p = _number(request, "top_p", 0.0, 1.0)
    top_k = request.get("top_k")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < -1):
        raise OpenAIError("invalid_request", "'top_k' must be an integer >= -1 (-1 or 0: off)", "top_k")
    seed = request.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise OpenAIError("invalid_request", f"'seed' must be an integer >= 0, got {seed!r}", "seed")
    filtered = (top_p is not None and top_p < 1.0) or (top_k is not None and top_k > 0)
    if temperature == 0.0 or (temperature is None and not filtered):
        return None
    if top_p == 0.0:
        raise OpenAIError("invalid_request", "'top_p' must be > 0 when sampling", "top_p")
    settings: dict[str, Any] = {"do_sample": True, "temperature": 1.0 if temperature is None else temperature}
    if top_p is not None:
        settings["top_p"] = top_p
    if top_k is not None and top_k > 0:
        settings["top_k"] = top_k
    if seed is not None:
        settings["seed"] = seed
    return settings


def _number(request: Mapping[str, Any], name: str, low: float, high: float) -> float | None:
    value = request.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise OpenAIError("invalid_request", f"'{name}' must be a number from {low:g} to {high:g}, got {value!r}", name)
    return float(value)
