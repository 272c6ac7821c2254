"""The context of an explained generation row in the units a reader asked for: the rendered prompt's tokens grouped
into tokens, words or sentences (each saying which message or document it is in, or that the template added it),
then the answer's; scores summed over each unit's tokens; sentences and a span of the answer mapped to their steps;
and the documents each one rests on (citations).

A prompt token's message or document is decided by :mod:`explainers.units` (its first non-space character), over
the spans :func:`explainers.render_chat` located; a token outside every located span is a template token. The units
of the answer are over the answer text (their offsets are into it, ``generated: true``).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from explainers import RenderedPrompt, Unit, answer_sentences, cite, token_units, unit_scores

from .chat_schema import AnswerSpan, ContextUnit, PromptPart


@dataclass(frozen=True)
class RowContext:
    """A row's context units and what the scores over its tokens need.

    Attributes:
        units: the prompt's units, then the answer's (token indices over prompt + answer tokens).
        described: one :class:`ContextUnit` per unit.
        labels: per prompt token, its segment label (``("message", i)``, ``("document", j)``, ``("prompt", 0)``,
            ``None`` for the template), then ``None`` per answer token.
        documents: how many documents the row has.
        granularity: ``token``, ``word`` or ``sentence``.
        rendered: the rendered prompt the prompt's units were grouped over (``None``: not known).
        pieces: the prompt tokens' texts.
    """

    granularity: str
    units: tuple[Unit, ...]
    described: tuple[ContextUnit, ...]
    labels: tuple[Hashable, ...]
    documents: int
    rendered: RenderedPrompt | None = None
    pieces: Sequence[str] = ()

    def scores(self, token_scores: Tensor | Sequence[float]) -> list[float]:
        """Scores over the first context tokens summed into the units (those that start among them)."""
        return [float(value) for value in unit_scores(token_scores, self.units)]

    def cite(self, token_scores: Tensor | Sequence[float]) -> list[tuple[int, float]]:
        """The documents ranked by the sum of ``token_scores`` over their tokens."""
        return cite(token_scores, self.labels, self.documents)


@dataclass
class PromptAttribution:
    """A row's explanations over its tokens before they were summed into its units (a row answered in sentences,
    whose scores cannot be split into words): kept in memory on its outcome for the monitor, never answered.

    Attributes:
        rendered: the rendered prompt.
        pieces: the prompt tokens' texts.
        scores: each explanation's scores over its context's tokens (the prompt's, then the answer's before it), in
            the order the outcome was filled (its explained steps, its sum, its sentences or its span).
    """

    rendered: RenderedPrompt
    pieces: Sequence[str]
    scores: list[Tensor] = field(default_factory=list)

    def prompt_units(self, granularity: str) -> list[Unit]:
        """The prompt's units at ``granularity`` over its tokens, as a row asking for that granularity gets them."""
        return prompt_units(self.rendered, self.pieces, granularity)


def prompt_units(rendered: RenderedPrompt, pieces: Sequence[str], granularity: str) -> list[Unit]:
    """The rendered prompt's tokens grouped into units at ``granularity``, each labelled with its message, document or
    prompt (``None``: the template's), never across them.

    Args:
        rendered: the rendered prompt (its text, token offsets and located fields).
        pieces: the prompt tokens' texts (for the tokens without characters, e.g. ``<s>``).
        granularity: ``token``, ``word`` or ``sentence``.
    """
    return token_units(rendered.text, rendered.offsets, granularity, segments=rendered.segments(), pieces=pieces)


def row_context(
    rendered: RenderedPrompt,
    prompt_pieces: Sequence[str],
    answer: str,
    answer_offsets: Sequence[tuple[int, int] | None],
    answer_pieces: Sequence[str],
    granularity: str,
    documents: int,
) -> RowContext:
    """The context of a row at ``granularity``.

    Args:
        rendered: the rendered prompt (its text, token offsets and located fields).
        prompt_pieces: the prompt tokens' texts (for the tokens without characters, e.g. ``<s>``).
        answer: the answer text.
        answer_offsets: each answer token's characters in it (``None``: none, e.g. EOS).
        answer_pieces: the answer tokens' texts.
        granularity: ``token``, ``word`` or ``sentence``.
        documents: how many documents the row has.
    """
    prompt = prompt_units(rendered, prompt_pieces, granularity)
    shift = len(rendered.offsets)
    answer_units = token_units(answer, answer_offsets, granularity, pieces=answer_pieces)
    units = [*prompt]
    described = [_prompt_unit(unit) for unit in prompt]
    for unit in answer_units:
        units.append(Unit(unit.text, unit.start, unit.end, unit.first + shift, unit.stop + shift, "answer"))
        described.append(ContextUnit(unit.text, unit.start, unit.end, generated=True))
    labels: list[Hashable] = [None] * shift
    for unit in prompt:
        for index in unit.tokens:
            labels[index] = unit.label
    labels.extend([None] * len(answer_offsets))
    return RowContext(granularity, tuple(units), tuple(described), tuple(labels), documents, rendered, prompt_pieces)


def _prompt_unit(unit: Unit) -> ContextUnit:
    label: Any = unit.label
    kind, index = label if isinstance(label, tuple) else (None, None)
    return ContextUnit(
        unit.text,
        unit.start,
        unit.end,
        message=index if kind == "message" else None,
        document=index if kind == "document" else None,
        template=kind is None,
    )


def prompt_parts(rendered: RenderedPrompt, roles: Sequence[str] | None, documents: int) -> tuple[
    list[PromptPart] | None, list[PromptPart] | None
]:  # fmt: skip
    """Where each message and document landed (``None`` for a plain prompt, or no documents)."""
    located = {(field.kind, field.index, field.part): field for field in rendered.fields}
    messages = None
    if roles is not None:
        messages = []
        for index, role in enumerate(roles):
            field = located[("message", index, "content")]
            messages.append(PromptPart(role, field.start, field.end, found=field.found))
    parts = None
    if documents:
        parts = []
        for index in range(documents):
            text = located[("document", index, "text")]
            title = located.get(("document", index, "title"))
            parts.append(
                PromptPart(
                    None,
                    text.start,
                    text.end,
                    None if title is None else title.start,
                    None if title is None else title.end,
                    text.found,
                )
            )
    return messages, parts


def sentence_spans(answer: str, answer_offsets: Sequence[tuple[int, int] | None]) -> list[AnswerSpan]:
    """The answer's sentences, each with its steps (scores and citations filled in once explained)."""
    return [
        AnswerSpan(answer[sentence.start : sentence.end], sentence.start, sentence.end, sentence.steps)
        for sentence in answer_sentences(answer, answer_offsets)
    ]
