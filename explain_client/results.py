"""The result types a client gets back, identical for REST and gRPC: a :class:`Prediction` (with an optional
:class:`Explanation`) or a :class:`ServiceError` (a per-row error of the service, or a transport failure)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


class ServiceError(Exception):
    """A request the service did not answer with a prediction.

    Attributes:
        code: the service's error code (``unknown_method``, ``invalid_target``, … see docs/SERVING.md), or a
            transport code: ``timeout``, ``unavailable``, ``unauthorized``, ``model_not_found``,
            ``request_too_large``, ``internal`` or ``http_<status>``.
        message: what was wrong and how to fix it (the server's message when it sent one).
        http_status: the HTTP status a REST caller gets for it (``None`` when unknown, e.g. a timeout).
        grpc_code: the gRPC status name (``INVALID_ARGUMENT``, …) when known.
        request_id: the id of the answer that carried the error (its record's id; the caller's ``X-Request-Id``
            when it sent one), when the service sent one.
    """

    def __init__(
        self,
        code: str,
        message: str,
        http_status: int | None = None,
        grpc_code: str | None = None,
        *,
        request_id: str | None = None,
    ) -> None:
        """Create the error."""
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.http_status = http_status
        self.grpc_code = grpc_code
        self.request_id = request_id

    def to_dict(self) -> dict[str, Any]:
        """The error as the JSON object the service uses (``code``, ``message``, ``http_status``, ``grpc_code``)."""
        return {
            "code": self.code,
            "message": self.message,
            "http_status": self.http_status,
            "grpc_code": self.grpc_code,
        }


def answer_id(document: Mapping[str, Any]) -> str | None:
    """A JSON answer's ``id`` (the id of its record; docs/RECORDS.md, "Request ids"), None when it has none."""
    value = document.get("id")
    return value if isinstance(value, str) and value else None


def options_from_json(options: Any) -> dict[str, int | float]:
    """Method options as a JSON answer gives them: an integer option stays an ``int``, a real-valued one a
    ``float``."""
    return {str(key): value if isinstance(value, int) else float(value) for key, value in dict(options or {}).items()}


@dataclass(frozen=True)
class ContextUnit:
    """A unit the scores are over, when a request asked for ``granularity`` (or a chat model's answer): a token,
    word or sentence, its characters, and where it comes from.

    Attributes:
        text: its characters (a special token without characters: the token itself, e.g. ``[CLS]``).
        start: its first character (``None``: no characters): into the input text (classifiers; into its own text
            for a sentence pair), the rendered prompt (generation), or the answer text when ``generated``.
        end: one past its last character.
        message: generation: the index of the chat message it is in (``None``: none).
        document: generation: the index of the document it is in (``None``: none).
        template: generation: added by the chat template, the tokenizer or the documents block.
        generated: generation: a unit of the answer.
        special: classifiers: a special token ([CLS], [SEP], <s>).
        segment: classifiers' sentence pairs: 0 (``text``) or 1 (``text_pair``).
    """

    text: str
    start: int | None = None
    end: int | None = None
    message: int | None = None
    document: int | None = None
    template: bool = False
    generated: bool = False
    special: bool = False
    segment: int | None = None

    @classmethod
    def from_dict(cls, document: Mapping[str, Any]) -> ContextUnit:
        """Parse one entry of an answer's ``context``."""

        def optional(key: str) -> int | None:
            value = document.get(key)
            return None if value is None else int(value)

        return cls(
            text=str(document.get("text", "")),
            start=optional("start"),
            end=optional("end"),
            message=optional("message"),
            document=optional("document"),
            template=bool(document.get("template", False)),
            generated=bool(document.get("generated", False)),
            special=bool(document.get("special", False)),
            segment=optional("segment"),
        )

    @classmethod
    def from_protobuf(cls, proto: Any) -> ContextUnit:
        """Parse a ``ContextUnit`` message."""

        def optional(name: str) -> int | None:
            return int(getattr(proto, name)) if proto.HasField(name) else None

        return cls(
            text=proto.text,
            start=optional("start"),
            end=optional("end"),
            message=optional("message"),
            document=optional("document"),
            template=bool(proto.template),
            generated=bool(proto.generated),
            special=bool(proto.special),
            segment=optional("segment"),
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON object (the fields that are set)."""
        document: dict[str, Any] = {"text": self.text, "start": self.start, "end": self.end}
        for key in ("message", "document", "segment"):
            if getattr(self, key) is not None:
                document[key] = getattr(self, key)
        for key in ("template", "generated", "special"):
            if getattr(self, key):
                document[key] = True
        return document


@dataclass(frozen=True)
class Explanation:
    """One attribution returned by the service.

    Attributes:
        method: registry name of the method (``relevance``, ``rollout``, …).
        target: index of the class explained.
        target_label: name of the class explained.
        options: the method options used, defaults filled in.
        scores: text: one score per token (special tokens included); images: ``grid[0] * grid[1]`` scores,
            row-major over the patch grid.
        tokens: text only: the tokenizer's pieces, aligned with ``scores``.
        special_tokens: text only: which pieces are special tokens ([CLS], [SEP], …).
        grid: images only: ``(grid_h, grid_w)``.
        seconds: server-side attribution seconds of this row's method group.
        pooled: the token position the classifier reads: ``first`` ([CLS] / the class token), or e.g. ``last``
            (decoder classifiers: the last real token) or ``mean``.
        segments: sentence pairs: per token, 0 = from ``text``, 1 = from ``text_pair``, -1 = a special token;
            ``None`` for a single text and for images.
        granularity: ``token``, or ``word``/``sentence`` when the request asked for them: ``tokens`` and ``scores``
            are then the text's units (each unit's score the sum of its tokens'), described by ``context``.
        context: with ``word``/``sentence``: each unit's characters (``None`` otherwise).
    """

    method: str
    target: int
    target_label: str
    options: Mapping[str, int | float]
    scores: tuple[float, ...]
    tokens: tuple[str, ...] | None = None
    special_tokens: tuple[bool, ...] | None = None
    grid: tuple[int, int] | None = None
    seconds: float = 0.0
    pooled: str = "first"
    segments: tuple[int, ...] | None = None
    granularity: str = "token"
    context: tuple[ContextUnit, ...] | None = None

    def __post_init__(self) -> None:
        """Check that the shapes agree."""
        if self.context is not None and len(self.context) != len(self.scores):
            raise ValueError(f"{len(self.context)} context units for {len(self.scores)} scores")
        if self.segments is not None and len(self.segments) != len(self.scores):
            raise ValueError(f"{len(self.segments)} segment ids for {len(self.scores)} scores")
        if self.grid is not None:
            if len(self.scores) != self.grid[0] * self.grid[1]:
                raise ValueError(f"{len(self.scores)} scores for a {self.grid[0]}x{self.grid[1]} grid")
        elif self.tokens is not None:
            special = self.special_tokens
            if len(self.tokens) != len(self.scores) or (special is not None and len(special) != len(self.tokens)):
                raise ValueError(f"{len(self.tokens)} tokens for {len(self.scores)} scores")

    @property
    def is_image(self) -> bool:
        """Whether the scores lie on a patch grid."""
        return self.grid is not None

    def score_grid(self) -> list[list[float]]:
        """Image scores as ``grid_h`` rows of ``grid_w`` values.

        Raises:
            ValueError: for a text explanation.
        """
        if self.grid is None:
            raise ValueError("a text explanation has no patch grid")
        height, width = self.grid
        return [list(self.scores[row * width : (row + 1) * width]) for row in range(height)]

    @classmethod
    def from_dict(cls, document: Mapping[str, Any]) -> Explanation:
        """Parse the ``explanation`` object of a JSON response."""
        grid_value = document.get("grid")
        raw_scores: Sequence[Any] = document.get("scores", [])
        if grid_value is not None:
            grid: tuple[int, int] | None = (int(grid_value[0]), int(grid_value[1]))
            scores = tuple(float(value) for row in raw_scores for value in row)
        else:
            grid = None
            scores = tuple(float(value) for value in raw_scores)
        tokens = document.get("tokens")
        special = document.get("special_tokens")
        segments = document.get("segments")
        context = document.get("context")
        return cls(
            method=str(document["method"]),
            target=int(document["target"]),
            target_label=str(document["target_label"]),
            options=options_from_json(document.get("options")),
            scores=scores,
            tokens=tuple(str(token) for token in tokens) if tokens is not None else None,
            special_tokens=tuple(bool(flag) for flag in special) if special is not None else None,
            grid=grid,
            seconds=float(document.get("seconds", 0.0)),
            pooled=str(document.get("pooled") or "first"),
            segments=tuple(int(value) for value in segments) if segments else None,
            granularity=str(document.get("granularity") or "token"),
            context=tuple(ContextUnit.from_dict(unit) for unit in context) if context is not None else None,
        )

    def to_dict(self) -> dict[str, Any]:
        """The explanation as a JSON-ready dict (image scores nested by grid row, as the REST API sends them)."""
        document: dict[str, Any] = {
            "method": self.method,
            "target": self.target,
            "target_label": self.target_label,
            "options": dict(self.options),
        }
        if self.grid is not None:
            document["grid"] = list(self.grid)
            document["scores"] = self.score_grid()
        else:
            document["tokens"] = list(self.tokens or ())
            document["special_tokens"] = list(self.special_tokens or ())
            document["scores"] = list(self.scores)
            if self.segments is not None:
                document["segments"] = list(self.segments)
            if self.context is not None:
                document["granularity"] = self.granularity
                document["context"] = [unit.to_dict() for unit in self.context]
        if self.pooled != "first":
            document["pooled"] = self.pooled
        document["seconds"] = self.seconds
        return document


@dataclass(frozen=True)
class Entity:
    """One entity a token classifier found (NER, PII detection).

    Attributes:
        text: the entity's text, ``input[start:end]``.
        label: its type (``PER`` for a span tagged ``B-PER I-PER``; the tag itself when the labels follow no scheme).
        tag: the label of its first token, as the model spells it (``B-PER``).
        label_id: that label's index.
        start: character offset of its first character in the input.
        end: character offset after its last character (exclusive).
        token_start: position of its first token.
        token_end: position after its last token (exclusive).
        score: the mean over its tokens of the probability of each token's tag.
        scores: its attribution over the input's tokens (one per token, aligned with
            :attr:`TokenClassification.tokens`), when an explanation was asked; else ``None``.
    """

    text: str
    label: str
    tag: str
    label_id: int
    start: int
    end: int
    token_start: int
    token_end: int
    score: float
    scores: tuple[float, ...] | None = None

    @classmethod
    def from_dict(cls, document: Mapping[str, Any]) -> Entity:
        """Parse one entry of a JSON response's ``entities``."""
        scores = document.get("scores")
        return cls(
            text=str(document["text"]),
            label=str(document["label"]),
            tag=str(document.get("tag") or document["label"]),
            label_id=int(document["label_id"]),
            start=int(document["start"]),
            end=int(document["end"]),
            token_start=int(document["token_start"]),
            token_end=int(document["token_end"]),
            score=float(document["score"]),
            scores=tuple(float(value) for value in scores) if scores is not None else None,
        )

    def to_dict(self) -> dict[str, Any]:
        """The entity as the JSON object the service sends."""
        document: dict[str, Any] = {
            "text": self.text,
            "label": self.label,
            "tag": self.tag,
            "label_id": self.label_id,
            "start": self.start,
            "end": self.end,
            "token_start": self.token_start,
            "token_end": self.token_end,
            "score": self.score,
        }
        if self.scores is not None:
            document["scores"] = list(self.scores)
        return document


@dataclass(frozen=True)
class TokenClassification:
    """A token classifier's answer for one text: its entities and, when asked, each one's attribution.

    Attributes:
        scheme: the tagging scheme of the model's labels: ``BIO``, ``BIOES``, ``IO`` or ``none`` (each token its own
            entity).
        entities: the entities, in text order.
        tokens: the tokenizer's pieces of the (possibly truncated) input.
        special_tokens: which pieces are special tokens.
        offsets: each piece's character offsets ``(start, end)`` in the input (``(0, 0)`` for special tokens).
        method: the attribution method, when an explanation was asked (then every entity has ``scores``).
        options: the method's options, defaults filled in.
        seconds: server-side attribution seconds of this row's method group.
        granularity: ``token``, or ``word``/``sentence`` when the request asked for them: each entity's ``scores``
            are then over ``context``'s units (each the sum of its tokens' scores).
        context: with ``word``/``sentence``: the text's units (``None`` otherwise).
    """

    scheme: str
    entities: tuple[Entity, ...]
    tokens: tuple[str, ...]
    special_tokens: tuple[bool, ...]
    offsets: tuple[tuple[int, int], ...]
    method: str | None = None
    options: Mapping[str, int | float] = field(default_factory=dict)
    seconds: float = 0.0
    granularity: str = "token"
    context: tuple[ContextUnit, ...] | None = None

    def __post_init__(self) -> None:
        """Check that the shapes agree."""
        if len(self.special_tokens) != len(self.tokens) or len(self.offsets) != len(self.tokens):
            raise ValueError(
                f"{len(self.tokens)} tokens, {len(self.special_tokens)} flags, {len(self.offsets)} offsets"
            )
        over, what = (len(self.tokens), "tokens") if self.context is None else (len(self.context), "units")
        for entity in self.entities:
            if entity.scores is not None and len(entity.scores) != over:
                raise ValueError(f"entity {entity.text!r} has {len(entity.scores)} scores for {over} {what}")

    def explanation(self, entity: int | Entity) -> Explanation:
        """One entity's attribution as a text :class:`Explanation` (its tokens and scores), for the renderers.

        Args:
            entity: the entity or its index in :attr:`entities`.

        Raises:
            ValueError: if no explanation was asked (the entity has no scores).
        """
        chosen = self.entities[entity] if isinstance(entity, int) else entity
        if chosen.scores is None or self.method is None:
            raise ValueError("this answer has no attribution: ask with a method (explain=...) to get one")
        units = self.context
        return Explanation(
            method=self.method,
            target=chosen.label_id,
            target_label=chosen.tag,
            options=self.options,
            scores=chosen.scores,
            tokens=self.tokens if units is None else tuple(unit.text for unit in units),
            special_tokens=self.special_tokens if units is None else tuple(unit.special for unit in units),
            seconds=self.seconds,
            granularity=self.granularity,
            context=units,
        )

    @classmethod
    def from_dict(cls, document: Mapping[str, Any]) -> TokenClassification:
        """Parse the token-classification fields of a JSON response row."""
        explanation = document.get("explanation") or {}
        return cls(
            scheme=str(document.get("scheme") or "none"),
            entities=tuple(Entity.from_dict(entity) for entity in document.get("entities") or ()),
            tokens=tuple(str(token) for token in document.get("tokens") or ()),
            special_tokens=tuple(bool(flag) for flag in document.get("special_tokens") or ()),
            offsets=tuple((int(start), int(end)) for start, end in document.get("offsets") or ()),
            method=str(explanation["method"]) if "method" in explanation else None,
            options=options_from_json(explanation.get("options")),
            seconds=float(explanation.get("seconds", 0.0)),
            granularity=str(explanation.get("granularity") or "token"),
            context=(
                tuple(ContextUnit.from_dict(unit) for unit in explanation["context"])
                if explanation.get("context") is not None
                else None
            ),
        )

    def to_dict(self) -> dict[str, Any]:
        """The fields as the service's JSON response has them."""
        document: dict[str, Any] = {
            "scheme": self.scheme,
            "entities": [entity.to_dict() for entity in self.entities],
            "tokens": list(self.tokens),
            "special_tokens": list(self.special_tokens),
            "offsets": [list(offset) for offset in self.offsets],
        }
        if self.method is not None:
            document["explanation"] = {"method": self.method, "options": dict(self.options), "seconds": self.seconds}
            if self.context is not None:
                document["explanation"]["granularity"] = self.granularity
                document["explanation"]["context"] = [unit.to_dict() for unit in self.context]
        return document


@dataclass(frozen=True)
class Skipped:
    """Why an explanation asked for only when unsure was not computed.

    Attributes:
        reason: ``confident``: the prediction's confidence was not below the threshold.
        method: the method that would have run.
        message: one sentence saying so.
    """

    reason: str
    method: str
    message: str = ""

    @classmethod
    def from_dict(cls, document: Mapping[str, Any]) -> Skipped:
        """Parse the ``skipped`` object of a JSON response."""
        return cls(str(document.get("reason", "")), str(document.get("method", "")), str(document.get("message", "")))

    def to_dict(self) -> dict[str, Any]:
        """The JSON object the service sends."""
        return {"reason": self.reason, "method": self.method, "message": self.message}


#: The kinds of head the service reports (``head_type``): a sequence classifier's three, and token classifiers'.
HEAD_TYPES = ("single_label", "multi_label", "regression", "token_classification")


@dataclass(frozen=True)
class Prediction:
    """The service's answer for one input.

    Attributes:
        label: the predicted class name (multi-label: the most probable label); ``None`` for a regression head.
        label_id: its index; ``None`` for a regression head.
        probabilities: class name → probability: the softmax of the logits (single-label), an independent sigmoid
            per label (multi-label); empty for a regression head.
        truncated: text only: the input was longer than the model's ``max_length`` and was truncated.
        explanation: the attribution, when one was asked for.
        head_type: ``single_label``, ``multi_label`` or ``regression``.
        labels: multi-label heads: every label whose probability is at least ``threshold``, in label order.
        threshold: multi-label heads: the decision threshold.
        value: regression heads: the predicted value.
        explained: when an explanation was asked for: whether ``explanation`` holds one (``None``: none was asked
            for, or an older server).
        below: when the explanation was asked for only when unsure: the threshold applied (the request's, or the
            model's ``explain_below``).
        confidence: with ``below``: the prediction's confidence it was compared with.
        skipped: when ``explained`` is false: why (:class:`Skipped`).
        token_classification: token classifiers (``head_type`` ``token_classification``): the entities found, and
            each one's attribution when asked; ``label``, ``label_id`` and ``probabilities`` are then empty.
        request_id: the answer's id, the id of its record (JSON ``id``, protobuf ``request_id``; the caller's
            ``X-Request-Id`` when it sent one); ``None`` when the service sent none. Not compared: the same answer
            to two requests is equal.
    """

    label: str | None
    label_id: int | None
    probabilities: Mapping[str, float]
    truncated: bool = False
    explanation: Explanation | None = None
    head_type: str = "single_label"
    labels: tuple[str, ...] = ()
    threshold: float | None = None
    value: float | None = None
    explained: bool | None = None
    below: float | None = None
    confidence: float | None = None
    skipped: Skipped | None = None
    token_classification: TokenClassification | None = None
    request_id: str | None = field(default=None, compare=False)

    @property
    def entities(self) -> tuple[Entity, ...]:
        """A token classifier's entities (empty for other heads)."""
        return () if self.token_classification is None else self.token_classification.entities

    @classmethod
    def from_dict(cls, document: Mapping[str, Any]) -> Prediction:
        """Parse a JSON response row.

        Raises:
            ServiceError: when the row carries an ``error`` object.
        """
        error = document.get("error")
        if error is not None:
            raise ServiceError(
                str(error.get("code", "internal")),
                str(error.get("message", "")),
                error.get("http_status"),
                error.get("grpc_code"),
                request_id=answer_id(document),
            )
        head_type = str(document.get("head_type") or "single_label")
        if head_type == "token_classification":
            return cls(
                label=None,
                label_id=None,
                probabilities={},
                truncated=bool(document.get("truncated", False)),
                head_type=head_type,
                token_classification=TokenClassification.from_dict(document),
                request_id=answer_id(document),
            )
        explanation = document.get("explanation")
        regression = head_type == "regression"
        value = document.get("value")
        threshold = document.get("threshold")
        explained, below, confidence = document.get("explained"), document.get("below"), document.get("confidence")
        skipped = document.get("skipped")
        return cls(
            label=None if regression else str(document["label"]),
            label_id=None if regression else int(document["label_id"]),
            probabilities={str(key): float(value) for key, value in dict(document.get("probabilities") or {}).items()},
            truncated=bool(document.get("truncated", False)),
            explanation=Explanation.from_dict(explanation) if explanation is not None else None,
            head_type=head_type,
            labels=tuple(str(label) for label in document.get("labels") or ()),
            threshold=float(threshold) if threshold is not None else None,
            value=float(value) if value is not None else None,
            explained=bool(explained) if explained is not None else None,
            below=float(below) if below is not None else None,
            confidence=float(confidence) if confidence is not None else None,
            skipped=Skipped.from_dict(skipped) if isinstance(skipped, Mapping) else None,
            request_id=answer_id(document),
        )

    def to_dict(self) -> dict[str, Any]:
        """The prediction as a JSON-ready dict (the service's REST response format; its ``id`` first when it has
        one)."""
        document: dict[str, Any] = {"id": self.request_id} if self.request_id is not None else {}
        document["head_type"] = self.head_type
        if self.token_classification is not None:
            document.update(self.token_classification.to_dict())
            document["truncated"] = self.truncated
            return document
        if self.head_type == "regression":
            document["value"] = self.value
        else:
            document.update(label=self.label, label_id=self.label_id, probabilities=dict(self.probabilities))
        if self.head_type == "multi_label":
            document.update(labels=list(self.labels), threshold=self.threshold)
        document["truncated"] = self.truncated
        if self.explained is not None:
            document["explained"] = self.explained
        if self.below is not None:
            document.update(below=self.below, confidence=self.confidence)
        if self.skipped is not None:
            document["skipped"] = self.skipped.to_dict()
        if self.explanation is not None:
            document["explanation"] = self.explanation.to_dict()
        return document
