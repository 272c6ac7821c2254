"""Request and response schema of classifiers (tasks ``text`` and ``image``): decode one row into a typed request,
write one result back (the envelope is :mod:`serving_core.wire`'s).

A row arrives as a dict, as TorchServe hands it over, and :func:`serving_core.wire.read_row` removes the envelope
(the other doors hand a JSON document directly, :func:`decode_body`):

- REST: ``body``/``data`` holds a dict (``Content-Type: application/json``), a ``str`` (``text/*``) or bytes (JSON
  without that content type, or a raw PNG/JPEG body for image models).
- gRPC ``Predictions``: ``input["body"]`` = the same JSON as bytes, or ``input["request"]`` = a serialized
  ``ExplainRequest`` (proto/explain.proto). The reply uses the encoding of the request.

JSON request: ``{"text": "...", "explain": {"method": "relevance", "target": "negative", "start_layer": 0}}``
(sentence-pair models also take ``"text_pair": "..."``);
``explain`` absent (or ``false``) = prediction only, ``true`` or ``{}`` = the default method. Images:
``{"image": "<base64 PNG/JPEG>", "explain": ...}``. On ``/explanations/{model}`` an absent ``explain`` means the
default method. Explain when unsure: ``"explain": {"method": "attnlrp", "below": 0.8}`` explains only when the
prediction's confidence is below 0.8 (``"below": null``: always; absent: the model's ``explain_below``); the answer
then says ``explained`` and, when not, ``skipped`` (why). ``"explain": {"granularity": "word"}`` (or ``sentence``)
answers the text's words (sentences) instead of its tokens, each scored by the sum of its tokens' scores
(:mod:`~serving_core.tasks.text_units`). ``"explain": {"deadline_ms": 1767225600000}`` gives the Unix time in
milliseconds by which the answer is due (:func:`serving_core.deadlines.decode_deadline_ms`): a row past it is answered
``deadline_exceeded`` without work, and its explanation is abandoned between chunks once it passes.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from explainers import Deadline, RowRequest, RowSkipped

from .. import wire
from ..config import HandlerConfig
from ..deadlines import decode_deadline_ms, proto_deadline
from ..errors import RowError
from ..wire import Encoding, rounded, rounded_list
from .chat_schema import decode_granularity
from .in_memory import InMemory
from .text_units import TextUnit

_EXPLAIN_RESERVED = frozenset({"method", "target", "below", "granularity", "deadline_ms"})


@dataclass(frozen=True)
class DecodedRow:
    """A valid row: its input and what it asks for."""

    encoding: Encoding
    request: RowRequest
    text: str | None = None
    image: bytes | None = None
    text_pair: str | None = None
    granularity: str = "token"


@dataclass
class RowOutcome:
    """What the service computed for one row (or its error), ready to encode."""

    encoding: Encoding
    error: RowError | None = None
    head_type: str = "single_label"
    label_id: int = -1
    probabilities: list[float] = field(default_factory=list)
    predicted: list[int] = field(default_factory=list)
    threshold: float | None = None
    value: float | None = None
    truncated: bool = False
    method: str | None = None
    target: int = -1
    options: Mapping[str, int | float] = field(default_factory=dict)
    tokens: list[str] | None = None
    special_tokens: list[bool] | None = None
    segments: list[int] | None = None
    scores: list[float] | None = None
    grid: tuple[int, int] | None = None
    pooled: str = "first"
    attribution_seconds: float = 0.0
    explain_requested: bool = False
    below: float | None = None
    confidence: float | None = None
    skipped: RowSkipped | None = None
    granularity: str = "token"
    context: list[TextUnit] | None = None
    #: A row answered in sentences: the scores over :attr:`tokens` they were summed from (in memory only, for the
    #: monitor's words; never answered).
    token_scores: InMemory[list[float]] | None = field(default=None, compare=False)


def read_row(row: Mapping[str, Any], config: HandlerConfig) -> wire.Body:
    """One TorchServe row's envelope, decoded (:func:`serving_core.wire.read_row`) as a classifier takes it: a text
    model's ``text/*`` body that is not JSON is the text itself; a raw PNG/JPEG body is kept as bytes (an image).

    Raises:
        RowError: for an envelope that cannot be decoded.
    """
    return wire.read_row(row, "text" if config.input_kind == "text" else "never", images=True)


def decode_row(row: Mapping[str, Any], explain_header: bool, config: HandlerConfig) -> DecodedRow:
    """Decode one TorchServe row (:func:`read_row`, then :func:`decode_body`).

    Args:
        row: the row dict TorchServe passes to ``handle``.
        explain_header: whether the REST route was an explanations route (``explain: True`` header).
        config: the model's handler config.

    Raises:
        RowError: with the code of :data:`serving_core.errors.ERROR_TABLE` that says what is wrong.
    """
    return decode_body(read_row(row, config), explain_header, config)


def decode_body(body: wire.Body, explain_header: bool, config: HandlerConfig) -> DecodedRow:
    """Decode one row's request, its envelope removed (:class:`serving_core.wire.Body`).

    Raises:
        RowError: with the code of :data:`serving_core.errors.ERROR_TABLE` that says what is wrong.
    """
    if body.message is not None:
        return _decode_protobuf(body.message, config)
    if body.binary is not None:
        if config.task != "image":
            raise RowError("unsupported_input", "this is a text model: send {'text': ...}, not an image")
        _check_image_size(len(body.binary), config)
        return DecodedRow(Encoding.JSON, _explain_request(None, explain_header, config), image=body.binary)
    if body.text is not None:
        request = _explain_request(None, explain_header, config)
        return DecodedRow(Encoding.JSON, request, text=_check_text(body.text, config))
    if body.document is None:
        expected = "{'text': ...}" if config.input_kind == "text" else "{'image': '<base64>'} or a raw PNG/JPEG body"
        raise RowError("invalid_request", f"empty request: send a JSON body {expected}")
    return _decode_document(body.document, explain_header, config)


def decode_fields(
    config: HandlerConfig,
    *,
    text: str | None = None,
    text_pair: str | None = None,
    image: bytes | None = None,
    method: str | None = None,
    target: Any = None,
    options: Mapping[str, Any] | None = None,
    granularity: str | None = None,
    deadline: Deadline | None = None,
) -> DecodedRow:
    """Decode one row given as separate fields, as the KServe/Ray doors receive it (an OIP tensor element and the
    request's explain parameters): the same checks and errors as a JSON row.

    Args:
        config: the model's handler config.
        text: the text (text models).
        text_pair: the second text of a sentence-pair model, if any.
        image: the encoded PNG/JPEG bytes (image models).
        method: the method (``None``: prediction only; resolve aliases such as ``default`` before).
        target: a label name, a class index or ``None`` (the predicted class).
        options: the method's options.
        granularity: ``token`` (``None``: the default), ``word`` or ``sentence``.
        deadline: when the row's answer is due (``None``: no deadline).

    Raises:
        RowError: with the code of :data:`serving_core.errors.ERROR_TABLE` that says what is wrong.
    """
    units = _granularity(decode_granularity(granularity), config)
    if method is None:
        if target is not None or options:
            raise RowError("invalid_request", "a target or option was given without a method: name the method too")
        request = RowRequest()
    else:
        request = replace(_row_request(method, target, dict(options or {}), config), deadline=deadline)
    if config.input_kind == "text":
        if image is not None:
            raise RowError("unsupported_input", "this is a text model: send 'text', not 'image'")
        if text is None:
            raise RowError("missing_text", "missing 'text': send the text to classify")
        text, text_pair = _check_pair(text, text_pair, config)
        return DecodedRow(Encoding.JSON, request, text=text, text_pair=text_pair, granularity=units)
    if text is not None or text_pair is not None:
        raise RowError("unsupported_input", "this is an image model: send 'image', not 'text'")
    if image is None:
        raise RowError("missing_image", "missing 'image': send the PNG or JPEG file's bytes")
    _check_image_size(len(image), config)
    return DecodedRow(Encoding.JSON, request, image=image)


def _decode_document(document: Mapping[str, Any], explain_header: bool, config: HandlerConfig) -> DecodedRow:
    input_key = config.input_kind
    allowed = {input_key, "explain"} | ({"text_pair"} if input_key == "text" else set())
    unknown = sorted(set(document) - allowed)
    if unknown:
        other = "image" if input_key == "text" else "text"
        if other in unknown or (config.task == "image" and "text_pair" in unknown):
            raise RowError("unsupported_input", f"this is a {config.task} model: send {input_key!r}, not {other!r}")
        raise RowError("invalid_request", f"unknown field(s) {unknown}; allowed: {sorted(allowed)}")
    request = _explain_request(document.get("explain"), explain_header, config)
    explain = document.get("explain")
    granularity = (
        _granularity(decode_granularity(explain.get("granularity")), config)
        if isinstance(explain, Mapping)
        else "token"
    )
    if input_key == "text":
        text = document.get("text")
        if text is None:
            raise RowError("missing_text", "missing 'text': send {'text': 'your sentence'}")
        if not isinstance(text, str):
            raise RowError("invalid_request", f"'text' must be a string, got {type(text).__name__}")
        pair = document.get("text_pair")
        if pair is not None and not isinstance(pair, str):
            raise RowError("invalid_request", f"'text_pair' must be a string, got {type(pair).__name__}")
        text, pair = _check_pair(text, pair, config)
        return DecodedRow(Encoding.JSON, request, text=text, text_pair=pair, granularity=granularity)
    encoded = document.get("image")
    if encoded is None:
        raise RowError("missing_image", "missing 'image': send {'image': '<base64 PNG or JPEG>'}")
    if not isinstance(encoded, str):
        raise RowError("invalid_request", f"'image' must be a base64 string, got {type(encoded).__name__}")
    _check_image_size(len(encoded) * 3 // 4, config)
    try:
        image = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise RowError("invalid_image", "'image' is not valid base64") from None
    _check_image_size(len(image), config)
    return DecodedRow(Encoding.JSON, request, image=image)


def _decode_protobuf(message: Any, config: HandlerConfig) -> DecodedRow:
    kind = message.WhichOneof("input")
    if kind is None:
        missing = "missing_text" if config.input_kind == "text" else "missing_image"
        raise RowError(missing, f"ExplainRequest.{config.input_kind} is not set")
    if kind != config.input_kind:
        raise RowError("unsupported_input", f"this is a {config.task} model: set ExplainRequest.{config.input_kind}")
    request = RowRequest()
    granularity = "token"
    deadline = proto_deadline(message.deadline_ms)
    if message.HasField("explain"):
        explain = message.explain
        granularity = _granularity(decode_granularity(explain.granularity), config)
        target_kind = explain.WhichOneof("target")
        target: Any = None
        if target_kind == "target_label":
            target = explain.target_label
        elif target_kind == "target_id":
            target = int(explain.target_id)
        condition = explain.WhichOneof("condition")
        # float32 on the wire: 0.8 arrives as 0.800000011920929; read with float32's precision
        below = float(f"{explain.below:.7g}") if condition == "below" else _MODEL
        if condition == "always" and explain.always:
            below = None
        options = wire.proto_options(explain)
        request = _row_request(explain.method or config.default_method, target, options, config, below)
    request = replace(request, deadline=deadline)
    if kind == "text":
        text, pair = _check_pair(message.text, message.text_pair or None, config)
        return DecodedRow(Encoding.PROTOBUF, request, text=text, text_pair=pair, granularity=granularity)
    if message.text_pair:
        raise RowError("unsupported_input", "this is an image model: ExplainRequest.text_pair is for text models")
    _check_image_size(len(message.image), config)
    return DecodedRow(Encoding.PROTOBUF, request, image=bytes(message.image))


def _explain_request(explain: Any, explain_header: bool, config: HandlerConfig) -> RowRequest:
    if explain is None:
        if not explain_header:
            return RowRequest()
        return RowRequest(method=config.default_method, below=config.explain_below)
    if explain is False:
        return RowRequest()
    if explain is True:
        return RowRequest(method=config.default_method, below=config.explain_below)
    if not isinstance(explain, Mapping):
        raise RowError("invalid_request", "'explain' must be an object like {'method': 'relevance'}, true or false")
    method = explain.get("method", config.default_method)
    if not isinstance(method, str):
        raise RowError("invalid_request", f"'explain.method' must be a string, got {type(method).__name__}")
    below = explain.get("below", _MODEL)
    if below is not None and below is not _MODEL and (isinstance(below, bool) or not isinstance(below, int | float)):
        raise RowError(
            "invalid_request",
            f"'explain.below' must be a probability in (0, 1] or null (always explain), got {type(below).__name__}",
        )
    options = {key: value for key, value in explain.items() if key not in _EXPLAIN_RESERVED}
    request = _row_request(method, explain.get("target"), options, config, below)
    deadline = decode_deadline_ms(explain.get("deadline_ms"), "explain.deadline_ms")
    return request if deadline is None else replace(request, deadline=deadline)


#: ``below`` not given by the request: the model's ``explain_below`` applies.
_MODEL: Any = object()


def _row_request(
    method: str, target: Any, options: dict[str, Any], config: HandlerConfig, below: Any = _MODEL
) -> RowRequest:
    if isinstance(target, str):
        if target not in config.labels:
            raise RowError("invalid_target", f"unknown label {target!r}; labels: {', '.join(config.labels)}")
        target = config.labels.index(target)
    elif target is not None and (isinstance(target, bool) or not isinstance(target, int)):
        raise RowError("invalid_target", f"'target' must be a label name ({', '.join(config.labels)}) or a class index")
    below = config.explain_below if below is _MODEL else below
    return RowRequest(method=method, target=target, options=options, below=below)


def _granularity(granularity: str, config: HandlerConfig) -> str:
    """``granularity`` for a text model; an image model takes ``token`` (its patches) only.

    Raises:
        RowError: ``invalid_option`` for words or sentences of an image.
    """
    if granularity != "token" and config.input_kind != "text":
        raise RowError(
            "invalid_option", f"'explain.granularity' {granularity!r} is for text models; an image has patches"
        )
    return granularity


def _check_text(text: str, config: HandlerConfig) -> str:
    if not text.strip():
        raise RowError("missing_text", "'text' is empty: send a non-blank text")
    if len(text) > config.max_text_chars:
        raise RowError(
            "text_too_long",
            f"text has {len(text)} characters, the limit is {config.max_text_chars} "
            f"(texts over {config.max_length} tokens are truncated)",
        )
    return text


def _check_pair(text: str, pair: str | None, config: HandlerConfig) -> tuple[str, str | None]:
    """Check a text and its optional pair (each non-blank; together at most ``max_text_chars``)."""
    if pair is None:
        return _check_text(text, config), None
    if not text.strip() or not pair.strip():
        raise RowError("missing_text", "'text' and 'text_pair' must both be non-blank (omit 'text_pair' for one text)")
    _check_text(text + pair, config)
    return text, pair


def _check_image_size(size: int, config: HandlerConfig) -> None:
    if size > config.max_image_bytes:
        raise RowError("image_too_large", f"image of ~{size} bytes exceeds the limit of {config.max_image_bytes} bytes")


def outcome_to_dict(outcome: RowOutcome, labels: tuple[str, ...]) -> dict[str, Any]:
    """The JSON document of one row's response (docs/SERVING.md, "Response")."""
    if outcome.error is not None:
        return wire.error_document(outcome.error)
    document: dict[str, Any] = {"head_type": outcome.head_type}
    if outcome.head_type == "regression":
        document["value"] = rounded(outcome.value) if outcome.value is not None else None
    else:
        document["label"] = labels[outcome.label_id]
        document["label_id"] = outcome.label_id
        document["probabilities"] = dict(zip(labels, rounded_list(outcome.probabilities), strict=True))
    if outcome.head_type == "multi_label":
        document["labels"] = [labels[index] for index in outcome.predicted]
        document["threshold"] = outcome.threshold
    if outcome.tokens is not None:
        document["truncated"] = outcome.truncated
    if outcome.explain_requested:
        document["explained"] = outcome.method is not None
    if outcome.below is not None:
        document["below"] = outcome.below
        document["confidence"] = rounded(outcome.confidence) if outcome.confidence is not None else None
    if outcome.skipped is not None:
        skipped = outcome.skipped
        document["skipped"] = {"reason": skipped.reason, "method": skipped.method, "message": skipped.message}
    if outcome.method is not None:
        explanation: dict[str, Any] = {
            "method": outcome.method,
            "target": outcome.target,
            "target_label": labels[outcome.target],
            "options": dict(outcome.options),
        }
        scores = rounded_list(outcome.scores or [])
        if outcome.grid is not None:
            height, width = outcome.grid
            explanation["grid"] = [height, width]
            explanation["scores"] = [scores[row * width : (row + 1) * width] for row in range(height)]
        elif outcome.context is not None:
            pair = outcome.segments is not None
            explanation["granularity"] = outcome.granularity
            explanation["context"] = [unit.to_dict(pair) for unit in outcome.context]
            explanation["tokens"] = [unit.text for unit in outcome.context]
            explanation["special_tokens"] = [unit.special for unit in outcome.context]
            if pair:
                explanation["segments"] = [-1 if unit.segment is None else unit.segment for unit in outcome.context]
            explanation["scores"] = scores
        else:
            explanation["tokens"] = outcome.tokens
            explanation["special_tokens"] = outcome.special_tokens
            if outcome.segments is not None:
                explanation["segments"] = outcome.segments
            explanation["scores"] = scores
        if outcome.pooled != "first":
            explanation["pooled"] = outcome.pooled
        explanation["seconds"] = round(outcome.attribution_seconds, 6)
        document["explanation"] = explanation
    return document


def encode_outcome(outcome: RowOutcome, labels: tuple[str, ...]) -> bytes:
    """Encode one classifier row's answer in the encoding its request came in (:func:`serving_core.wire.encode`)."""
    return wire.encode(
        outcome,
        lambda served: outcome_to_dict(served, labels),
        lambda served, response: fill_response(served, response, labels),
    )


def fill_response(outcome: RowOutcome, response: Any, labels: tuple[str, ...]) -> None:
    """Fill an ``ExplainResponse`` with a served classifier row's answer."""
    response.head_type = outcome.head_type
    if outcome.head_type == "regression":
        if outcome.value is not None:
            response.value = outcome.value
    else:
        response.label = labels[outcome.label_id]
        response.label_id = outcome.label_id
        for label, probability in zip(labels, outcome.probabilities, strict=True):
            response.probabilities[label] = probability
    if outcome.head_type == "multi_label":
        response.labels.extend(labels[index] for index in outcome.predicted)
        response.threshold = outcome.threshold or 0.0
    response.truncated = outcome.truncated
    if outcome.explain_requested:
        response.explained = outcome.method is not None
    if outcome.below is not None:
        response.below = outcome.below
        response.confidence = outcome.confidence or 0.0
    if outcome.skipped is not None:
        response.skipped.reason = outcome.skipped.reason
        response.skipped.method = outcome.skipped.method
        response.skipped.message = outcome.skipped.message
    if outcome.method is not None:
        explanation = response.explanation
        explanation.method = outcome.method
        explanation.target = outcome.target
        explanation.target_label = labels[outcome.target]
        wire.fill_proto_options(explanation, outcome.options)
        explanation.scores.extend(outcome.scores or [])
        if outcome.grid is not None:
            explanation.grid.extend(outcome.grid)
        elif outcome.context is not None:
            explanation.granularity = outcome.granularity
            for unit in outcome.context:
                unit.fill(explanation.context.add())
            explanation.tokens.extend(unit.text for unit in outcome.context)
            explanation.special_tokens.extend(unit.special for unit in outcome.context)
            if outcome.segments is not None:
                explanation.segments.extend(-1 if unit.segment is None else unit.segment for unit in outcome.context)
        else:
            explanation.tokens.extend(outcome.tokens or [])
            explanation.special_tokens.extend(outcome.special_tokens or [])
            explanation.segments.extend(outcome.segments or [])
        if outcome.pooled != "first":
            explanation.pooled = outcome.pooled
        explanation.seconds = outcome.attribution_seconds
