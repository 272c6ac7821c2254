"""Generation models (causal LMs) in the client: the request (:class:`GenerationCall`: a prompt or chat messages,
documents), the answer (:class:`Generation`, one :class:`GenerationStep` per generated token, and with chats or
documents the rendered prompt, its context units and the answer's sentences with their cited documents) and their
JSON and protobuf forms, identical on REST and gRPC (docs/SERVING.md, "Generation models" and "Chat, words and
citations")."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .protos import read_options, write_options
from .results import ContextUnit, ServiceError, answer_id, options_from_json

Steps = Sequence[int] | str | tuple[str, int, int | None] | None
"""Steps to explain: ``None`` (every step; the sentences when documents are given), step indices, ``"sum"``,
``("sum", start, stop)`` for a span of steps, or ``"sentences"`` (each sentence of the answer)."""
Message = Mapping[str, str]
"""A chat message: ``{"role": "system" | "user" | "assistant", "content": "..."}``."""
DocumentInput = str | Mapping[str, str]
"""A document: its text, or ``{"title": ..., "text": ...}``."""


@dataclass(frozen=True)
class GenerationCall:
    """One generation request.

    Attributes:
        prompt: the prompt (``None`` with ``messages``).
        max_new_tokens: new tokens to write (``None``: the model's default).
        sampling: ``do_sample``, ``temperature``, ``top_k``, ``top_p``, ``seed`` (``None``: greedy).
        continuation: explain this continuation (text) instead of generating.
        continuation_ids: or this one, as token ids.
        method: the attribution method (``""``: the model's default method; ``None``: no explanation, only the
            generation and its probabilities).
        steps: which steps to explain (see :data:`Steps`).
        contrast: a foil token (text or id) for every step, or one per step.
        options: method options.
        messages: chat messages, rendered with the model's chat template (instead of ``prompt``).
        documents: documents given to the model (their citations come back with each sentence).
        granularity: ``token`` (``None``: the default), ``word`` or ``sentence``: the units of the answer's context.
        span: ``(start, end)`` characters of the answer to explain (one summed objective) instead of steps.
    """

    prompt: str | None
    max_new_tokens: int | None = None
    sampling: Mapping[str, Any] | None = None
    continuation: str | None = None
    continuation_ids: Sequence[int] | None = None
    method: str | None = None
    steps: Steps = None
    contrast: str | int | Sequence[str | int] | None = None
    options: Mapping[str, int | float] = field(default_factory=dict)
    messages: Sequence[Message] | None = None
    documents: Sequence[DocumentInput] | None = None
    granularity: str | None = None
    span: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        """A prompt or messages, not both."""
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give a prompt or messages= (a chat), not both")

    def to_json(self) -> dict[str, Any]:
        """The REST/JSON request document."""
        document: dict[str, Any] = {}
        if self.messages is not None:
            document["messages"] = [dict(message) for message in self.messages]
        else:
            document["prompt"] = self.prompt
        if self.documents is not None:
            document["documents"] = [item if isinstance(item, str) else dict(item) for item in self.documents]
        if self.max_new_tokens is not None:
            document["max_new_tokens"] = self.max_new_tokens
        if self.sampling:
            document["generation"] = dict(self.sampling)
        if self.continuation is not None:
            document["continuation"] = self.continuation
        if self.continuation_ids is not None:
            document["continuation_ids"] = list(self.continuation_ids)
        if self.method is None:
            document["explain"] = False
            return document
        explain: dict[str, Any] = {"method": self.method, **dict(self.options)} if self.method else dict(self.options)
        if isinstance(self.steps, tuple) and self.steps and self.steps[0] == "sum":
            explain["steps"] = {"sum": [self.steps[1], self.steps[2]]}
        elif self.steps is not None:
            explain["steps"] = self.steps if isinstance(self.steps, str) else list(self.steps)
        if self.contrast is not None:
            explain["contrast"] = self.contrast if isinstance(self.contrast, str | int) else list(self.contrast)
        if self.granularity is not None:
            explain["granularity"] = self.granularity
        if self.span is not None:
            explain["span"] = {"start": self.span[0], "end": self.span[1]}
        document["explain"] = explain
        return document

    def fill_message(self, message: Any) -> Any:
        """Fill an ``ExplainRequest``'s ``generation`` field (proto/explain.proto) and return the message."""
        request = message.generation
        if self.messages is not None:
            for entry in self.messages:
                added = request.messages.add()
                added.role, added.content = str(entry["role"]), str(entry["content"])
        else:
            request.prompt = self.prompt or ""
        for item in self.documents or ():
            document = request.documents.add()
            document.text = item if isinstance(item, str) else str(item["text"])
            document.title = "" if isinstance(item, str) else str(item.get("title") or "")
        request.max_new_tokens = self.max_new_tokens or 0
        if self.sampling:
            sampling = request.sampling
            sampling.do_sample = bool(self.sampling.get("do_sample", False))
            for name in ("temperature", "top_k", "top_p", "seed"):
                if self.sampling.get(name) is not None:
                    setattr(sampling, name, self.sampling[name])
        if self.continuation is not None:
            request.continuation = self.continuation
        if self.continuation_ids is not None:
            request.continuation_ids.extend(int(token) for token in self.continuation_ids)
        if self.method is not None:
            explain = request.explain
            explain.method = self.method
            if isinstance(self.steps, tuple) and self.steps and self.steps[0] == "sum":
                _, start, stop = self.steps
                explain.sum, explain.sum_start = True, int(start or 0)
                if stop is not None:
                    explain.sum_stop = int(stop)
            elif self.steps == "sum":
                explain.sum = True
            elif self.steps == "sentences":
                explain.sentences = True
            elif self.steps is not None and not isinstance(self.steps, str):
                explain.steps.extend(int(step) for step in self.steps if isinstance(step, int))
            foils = [self.contrast] if isinstance(self.contrast, str | int) else list(self.contrast or [])
            if foils and all(isinstance(foil, int) for foil in foils):
                explain.contrast_ids.extend(foil for foil in foils if isinstance(foil, int))
            elif foils:
                explain.contrast.extend(str(foil) for foil in foils)
            write_options(explain, self.options)
            if self.granularity is not None:
                explain.granularity = self.granularity
            if self.span is not None:
                explain.span.start, explain.span.end = self.span
        return message


@dataclass(frozen=True)
class Citation:
    """A document's share of a sentence's attribution: the sum of the sentence's scores over the document's tokens.

    Attributes:
        document: the document's index in the request's ``documents``.
        score: the summed score.
    """

    document: int
    score: float


@dataclass(frozen=True)
class AnswerSpan:
    """A sentence of the answer (or the span asked for), explained as its summed log-probability.

    Attributes:
        text: its characters.
        start: its first character in the answer text.
        end: one past its last.
        steps: ``(first, stop)``: the steps whose log-probabilities were summed.
        scores: one per context unit it sees (the prompt's, then the answer's before its last step).
        value: its summed log-probability.
        documents: the documents ranked by score, highest first (``None``: the request had no documents).
    """

    text: str
    start: int
    end: int
    steps: tuple[int, int]
    scores: tuple[float, ...]
    value: float
    documents: tuple[Citation, ...] | None = None

    def cited(self, share: float = 0.5) -> list[int]:
        """The documents to cite after the sentence: those whose score is positive and at least ``share`` of the
        highest score (the highest first); none when no document scores above 0."""
        ranked = [citation for citation in self.documents or () if citation.score > 0]
        if not ranked:
            return []
        best = ranked[0].score
        return [citation.document for citation in ranked if citation.score >= share * best]

    @classmethod
    def from_dict(cls, document: Mapping[str, Any]) -> AnswerSpan:
        """Parse a ``sentences`` entry (or the ``span``) of a JSON answer."""
        cited = document.get("documents")
        return cls(
            text=str(document.get("text", "")),
            start=int(document["start"]),
            end=int(document["end"]),
            steps=(int(document["steps"][0]), int(document["steps"][1])),
            scores=tuple(float(value) for value in document.get("scores", [])),
            value=float(document.get("value", 0.0)),
            documents=(
                tuple(Citation(int(c["document"]), float(c["score"])) for c in cited) if cited is not None else None
            ),
        )

    @classmethod
    def from_protobuf(cls, proto: Any, cited: bool) -> AnswerSpan:
        """Parse an ``AnswerSpan`` message.

        Args:
            proto: the ``AnswerSpan`` protobuf message.
            cited: whether the request had documents (so that :attr:`documents` is a list, possibly empty).
        """
        return cls(
            text=proto.text,
            start=int(proto.start),
            end=int(proto.end),
            steps=(int(proto.step_start), int(proto.step_stop)),
            scores=tuple(float(value) for value in proto.scores),
            value=float(proto.value),
            documents=tuple(Citation(int(c.document), float(c.score)) for c in proto.documents) if cited else None,
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON object."""
        document: dict[str, Any] = {
            "text": self.text, "start": self.start, "end": self.end, "steps": list(self.steps),
            "scores": list(self.scores), "value": self.value,
        }  # fmt: skip
        if self.documents is not None:
            document["documents"] = [{"document": c.document, "score": c.score} for c in self.documents]
        return document


@dataclass(frozen=True)
class PromptPart:
    """Where a chat message's content or a document landed in the rendered prompt (``None``: not located).

    Attributes:
        role: a message's role (``None`` for a document).
        start: its first character in the rendered prompt.
        end: one past its last.
        title_start: a document's title's first character.
        title_end: one past its last.
        found: how it was found: ``exact``, ``stripped`` or ``between`` (``None``: not located).
    """

    role: str | None
    start: int | None
    end: int | None
    title_start: int | None = None
    title_end: int | None = None
    found: str | None = None

    @classmethod
    def from_dict(cls, document: Mapping[str, Any]) -> PromptPart:
        """Parse an entry of a JSON answer's ``messages`` or ``documents``."""

        def optional(key: str) -> int | None:
            value = document.get(key)
            return None if value is None else int(value)

        return cls(
            document.get("role"), optional("start"), optional("end"), optional("title_start"), optional("title_end"),
            document.get("found"),
        )  # fmt: skip

    @classmethod
    def from_protobuf(cls, proto: Any, message: bool) -> PromptPart:
        """Parse a ``PromptPart`` message.

        Args:
            proto: the ``PromptPart`` protobuf message.
            message: whether it places a chat message (its ``role`` is kept) rather than a document.
        """

        def optional(name: str) -> int | None:
            return int(getattr(proto, name)) if proto.HasField(name) else None

        return cls(
            proto.role if message else None, optional("start"), optional("end"), optional("title_start"),
            optional("title_end"), proto.found or None,
        )  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        """The JSON object."""
        document: dict[str, Any] = {} if self.role is None else {"role": self.role}
        document.update(start=self.start, end=self.end, found=self.found)
        if self.title_start is not None or self.title_end is not None:
            document.update(title_start=self.title_start, title_end=self.title_end)
        return document


@dataclass(frozen=True)
class GenerationStep:
    """One generated token: its piece, id, probability and, when explained, its scores over the context tokens
    (the prompt's tokens, then the tokens generated before it), or over the first units of
    :attr:`Generation.context` when words or sentences were asked for.

    Attributes:
        token: the generated token's text piece.
        token_id: its vocabulary id.
        probability: its probability at its step (the model's softmax, whatever sampling chose it).
        scores: its attribution over the context it sees; ``None``: the step was not explained.
        value: the explained objective (the token's logit, or the logit minus the foil's); ``None`` when not
            explained.
        foil: the contrast token's text piece (``None``: no contrast).
        foil_id: the contrast token's id (``None``: no contrast).
    """

    token: str
    token_id: int
    probability: float
    scores: tuple[float, ...] | None = None
    value: float | None = None
    foil: str | None = None
    foil_id: int | None = None

    @property
    def explained(self) -> bool:
        """Whether this step carries scores."""
        return self.scores is not None


@dataclass(frozen=True)
class Generation:
    """A generation model's answer: the text, the prompt's tokens, each generated step and what was explained.

    Attributes:
        text: the generated text (special tokens skipped).
        stop_reason: ``eos``, ``length`` (the token budget) or ``given`` (a given continuation).
        prompt_tokens: the prompt's tokens.
        prompt_special_tokens: which of them are special tokens.
        steps: one :class:`GenerationStep` per generated token.
        method: the method of the explanation (``None``: none was asked).
        options: its options.
        summed: ``(start, stop)`` when the summed log-probability of those steps was explained.
        sum_scores: its scores over the context tokens (prompt, then the steps before the span's last).
        sum_value: its value.
        seconds: server-side attribution seconds.
        rendered_prompt: chats and rows with documents: the prompt as rendered (offsets are into it).
        messages: where each chat message's content landed in it.
        documents: where each document landed in it.
        documents_placement: ``template``, ``system``, ``user`` (the documents block in that message) or ``prompt``.
        granularity: explained rows: the units of ``context`` (``token``, ``word`` or ``sentence``).
        context: explained rows: the prompt's units, then the answer's; every score is over its first units.
        sentences: the answer's sentences, each explained with its cited documents (``explain`` with documents, or
            ``steps="sentences"``).
        span: the span of the answer asked for, explained.
        explanation_error: why the answer is served without the explanation asked for (``over_time_budget``: the
            explanation of the written answer's actual sentences or steps does not fit what the writing left of the
            model's time budget; its message says what fits); ``None`` otherwise.
        request_id: the answer's id, the id of its record (JSON ``id``, protobuf ``request_id``; the caller's
            ``X-Request-Id`` when it sent one); ``None`` when the service sent none. Not compared.
    """

    text: str
    stop_reason: str
    prompt_tokens: tuple[str, ...]
    prompt_special_tokens: tuple[bool, ...]
    steps: tuple[GenerationStep, ...]
    method: str | None = None
    options: Mapping[str, int | float] = field(default_factory=dict)
    summed: tuple[int, int] | None = None
    sum_scores: tuple[float, ...] | None = None
    sum_value: float | None = None
    seconds: float = 0.0
    rendered_prompt: str | None = None
    messages: tuple[PromptPart, ...] | None = None
    documents: tuple[PromptPart, ...] | None = None
    documents_placement: str | None = None
    granularity: str = "token"
    context: tuple[ContextUnit, ...] | None = None
    sentences: tuple[AnswerSpan, ...] | None = None
    span: AnswerSpan | None = None
    explanation_error: ServiceError | None = field(default=None, compare=False)
    request_id: str | None = field(default=None, compare=False)

    def context_units(self, count: int) -> list[str]:
        """The texts of the first ``count`` context units (a step's, a sentence's scores are over them): the
        ``context`` units when the answer has them, else the tokens (prompt, then generated)."""
        if self.context is not None:
            return [unit.text for unit in self.context[:count]]
        return [*self.prompt_tokens, *(entry.token for entry in self.steps)][:count]

    def context_tokens(self, step: int) -> list[str]:
        """The tokens step ``step``'s scores are over: the prompt's, then the earlier generated tokens."""
        return [*self.prompt_tokens, *(entry.token for entry in self.steps[:step])]

    @classmethod
    def from_dict(cls, document: Mapping[str, Any]) -> Generation:
        """Parse a JSON response row.

        Raises:
            ServiceError: when the row carries an ``error`` object.
        """
        error = document.get("error")
        if error is not None:
            raise ServiceError(
                str(error.get("code", "internal")), str(error.get("message", "")), error.get("http_status"),
                error.get("grpc_code"), request_id=answer_id(document),
            )  # fmt: skip
        steps = tuple(
            GenerationStep(
                token=str(step["token"]),
                token_id=int(step["token_id"]),
                probability=float(step["probability"]),
                scores=tuple(float(v) for v in step["scores"]) if "scores" in step else None,
                value=float(step["value"]) if "value" in step else None,
                foil=step.get("foil"),
                foil_id=int(step["foil_id"]) if "foil_id" in step else None,
            )
            for step in document.get("steps", [])
        )
        explanation = document.get("explanation") or {}
        refused = explanation.get("error")
        summed = explanation.get("sum")
        context = explanation.get("context")
        sentences = explanation.get("sentences")
        messages, documents = document.get("messages"), document.get("documents")
        return cls(
            text=str(document.get("text", "")),
            stop_reason=str(document.get("stop_reason", "")),
            prompt_tokens=tuple(document.get("prompt_tokens", [])),
            prompt_special_tokens=tuple(bool(flag) for flag in document.get("prompt_special_tokens", [])),
            steps=steps,
            method=explanation.get("method"),
            options=options_from_json(explanation.get("options")),
            summed=(int(summed["start"]), int(summed["stop"])) if summed else None,
            sum_scores=tuple(float(v) for v in summed["scores"]) if summed else None,
            sum_value=float(summed["value"]) if summed else None,
            seconds=float(explanation.get("seconds", 0.0)),
            rendered_prompt=document.get("rendered_prompt"),
            messages=tuple(PromptPart.from_dict(part) for part in messages) if messages is not None else None,
            documents=tuple(PromptPart.from_dict(part) for part in documents) if documents is not None else None,
            documents_placement=document.get("documents_placement"),
            granularity=str(explanation.get("granularity") or "token"),
            context=tuple(ContextUnit.from_dict(unit) for unit in context) if context is not None else None,
            sentences=tuple(AnswerSpan.from_dict(item) for item in sentences) if sentences is not None else None,
            span=AnswerSpan.from_dict(explanation["span"]) if explanation.get("span") else None,
            explanation_error=None if not isinstance(refused, Mapping) else ServiceError(
                str(refused.get("code", "internal")), str(refused.get("message", "")), refused.get("http_status"),
                refused.get("grpc_code"),
            ),
            request_id=answer_id(document),
        )  # fmt: skip

    @classmethod
    def from_protobuf(cls, response: Any) -> Generation:
        """Parse an ``ExplainResponse`` (or raise its row error)."""
        if response.HasField("error"):
            error = response.error
            raise ServiceError(error.code, error.message, int(error.http_status) or None, error.grpc_code or None,
                               request_id=response.request_id or None)  # fmt: skip
        result = response.generation
        steps = tuple(
            GenerationStep(
                token=step.token,
                token_id=int(step.token_id),
                probability=float(step.probability),
                scores=tuple(float(v) for v in step.scores) if step.explained else None,
                value=float(step.value) if step.explained else None,
                foil=step.foil or None,
                foil_id=int(step.foil_id) if step.foil else None,
            )
            for step in result.steps
        )
        return cls(
            text=result.text,
            stop_reason=result.stop_reason,
            prompt_tokens=tuple(result.prompt_tokens),
            prompt_special_tokens=tuple(bool(flag) for flag in result.prompt_special_tokens),
            steps=steps,
            method=result.method or None,
            options=read_options(result),
            summed=(int(result.sum_start), int(result.sum_stop)) if result.summed else None,
            sum_scores=tuple(float(v) for v in result.sum_scores) if result.summed else None,
            sum_value=float(result.sum_value) if result.summed else None,
            seconds=float(result.seconds),
            rendered_prompt=result.rendered_prompt or None,
            messages=tuple(PromptPart.from_protobuf(part, True) for part in result.messages) or None,
            documents=tuple(PromptPart.from_protobuf(part, False) for part in result.documents) or None,
            documents_placement=result.documents_placement or None,
            granularity=result.granularity or "token",
            context=tuple(ContextUnit.from_protobuf(unit) for unit in result.context) if result.method else None,
            sentences=(
                tuple(AnswerSpan.from_protobuf(item, bool(result.documents)) for item in result.sentences)
                if result.explained_sentences
                else None
            ),
            span=AnswerSpan.from_protobuf(result.span, bool(result.documents)) if result.HasField("span") else None,
            explanation_error=_proto_error(result.explanation_error) if result.HasField("explanation_error") else None,
            request_id=response.request_id or None,
        )

    def to_dict(self) -> dict[str, Any]:
        """The answer as a JSON-ready dict (the REST response format; its ``id`` first when it has one)."""
        steps = []
        for step in self.steps:
            entry: dict[str, Any] = {"token": step.token, "token_id": step.token_id, "probability": step.probability}
            if step.scores is not None:
                entry["scores"] = list(step.scores)
                entry["value"] = step.value
            if step.foil_id is not None:
                entry["foil"], entry["foil_id"] = step.foil, step.foil_id
            steps.append(entry)
        document: dict[str, Any] = {"id": self.request_id} if self.request_id is not None else {}
        document |= {
            "task": "generation", "text": self.text, "stop_reason": self.stop_reason,
            "prompt_tokens": list(self.prompt_tokens), "prompt_special_tokens": list(self.prompt_special_tokens),
            "steps": steps,
        }  # fmt: skip
        if self.method is not None and self.explanation_error is not None:
            document["explanation"] = {"method": self.method, "error": self.explanation_error.to_dict()}
        elif self.method is not None:
            explanation: dict[str, Any] = {"method": self.method, "options": dict(self.options)}
            if self.summed is not None:
                explanation["sum"] = {
                    "start": self.summed[0], "stop": self.summed[1], "scores": list(self.sum_scores or ()),
                    "value": self.sum_value,
                }  # fmt: skip
            elif self.sentences is None and self.span is None:
                explanation["steps"] = [index for index, step in enumerate(self.steps) if step.explained]
            if self.context is not None:
                explanation["granularity"] = self.granularity
                explanation["context"] = [unit.to_dict() for unit in self.context]
            if self.sentences is not None:
                explanation["sentences"] = [sentence.to_dict() for sentence in self.sentences]
            if self.span is not None:
                explanation["span"] = self.span.to_dict()
            explanation["seconds"] = self.seconds
            document["explanation"] = explanation
        if self.rendered_prompt is not None:
            document["rendered_prompt"] = self.rendered_prompt
        if self.messages is not None:
            document["messages"] = [part.to_dict() for part in self.messages]
        if self.documents is not None:
            document["documents"] = [part.to_dict() for part in self.documents]
            document["documents_placement"] = self.documents_placement
        return document


def _proto_error(error: Any) -> ServiceError:
    """A protobuf ``Error`` as a :class:`ServiceError`."""
    return ServiceError(error.code, error.message, int(error.http_status) or None, error.grpc_code or None)
