"""The chat, unit and citation parts of a generation row: ``messages`` and ``documents`` decoded and bounded,
``explain.granularity`` and ``explain.span`` checked, and the answer's ``context`` units, ``sentences`` (with their
cited documents) and where each message and document landed in the rendered prompt, as JSON and protobuf.

JSON request fields (with ``prompt``'s place taken by ``messages``)::

    {"messages": [{"role": "system", "content": "..."}, {"role": "user", "content": "..."}],
     "documents": ["a passage", {"title": "Eiffel Tower", "text": "..."}],
     "explain": {"method": "attnlrp", "granularity": "word", "steps": "sentences"}}

``explain.granularity``: ``token`` (the default), ``word`` or ``sentence``: the units the answer's ``context`` lists
and every score is aligned with. ``explain.steps: "sentences"`` explains each sentence of the answer (its summed
log-probability; the default when documents are given); ``explain.span: {"start", "end"}`` explains the steps whose
characters overlap that span of the answer instead. docs/SERVING.md ("Chat, words and citations") has the answer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from explainers import (
    GRANULARITIES,
    Document,
    ExplainError,
    Message,
    UnknownRoleError,
    check_documents,
    check_messages,
)

from ..config import HandlerConfig
from ..errors import RowError
from ..wire import rounded, rounded_list


@dataclass(frozen=True)
class ContextUnit:
    """One unit of an answer's context: a token, word or sentence of the rendered prompt, or of the answer.

    Attributes:
        text: its characters (a token without characters: the token's text, e.g. ``<s>``).
        start: its first character: in the rendered prompt, or in the answer text when ``generated`` (``None``: a
            token without characters).
        end: one past its last character.
        message: the index of the message it is in (``None``: in none).
        document: the index of the document it is in (``None``: in none).
        template: a unit of the prompt that is neither the caller's text nor a document's: what the chat template
            (or the tokenizer, or the documents block) added.
        generated: a unit of the answer (its offsets are into the answer text).
    """

    text: str
    start: int | None
    end: int | None
    message: int | None = None
    document: int | None = None
    template: bool = False
    generated: bool = False

    def to_dict(self) -> dict[str, Any]:
        """The JSON object."""
        return {
            "text": self.text,
            "start": self.start,
            "end": self.end,
            "message": self.message,
            "document": self.document,
            "template": self.template,
            "generated": self.generated,
        }

    def fill(self, proto: Any) -> None:
        """Fill a ``ContextUnit`` message."""
        proto.text = self.text
        for name in ("start", "end", "message", "document"):
            value = getattr(self, name)
            if value is not None:
                setattr(proto, name, value)
        proto.template = self.template
        proto.generated = self.generated


@dataclass
class AnswerSpan:
    """A sentence of the answer, or the span the request asked about, explained as one summed objective.

    Attributes:
        text: its characters.
        start: its first character in the answer text.
        end: one past its last.
        steps: ``(first, stop)``, the steps whose log-probabilities are summed.
        scores: its attribution over the context units it sees (the prompt's, and the answer's before its last step).
        value: its summed log-probability.
        documents: ``(document, score)`` ranked by score, highest first (``None``: the request had no documents).
    """

    text: str
    start: int
    end: int
    steps: tuple[int, int]
    scores: list[float] = field(default_factory=list)
    value: float = 0.0
    documents: list[tuple[int, float]] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON object."""
        document: dict[str, Any] = {
            "text": self.text,
            "start": self.start,
            "end": self.end,
            "steps": list(self.steps),
            "scores": rounded_list(self.scores),
            "value": rounded(self.value),
        }
        if self.documents is not None:
            document["documents"] = [{"document": index, "score": rounded(score)} for index, score in self.documents]
        return document

    def fill(self, proto: Any) -> None:
        """Fill an ``AnswerSpan`` message."""
        proto.text = self.text
        proto.start, proto.end = self.start, self.end
        proto.step_start, proto.step_stop = self.steps
        proto.scores.extend(self.scores)
        proto.value = self.value
        for index, score in self.documents or []:
            citation = proto.documents.add()
            citation.document = index
            citation.score = score


@dataclass(frozen=True)
class PromptPart:
    """Where a message's content or a document landed in the rendered prompt (``None``: not located).

    Attributes:
        role: a message's role (``None`` for a document).
        start: the content's (a document's text's) first character in the rendered prompt.
        end: one past its last.
        title_start: a document's title's first character.
        title_end: one past its last.
        found: ``exact``, ``stripped`` or ``between`` (``explainers.chat``), ``None``: not located.
    """

    role: str | None
    start: int | None
    end: int | None
    title_start: int | None = None
    title_end: int | None = None
    found: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON object (a document's has no ``role``; its title's span only when it has a title)."""
        document: dict[str, Any] = {} if self.role is None else {"role": self.role}
        document.update({"start": self.start, "end": self.end, "found": self.found})
        if self.title_start is not None or self.title_end is not None:
            document["title_start"], document["title_end"] = self.title_start, self.title_end
        return document

    def fill(self, proto: Any) -> None:
        """Fill a ``PromptPart`` message."""
        proto.role = self.role or ""
        for name in ("start", "end", "title_start", "title_end"):
            value = getattr(self, name)
            if value is not None:
                setattr(proto, name, value)
        proto.found = self.found or ""


def decode_messages(value: Any, config: HandlerConfig) -> tuple[Message, ...]:
    """The request's ``messages``.

    Raises:
        RowError: ``too_many_messages`` over ``max_messages``; ``unknown_role``; ``invalid_messages`` otherwise.
    """
    if isinstance(value, Sequence) and not isinstance(value, str | bytes) and len(value) > config.max_messages:
        raise RowError(
            "too_many_messages", f"{len(value)} messages; this model takes at most {config.max_messages} (max_messages)"
        )
    try:
        return tuple(check_messages(value))
    except UnknownRoleError as error:
        raise RowError("unknown_role", str(error)) from None
    except ExplainError as error:
        raise RowError("invalid_messages", str(error)) from None


def decode_documents(value: Any, config: HandlerConfig) -> tuple[Document, ...]:
    """The request's ``documents``.

    Raises:
        RowError: ``too_many_documents`` over ``max_documents``; ``invalid_request`` for a malformed document.
    """
    if value is None:
        return ()
    if isinstance(value, Sequence) and not isinstance(value, str | bytes) and len(value) > config.max_documents:
        raise RowError(
            "too_many_documents",
            f"{len(value)} documents; this model takes at most {config.max_documents} (max_documents)",
        )
    try:
        return tuple(check_documents(value))
    except ExplainError as error:
        raise RowError("invalid_request", str(error)) from None


def check_size(prompt: str | None, messages: Sequence[Message], documents: Sequence[Document], limit: int) -> None:
    """The characters of the prompt or messages and the documents together, bounded by ``max_text_chars``.

    Raises:
        RowError: ``text_too_long``.
    """
    total = len(prompt or "") + sum(len(m.content) for m in messages)
    total += sum(len(d.text) + len(d.title) for d in documents)
    if total > limit:
        raise RowError(
            "text_too_long",
            f"the prompt, messages and documents have {total} characters together, the limit is {limit}",
        )


def decode_granularity(value: Any) -> str:
    """``explain.granularity`` (absent: ``token``).

    Raises:
        RowError: ``invalid_option`` naming the granularities.
    """
    if value is None or value == "":
        return "token"
    if value not in GRANULARITIES:
        raise RowError(
            "invalid_option", f"'explain.granularity' must be one of {', '.join(GRANULARITIES)}, got {value!r}"
        )
    return str(value)


def decode_span(value: Any) -> tuple[int, int] | None:
    """``explain.span``: ``{"start": int, "end": int}``, character offsets into the answer (end exclusive).

    Raises:
        RowError: ``invalid_target`` for another shape (the range is checked against the answer when it is known).
    """
    if value is None:
        return None
    if isinstance(value, Mapping) and set(value) == {"start", "end"}:
        start, end = value["start"], value["end"]
        if all(isinstance(v, int) and not isinstance(v, bool) for v in (start, end)):
            return int(start), int(end)
    raise RowError(
        "invalid_target",
        f"'explain.span' must be {{'start': int, 'end': int}}, character offsets into the answer; got {value!r}",
    )


def messages_from_proto(request: Any) -> tuple[list[dict[str, str]], list[Any]]:
    """A ``GenerationRequest``'s messages and documents as the JSON request has them."""
    messages = [{"role": message.role, "content": message.content} for message in request.messages]
    documents: list[Any] = [
        {"title": document.title, "text": document.text} if document.title else document.text
        for document in request.documents
    ]
    return messages, documents
