"""Request and response schema of generation models (task ``generation``: causal LMs), row by row.

JSON request (REST body, or gRPC ``input["body"]``)::

    {"prompt": "the flight was", "max_new_tokens": 12,
     "generation": {"do_sample": true, "temperature": 0.8, "top_k": 50, "top_p": 0.95, "seed": 7},
     "explain": {"method": "attnlrp", "steps": [0, 3], "contrast": "late"}}

or, for a chat model, ``messages`` (``[{"role", "content"}, ...]``, rendered with the chat template) instead of
``prompt``, and ``documents`` (with either); ``explain.granularity``, ``explain.steps: "sentences"`` and
``explain.span``: :mod:`~serving_core.tasks.chat_schema`.

``logprobs: k`` (0 to :data:`MAX_TOP_LOGPROBS`) adds each step's log-probability, its decoded text and bytes, and the
``k`` most probable tokens with theirs (``top_logprobs``; 0: none); ``stop`` (a string or a list of them) ends a
generated row at the step whose text first contains one (``stop_reason: "stop"``, ``stop``: which one; the text ends
before it, the steps keep the tokens that wrote it, as they keep an EOS); ``stream: true`` answers the row as a
stream of events, its tokens as they are written, then its answer (:mod:`serving_core.streaming`). JSON only: the gRPC
``GenerationRequest`` has no fields for them.

``continuation`` (text) or ``continuation_ids`` (token ids) explain a continuation produced elsewhere instead of
generating. ``explain`` absent or ``false``: the generation and each step's probability only; ``true`` or ``{}``: the
default method. ``explain.steps``: a list of step indices (negative from the end), ``"sum"`` (the summed
log-probability of the continuation in one backward) or ``{"sum": [start, stop]}`` (of a span); absent: every step.
``explain.contrast``: a foil token (text of one vocabulary token, or a token id) for every step, or a list with one
per step. ``"sentences"``: each sentence of the answer (the default when documents are given). Other ``explain`` keys
are the method's options. On gRPC, ``input["request"]`` = an ``ExplainRequest``
whose ``generation`` field (proto/explain.proto, ``GenerationRequest``) carries the same.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from explainers import Deadline, Document, Message, StepSum

from .. import wire
from ..config import HandlerConfig
from ..deadlines import decode_deadline_ms, earliest, proto_deadline
from ..errors import RowError
from ..streaming import Listener
from ..wire import Encoding, rounded, rounded_list
from .chat_schema import (
    AnswerSpan,
    ContextUnit,
    PromptPart,
    check_size,
    decode_documents,
    decode_granularity,
    decode_messages,
    decode_span,
    messages_from_proto,
)
from .in_memory import InMemory

if TYPE_CHECKING:
    from .generation_context import PromptAttribution

_DOCUMENT_KEYS = frozenset(
    {"prompt", "messages", "documents", "max_new_tokens", "generation", "continuation", "continuation_ids", "explain",
     "logprobs", "stop", "deadline_ms", "stream"}
)  # fmt: skip
_EXPLAIN_RESERVED = frozenset({"method", "steps", "contrast", "granularity", "span", "deadline_ms"})
_SAMPLING_KEYS = ("do_sample", "temperature", "top_k", "top_p", "seed")
#: ``explain.steps`` asking for each sentence of the answer.
SENTENCES = "sentences"
#: The most alternatives ``logprobs`` may ask for per step (OpenAI's ``top_logprobs`` bound).
MAX_TOP_LOGPROBS = 20
#: The most stop sequences a row may give, and the most characters of each.
MAX_STOPS = 16
MAX_STOP_CHARS = 200


@dataclass(frozen=True)
class GenerationAsk:
    """What a row asks to explain: the method, its options, the steps (step indices, a :class:`StepSum`,
    ``"sentences"``, or ``None``: every step, or the sentences when the row has documents), the foils (text pieces or
    token ids), the units of the answer (``granularity``) and a span of the answer (character offsets) to explain
    instead of steps."""

    method: str
    options: Mapping[str, Any] = field(default_factory=dict)
    steps: tuple[int, ...] | StepSum | str | None = None
    contrast: tuple[str | int, ...] | None = None
    granularity: str = "token"
    span: tuple[int, int] | None = None


@dataclass(frozen=True)
class GenerationRow:
    """A decoded generation request: a ``prompt`` or chat ``messages``, and optional ``documents``."""

    encoding: Encoding
    prompt: str | None
    max_new_tokens: int
    sampling: Mapping[str, Any] = field(default_factory=dict)
    continuation: str | None = None
    continuation_ids: tuple[int, ...] | None = None
    ask: GenerationAsk | None = None
    messages: tuple[Message, ...] | None = None
    documents: tuple[Document, ...] = ()
    logprobs: int | None = None
    stop: tuple[str, ...] = ()
    deadline: Deadline | None = None
    stream: bool = False
    listener: Listener | None = field(default=None, compare=False, repr=False)

    @property
    def given(self) -> bool:
        """Whether the row explains a given continuation (no generation)."""
        return self.continuation is not None or self.continuation_ids is not None


@dataclass(frozen=True)
class TopToken:
    """One of the most probable tokens at a step (``logprobs``)."""

    token: str
    token_id: int
    text: str
    logprob: float
    bytes: list[int]

    def to_dict(self) -> dict[str, Any]:
        """The JSON object."""
        return {
            "token": self.token,
            "token_id": self.token_id,
            "text": self.text,
            "bytes": self.bytes,
            "logprob": rounded(self.logprob),
        }


@dataclass
class GenerationStepOutcome:
    """One generated token of a row's answer (``logprob``, ``text`` and ``top``: when the row asked for
    ``logprobs``)."""

    token: str
    token_id: int
    probability: float
    explained: bool = False
    scores: list[float] | None = None
    foil: str | None = None
    foil_id: int | None = None
    value: float | None = None
    logprob: float | None = None
    text: str | None = None
    bytes: list[int] | None = None
    top: list[TopToken] | None = None


@dataclass
class GenerationOutcome:
    """What the service computed for one generation row (or its error), ready to encode."""

    encoding: Encoding
    error: RowError | None = None
    text: str = ""
    stop_reason: str = ""
    stop: str | None = None
    prompt_tokens: list[str] = field(default_factory=list)
    prompt_special: list[bool] = field(default_factory=list)
    steps: list[GenerationStepOutcome] = field(default_factory=list)
    method: str | None = None
    options: Mapping[str, int | float] = field(default_factory=dict)
    summed: tuple[int, int] | None = None
    sum_scores: list[float] | None = None
    sum_value: float | None = None
    attribution_seconds: float = 0.0
    rendered_prompt: str | None = None
    messages: list[PromptPart] | None = None
    documents: list[PromptPart] | None = None
    documents_placement: str | None = None
    granularity: str = "token"
    context: list[ContextUnit] | None = None
    sentences: list[AnswerSpan] | None = None
    span: AnswerSpan | None = None
    explanation_error: RowError | None = None
    #: A row answered in sentences: its explanations over its tokens, that the sentences' scores were summed from (in
    #: memory only, for the monitor's words; never answered).
    token_scores: InMemory[PromptAttribution] | None = field(default=None, compare=False)


def decode_generation_row(row: Mapping[str, Any], explain_header: bool, config: HandlerConfig) -> GenerationRow:
    """Decode one TorchServe row of a generation model (:func:`serving_core.wire.read_row`: a body that is not JSON
    is the prompt itself; then :func:`decode_generation_body`).

    Raises:
        RowError: with the error table's code for what is wrong.
    """
    return decode_generation_body(wire.read_row(row), explain_header, config)


def decode_generation_body(body: wire.Body, explain_header: bool, config: HandlerConfig) -> GenerationRow:
    """Decode one generation row's request, its envelope removed (:class:`serving_core.wire.Body`).

    Raises:
        RowError: with the error table's code for what is wrong.
    """
    if body.message is not None:
        return _decode_protobuf(body.message, config)
    if body.text is not None:
        return _decode_document({"prompt": body.text}, explain_header, config)
    if body.document is None:
        raise RowError("invalid_request", "empty request: send a JSON body {'prompt': ...}")
    return _decode_document(body.document, explain_header, config)


def _decode_document(document: Mapping[str, Any], explain_header: bool, config: HandlerConfig) -> GenerationRow:
    unknown = sorted(set(document) - _DOCUMENT_KEYS)
    if unknown:
        if "text" in unknown or "image" in unknown:
            raise RowError("unsupported_input", "this is a generation model: send {'prompt': ...}, not 'text'/'image'")
        raise RowError("invalid_request", f"unknown field(s) {unknown}; allowed: {sorted(_DOCUMENT_KEYS)}")
    prompt = document.get("prompt")
    messages = None if document.get("messages") is None else decode_messages(document["messages"], config)
    if prompt is None and messages is None:
        raise RowError("missing_prompt", "missing 'prompt': send {'prompt': 'your text'} or {'messages': [...]}")
    if prompt is not None and messages is not None:
        raise RowError("invalid_request", "send 'prompt' or 'messages', not both")
    if prompt is not None and not isinstance(prompt, str):
        raise RowError("invalid_request", f"'prompt' must be a string, got {type(prompt).__name__}")
    documents = decode_documents(document.get("documents"), config)
    sampling = document.get("generation") or {}
    if not isinstance(sampling, Mapping):
        raise RowError("invalid_request", "'generation' must be an object like {'do_sample': true, 'seed': 1}")
    bad = sorted(set(sampling) - set(_SAMPLING_KEYS))
    if bad:
        raise RowError("invalid_option", f"unknown generation setting(s) {bad}; valid: {', '.join(_SAMPLING_KEYS)}")
    continuation = document.get("continuation")
    if continuation is not None and not isinstance(continuation, str):
        raise RowError("invalid_request", "'continuation' must be a string (or send 'continuation_ids')")
    ids = document.get("continuation_ids")
    if ids is not None and (
        not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids)
    ):
        raise RowError("invalid_request", "'continuation_ids' must be a list of token ids")
    stop = decode_stop(document.get("stop"))
    if stop and (continuation is not None or ids is not None):
        raise RowError("invalid_request", "'stop' ends a generation: a given continuation is explained as it is")
    stream = document.get("stream", False)
    if not isinstance(stream, bool):
        raise RowError("invalid_request", f"'stream' must be true or false, got {stream!r}")
    explain = document.get("explain")
    deadline = earliest(
        decode_deadline_ms(document.get("deadline_ms")),
        decode_deadline_ms(explain.get("deadline_ms"), "explain.deadline_ms") if isinstance(explain, Mapping) else None,
    )
    row = _row(
        Encoding.JSON,
        prompt,
        document.get("max_new_tokens"),
        dict(sampling),
        continuation,
        None if ids is None else tuple(ids),
        _ask(document.get("explain"), explain_header, config),
        config,
        messages,
        documents,
        logprobs=decode_logprobs(document.get("logprobs")),
        stop=stop,
    )
    if stream:
        row = dataclasses.replace(row, stream=True)
    return row if deadline is None else dataclasses.replace(row, deadline=deadline)


def decode_logprobs(value: Any) -> int | None:
    """``logprobs``: how many alternatives per step (``None``/absent: no log-probabilities).

    Raises:
        RowError: ``invalid_request`` for anything but an integer in ``[0, MAX_TOP_LOGPROBS]``.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TOP_LOGPROBS:
        raise RowError(
            "invalid_request",
            f"'logprobs' must be an integer from 0 to {MAX_TOP_LOGPROBS} (the most probable tokens listed per step), "
            f"got {value!r}",
        )
    return value


def decode_stop(value: Any) -> tuple[str, ...]:
    """``stop``: a string or a list of strings that end the generation.

    Raises:
        RowError: ``invalid_request`` for another type, an empty string, too many or too long strings.
    """
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(item, str) and item for item in items):
        raise RowError("invalid_request", "'stop' must be a non-empty string or a list of them")
    if len(items) > MAX_STOPS or any(len(item) > MAX_STOP_CHARS for item in items):
        raise RowError(
            "invalid_request", f"'stop' takes at most {MAX_STOPS} strings of at most {MAX_STOP_CHARS} characters"
        )
    return tuple(dict.fromkeys(items))


def _ask(explain: Any, explain_header: bool, config: HandlerConfig) -> GenerationAsk | None:
    if explain is None:
        return GenerationAsk(config.default_method) if explain_header else None
    if explain is False:
        return None
    if explain is True:
        return GenerationAsk(config.default_method)
    if not isinstance(explain, Mapping):
        raise RowError("invalid_request", "'explain' must be an object like {'method': 'attnlrp'}, true or false")
    method = explain.get("method", config.default_method)
    if not isinstance(method, str):
        raise RowError("invalid_request", f"'explain.method' must be a string, got {type(method).__name__}")
    options = {key: value for key, value in explain.items() if key not in _EXPLAIN_RESERVED}
    return _checked_ask(
        GenerationAsk(
            method,
            options,
            _steps(explain.get("steps")),
            _contrast(explain.get("contrast")),
            decode_granularity(explain.get("granularity")),
            decode_span(explain.get("span")),
        )
    )


def _checked_ask(ask: GenerationAsk) -> GenerationAsk:
    """Refuse a span with steps, and a foil with sentences or a span (they explain log-probabilities of spans).

    Raises:
        RowError: ``invalid_target``.
    """
    if ask.span is not None and ask.steps is not None:
        raise RowError("invalid_target", "'explain.span' explains a span of the answer instead of steps: send one")
    if ask.contrast is not None and (ask.span is not None or ask.steps == SENTENCES):
        raise RowError(
            "invalid_target", "'explain.contrast' applies to steps, not to sentences or a span of the answer"
        )
    return ask


def _steps(value: Any) -> tuple[int, ...] | StepSum | str | None:
    if value is None:
        return None
    if value == "sum":
        return StepSum()
    if value == SENTENCES:
        return SENTENCES
    if isinstance(value, Mapping) and set(value) == {"sum"}:
        span = value["sum"]
        if (
            isinstance(span, list)
            and len(span) == 2
            and isinstance(span[0], int)
            and (span[1] is None or isinstance(span[1], int))
        ):
            return StepSum(span[0], span[1])
    if isinstance(value, list) and value and all(isinstance(s, int) and not isinstance(s, bool) for s in value):
        return tuple(value)
    raise RowError(
        "invalid_target",
        "'explain.steps' must be a non-empty list of step indices, 'sum', {'sum': [start, stop]} or 'sentences', "
        f"got {value!r}",
    )


def _contrast(value: Any) -> tuple[str | int, ...] | None:
    if value is None:
        return None
    items = value if isinstance(value, list) else [value]
    if not items or not all(isinstance(item, str | int) and not isinstance(item, bool) for item in items):
        raise RowError("invalid_target", "'explain.contrast' must be a foil token (text or id) or a list of them")
    return tuple(items)


def _row(
    encoding: Encoding,
    prompt: str | None,
    max_new_tokens: Any,
    sampling: dict[str, Any],
    continuation: str | None,
    continuation_ids: tuple[int, ...] | None,
    ask: GenerationAsk | None,
    config: HandlerConfig,
    messages: tuple[Message, ...] | None = None,
    documents: tuple[Document, ...] = (),
    logprobs: int | None = None,
    stop: tuple[str, ...] = (),
) -> GenerationRow:
    if prompt is not None and not prompt.strip():
        raise RowError("missing_prompt", "'prompt' is empty: send a non-blank prompt")
    if prompt is not None and len(prompt) > config.max_text_chars:
        raise RowError("text_too_long", f"prompt has {len(prompt)} characters, the limit is {config.max_text_chars}")
    check_size(prompt, messages or (), documents, config.max_text_chars)
    if continuation is not None and continuation_ids is not None:
        raise RowError("invalid_request", "send 'continuation' (text) or 'continuation_ids', not both")
    given = continuation is not None or continuation_ids is not None
    if given and (max_new_tokens or sampling):
        raise RowError("invalid_request", "a given continuation is explained as it is: drop max_new_tokens/generation")
    if given and not (continuation_ids or (continuation or "").strip()):
        raise RowError("invalid_request", "the continuation is empty")
    if max_new_tokens is None or max_new_tokens == 0:
        budget = config.default_new_tokens
    elif isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise RowError("invalid_request", f"'max_new_tokens' must be a positive integer, got {max_new_tokens!r}")
    else:
        budget = max_new_tokens
    limit = config.max_new_tokens
    if budget > limit or (continuation_ids is not None and len(continuation_ids) > limit):
        asked = budget if continuation_ids is None else len(continuation_ids)
        raise RowError(
            "too_many_tokens", f"{asked} new tokens asked; this model writes at most {limit} (max_new_tokens)"
        )
    return GenerationRow(
        encoding, prompt, budget, sampling, continuation, continuation_ids, ask, messages, documents, logprobs, stop
    )


def _decode_protobuf(message: Any, config: HandlerConfig) -> GenerationRow:
    if message.WhichOneof("input") is not None:
        raise RowError("unsupported_input", "this is a generation model: set ExplainRequest.generation, not text/image")
    if not message.HasField("generation"):
        raise RowError("missing_prompt", "ExplainRequest.generation is not set")
    request = message.generation
    sampling: dict[str, Any] = {}
    if request.HasField("sampling"):
        proto = request.sampling
        sampling["do_sample"] = bool(proto.do_sample)
        for name in ("temperature", "top_k", "top_p", "seed"):
            if proto.HasField(name):
                sampling[name] = getattr(proto, name)
    ask = None
    if request.HasField("explain"):
        proto_ask = request.explain
        steps: tuple[int, ...] | StepSum | str | None = None
        if proto_ask.sentences:
            steps = SENTENCES
        elif proto_ask.sum:
            steps = StepSum(
                int(proto_ask.sum_start), int(proto_ask.sum_stop) if proto_ask.HasField("sum_stop") else None
            )
        elif proto_ask.steps:
            steps = tuple(int(step) for step in proto_ask.steps)
        if proto_ask.contrast and proto_ask.contrast_ids:
            raise RowError("invalid_target", "set GenerationExplain.contrast or contrast_ids, not both")
        foils: tuple[str | int, ...] | None = None
        if proto_ask.contrast:
            foils = tuple(str(foil) for foil in proto_ask.contrast)
        elif proto_ask.contrast_ids:
            foils = tuple(int(foil) for foil in proto_ask.contrast_ids)
        span = (int(proto_ask.span.start), int(proto_ask.span.end)) if proto_ask.HasField("span") else None
        ask = _checked_ask(
            GenerationAsk(
                proto_ask.method or config.default_method,
                wire.proto_options(proto_ask),
                steps,
                foils,
                decode_granularity(proto_ask.granularity),
                span,
            )
        )
    continuation = request.continuation or None
    ids = tuple(int(token) for token in request.continuation_ids) or None
    raw_messages, raw_documents = messages_from_proto(request)
    messages = decode_messages(raw_messages, config) if raw_messages else None
    if messages is not None and request.prompt:
        raise RowError("invalid_request", "set GenerationRequest.prompt or messages, not both")
    prompt = None if messages is not None else request.prompt
    documents = decode_documents(raw_documents, config)
    row = _row(
        Encoding.PROTOBUF,
        prompt,
        int(request.max_new_tokens),
        sampling,
        continuation,
        ids,
        ask,
        config,
        messages,
        documents,
    )
    deadline = proto_deadline(message.deadline_ms)
    return row if deadline is None else dataclasses.replace(row, deadline=deadline)


def generation_to_dict(outcome: GenerationOutcome) -> dict[str, Any]:
    """The JSON document of one generation row's response (docs/SERVING.md, "Generation models")."""
    if outcome.error is not None:
        return wire.error_document(outcome.error)
    document: dict[str, Any] = {
        "task": "generation",
        "text": outcome.text,
        "stop_reason": outcome.stop_reason,
        "prompt_tokens": outcome.prompt_tokens,
        "prompt_special_tokens": outcome.prompt_special,
    }
    steps = [step_to_dict(step) for step in outcome.steps]
    if outcome.stop is not None:
        document["stop"] = outcome.stop
    document["steps"] = steps
    if outcome.rendered_prompt is not None:
        document["rendered_prompt"] = outcome.rendered_prompt
    if outcome.messages is not None:
        document["messages"] = [part.to_dict() for part in outcome.messages]
    if outcome.documents is not None:
        document["documents"] = [part.to_dict() for part in outcome.documents]
        document["documents_placement"] = outcome.documents_placement
    if outcome.method is not None and outcome.explanation_error is not None:
        document["explanation"] = {"method": outcome.method, "error": outcome.explanation_error.to_dict()}
    elif outcome.method is not None:
        explanation: dict[str, Any] = {"method": outcome.method, "options": dict(outcome.options)}
        explanation["granularity"] = outcome.granularity
        explanation["context"] = [unit.to_dict() for unit in outcome.context or []]
        if outcome.sentences is not None:
            explanation["sentences"] = [sentence.to_dict() for sentence in outcome.sentences]
        elif outcome.span is not None:
            explanation["span"] = outcome.span.to_dict()
        elif outcome.summed is not None:
            explanation["sum"] = {
                "start": outcome.summed[0],
                "stop": outcome.summed[1],
                "scores": rounded_list(outcome.sum_scores or []),
                "value": rounded(outcome.sum_value or 0.0),
            }
        else:
            explanation["steps"] = [index for index, step in enumerate(outcome.steps) if step.explained]
        explanation["seconds"] = round(outcome.attribution_seconds, 6)
        document["explanation"] = explanation
    return document


def step_to_dict(step: GenerationStepOutcome) -> dict[str, Any]:
    """One step of an answer's ``steps`` (and of a stream's token events): its token, id and probability, its
    scores when explained, its foil, its log-probabilities when asked."""
    entry: dict[str, Any] = {
        "token": step.token,
        "token_id": step.token_id,
        "probability": rounded(step.probability),
    }
    if step.explained:
        entry["scores"] = rounded_list(step.scores or [])
        entry["value"] = rounded(step.value or 0.0)
    if step.foil_id is not None:
        entry["foil"] = step.foil
        entry["foil_id"] = step.foil_id
    if step.logprob is not None:
        entry["logprob"] = rounded(step.logprob)
        entry["text"] = step.text
        entry["bytes"] = step.bytes
        entry["top_logprobs"] = [top.to_dict() for top in step.top or []]
    return entry


def encode_generation(outcome: GenerationOutcome) -> bytes:
    """Encode one generation row's response in the encoding its request came in (:func:`serving_core.wire.encode`)."""
    return wire.encode(outcome, generation_to_dict, fill_generation_response)


def fill_generation_response(outcome: GenerationOutcome, response: Any) -> None:
    """Fill an ``ExplainResponse`` with a served generation row's answer (its ``generation`` field)."""
    result = response.generation
    result.text = outcome.text
    result.stop_reason = outcome.stop_reason
    result.prompt_tokens.extend(outcome.prompt_tokens)
    result.prompt_special_tokens.extend(outcome.prompt_special)
    if outcome.rendered_prompt is not None:
        result.rendered_prompt = outcome.rendered_prompt
    for part in outcome.messages or []:
        part.fill(result.messages.add())
    for part in outcome.documents or []:
        part.fill(result.documents.add())
    result.documents_placement = outcome.documents_placement or ""
    for step in outcome.steps:
        proto = result.steps.add()
        proto.token = step.token
        proto.token_id = step.token_id
        proto.probability = step.probability
        proto.explained = step.explained
        if step.scores is not None:
            proto.scores.extend(step.scores)
        if step.value is not None:
            proto.value = step.value
        if step.foil_id is not None:
            proto.foil = step.foil or ""
            proto.foil_id = step.foil_id
    if outcome.explanation_error is not None:
        result.method = outcome.method or ""
        error = outcome.explanation_error
        result.explanation_error.code = error.code
        result.explanation_error.http_status = error.http_status
        result.explanation_error.grpc_code = error.kind.grpc_code
        result.explanation_error.message = error.message
    elif outcome.method is not None:
        result.method = outcome.method
        wire.fill_proto_options(result, outcome.options)
        result.seconds = outcome.attribution_seconds
        result.granularity = outcome.granularity
        for unit in outcome.context or []:
            unit.fill(result.context.add())
        for sentence in outcome.sentences or []:
            sentence.fill(result.sentences.add())
        result.explained_sentences = outcome.sentences is not None
        if outcome.span is not None:
            outcome.span.fill(result.span)
        if outcome.summed is not None:
            result.summed = True
            result.sum_start, result.sum_stop = outcome.summed
            result.sum_scores.extend(outcome.sum_scores or [])
            result.sum_value = outcome.sum_value or 0.0
