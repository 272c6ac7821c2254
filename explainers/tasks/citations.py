"""Which parts of the prompt each sentence of a generated answer rests on: spans of steps explained as summed
objectives, many per row, from one forward (:func:`explain_spans`), and the documents ranked by them (citations).

A sentence of the answer is a span of steps ``[start, stop)``; its objective is the summed log-probability of its
tokens (what :class:`~explainers.tasks.generation.StepSum` explains for one span). Every sentence of every row is one
target of the many-target core (:func:`explainers.explain_targets`): round ``k`` holds each row's ``k``-th span, so
the map methods read all of them from the one forward and the gradient methods take one batched vector-Jacobian
product per round. A span explained here gives the numbers ``StepSum(start, stop)`` gives alone: the same terms, the
same readout (the mean of the span's rows) and the same visible positions (everything before its last step).

:func:`answer_sentences` splits the answer into sentences (the rule of :mod:`explainers.units`) and maps each to its
steps; :func:`cite` ranks documents by a span's summed scores over each document's tokens.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from ..chat import RenderedPrompt
from ..deadline import Deadline
from ..defaults import DEFAULT_METHOD
from ..errors import InvalidTargetError
from ..units import token_units
from .targets import Targets, explain_targets

if TYPE_CHECKING:
    from ..methods.registry import OptionValue
    from .continuation import Continuation

Spans = Sequence[Sequence[tuple[int, int]]]
"""Per row, its spans of steps ``(start, stop)`` (``stop`` exclusive)."""


@dataclass(frozen=True)
class SpanExplanation:
    """The result of :func:`explain_spans`.

    Attributes:
        method: the registry name of the method.
        options: the method options used, defaults filled in.
        spans: per row, the spans explained.
        sequences: ``(batch, P + T)`` the prompts and continuations (as :attr:`Continuation.sequences`).
        attention_mask: ``(batch, P + T)`` 1 at real tokens.
        prompt_length: ``P``.
        scores: ``(batch, K, P + T)`` per span its attribution over the sequence (``K``: the most spans of a row),
            exactly 0 at padding, at and after the span's last step, and for the spans a row does not have.
        values: ``(batch, K)`` each span's summed log-probability (0 where a row has no ``k``-th span).
        seconds: wall time of the stages (``forward``, ``backward``, ``attribution``).
    """

    method: str
    options: Mapping[str, OptionValue]
    spans: tuple[tuple[tuple[int, int], ...], ...]
    sequences: Tensor
    attention_mask: Tensor
    prompt_length: int
    scores: Tensor
    values: Tensor
    seconds: Mapping[str, float]

    def context_scores(self, row: int, span: int) -> Tensor:
        """Span ``span`` of row ``row``: its scores over the real tokens of its context (the prompt and the steps
        before its last), padding removed — what ``StepSum(start, stop)`` explained alone gives.

        Args:
            row: the batch row.
            span: the span's index among the row's :attr:`spans`.
        """
        _, stop = self.spans[row][span]
        mask = self.attention_mask[row].bool().clone()
        mask[self.prompt_length + stop - 1 :] = False
        return self.scores[row, span][mask]


def check_spans(spans: Spans, made: Continuation) -> tuple[tuple[tuple[int, int], ...], ...]:
    """``spans`` checked against the rows' steps.

    Raises:
        InvalidTargetError: for another number of rows, or a span that is empty or not within its row's steps.
    """
    batch = made.tokens.shape[0]
    if len(spans) != batch:
        raise InvalidTargetError(f"got spans for {len(spans)} rows, expected one list per row ({batch})")
    checked = []
    for row, row_spans in enumerate(spans):
        steps = int(made.token_mask[row].sum())
        for start, stop in row_spans:
            if not (isinstance(start, int) and isinstance(stop, int) and 0 <= start < stop <= steps):
                raise InvalidTargetError(
                    f"span ({start}, {stop}) of row {row} must satisfy 0 <= start < stop <= {steps} (its steps)"
                )
        checked.append(tuple((int(start), int(stop)) for start, stop in row_spans))
    return tuple(checked)


def span_targets(made: Continuation, spans: Spans) -> Targets:
    """Round ``k`` = each row's ``k``-th span: the summed log-probability of the span's tokens, read (for the map
    methods) as the mean of the rows of the positions that predict them, seeing every real position before its last
    step. Rows with fewer spans are inactive in the later rounds.

    Raises:
        InvalidTargetError: for spans that do not fit the rows (:func:`check_spans`).
    """
    checked = check_spans(spans, made)
    batch, _ = made.tokens.shape
    width = made.prompt_width
    length = width + made.steps
    rounds = max((len(row) for row in checked), default=0)
    terms = max((stop - start for row in checked for start, stop in row), default=1)
    positions = torch.zeros((rounds, batch, terms), dtype=torch.long)
    labels = torch.zeros((rounds, batch, terms), dtype=torch.long)
    weights = torch.zeros((rounds, batch, terms), dtype=torch.float64)
    readout = torch.zeros((rounds, batch, length), dtype=torch.float64)
    visible = torch.zeros((rounds, batch, length), dtype=torch.bool)
    active = torch.zeros((rounds, batch), dtype=torch.bool)
    tokens = made.tokens.cpu()
    mask = made.forward_mask.bool().cpu()
    for row, row_spans in enumerate(checked):
        for index, (start, stop) in enumerate(row_spans):
            size = stop - start
            steps = torch.arange(start, stop)
            positions[index, row, :size] = width - 1 + steps
            labels[index, row, :size] = tokens[row, steps]
            weights[index, row, :size] = 1.0
            readout[index, row, width - 1 + steps] = 1.0 / size
            visible[index, row, : width - 1 + stop] = mask[row, : width - 1 + stop]
            active[index, row] = True
    device = made.tokens.device
    return Targets(
        positions.to(device),
        labels.to(device),
        weights.to(device),
        readout.to(device),
        visible.to(device),
        active.to(device),
        log_probabilities=True,
    )


def explain_spans(
    model: nn.Module,
    made: Continuation,
    spans: Spans,
    *,
    method: str = DEFAULT_METHOD,
    options: Mapping[str, Any] | None = None,
    deadline: Deadline | None = None,
) -> SpanExplanation:
    """Explain every span of every row (each the summed log-probability of its steps' tokens) with one forward.

    Args:
        model: the causal LM (a supported decoder family); left exactly as it was found.
        made: the prompts and their continuations.
        spans: per row, its spans of steps ``(start, stop)``.
        method: one of :func:`explainers.available_methods` that the family supports; default
            :data:`~explainers.DEFAULT_METHOD` (``attnlrp``).
        options: the method's options.
        deadline: when the answer is due (``None``: none; :func:`~explainers.tasks.targets.explain_targets`).

    Raises:
        ExplainError: for a refused method, bad options or spans (:class:`InvalidTargetError`);
            :class:`~explainers.deadline.DeadlineExceededError` once ``deadline`` has passed.
    """
    targets = span_targets(made, spans)
    inputs = {"input_ids": made.sequences, "attention_mask": made.forward_mask}
    explained = explain_targets(model, inputs, targets, method=method, deadline=deadline, **dict(options or {}))
    return SpanExplanation(
        method=explained.method,
        options=dict(explained.options),
        spans=check_spans(spans, made),
        sequences=made.sequences,
        attention_mask=made.sequence_mask,
        prompt_length=made.prompt_width,
        scores=explained.scores.permute(1, 0, 2),
        values=explained.values.permute(1, 0),
        seconds=dict(explained.seconds),
    )


@dataclass(frozen=True)
class Sentence:
    """A sentence of a generated answer: its characters in the answer text and its steps.

    Attributes:
        start: its first character in the answer text.
        end: one past its last character.
        steps: ``(start, stop)``, the steps of its tokens (``stop`` exclusive).
    """

    start: int
    end: int
    steps: tuple[int, int]


def answer_sentences(text: str, offsets: Sequence[tuple[int, int] | None]) -> list[Sentence]:
    """The sentences of a generated answer (the rule of :func:`explainers.units.sentence_spans`), each with the steps
    of its tokens; the white space between sentences goes with the sentence after it (at the end, the one before).
    Tokens without characters (an EOS, a special token the answer text skips) are in no sentence.

    Args:
        text: the answer text.
        offsets: each generated token's characters in ``text`` (``None``: no characters).
    """
    sentences = []
    for unit in token_units(text, offsets, "sentence"):
        if unit.start is None or unit.end is None or unit.start == unit.end:
            continue
        sentences.append(Sentence(unit.start, unit.end, (unit.first, unit.stop)))
    return sentences


def span_steps(text: str, offsets: Sequence[tuple[int, int] | None], start: int, end: int) -> tuple[int, int]:
    """The steps ``(first, stop)`` whose characters overlap ``[start, end)`` of the answer text.

    Args:
        text: the answer text.
        offsets: each generated token's characters in ``text`` (``None``: no characters), as
            :func:`decoded_offsets` gives them.
        start: the span's first character.
        end: one past its last character.

    Raises:
        InvalidTargetError: if the span is empty, outside ``[0, len(text)]`` or covers no token's characters.
    """
    if not (isinstance(start, int) and isinstance(end, int)) or not 0 <= start < end <= len(text):
        raise InvalidTargetError(
            f"a span of the answer must satisfy 0 <= start < end <= {len(text)} (the answer's characters), got "
            f"start={start}, end={end}"
        )
    covered = [
        index for index, offset in enumerate(offsets) if offset is not None and offset[0] < end and start < offset[1]
    ]
    if not covered:
        raise InvalidTargetError(f"no generated token has characters in [{start}, {end})")
    return covered[0], covered[-1] + 1


def cite(scores: Tensor | Sequence[float], labels: Sequence[Hashable], documents: int) -> list[tuple[int, float]]:
    """The documents ranked by attribution: each document's score is the sum of ``scores`` over its tokens.

    Args:
        scores: one span's scores over its context tokens (a prefix of ``labels`` is enough).
        labels: per context token, ``("document", j)`` for a token of document ``j``, anything else otherwise.
        documents: how many documents there are (a document without tokens scores 0).

    Returns:
        ``(document, score)`` pairs, the highest score first (ties: the lower index first).
    """
    values = scores.tolist() if isinstance(scores, Tensor) else list(scores)
    totals = [0.0] * documents
    for value, label in zip(values, labels, strict=False):
        if isinstance(label, tuple) and len(label) == 2 and label[0] == "document":
            totals[int(label[1])] += float(value)
    return sorted(enumerate(totals), key=lambda item: (-item[1], item[0]))


@dataclass(frozen=True)
class Citations:
    """The result of :func:`explain_citations`: an answer's sentences and the documents each one rests on.

    Attributes:
        rendered: the rendered prompt (its text, tokens, offsets, and where each message and document landed).
        answer: the answer text.
        answer_ids: the answer's token ids.
        sentences: the answer's sentences (characters and steps).
        documents: per sentence, ``(document, score)`` ranked by score, highest first (:func:`cite`).
        explanation: the sentences' explanation (its scores over prompt + answer tokens, values, seconds).
    """

    rendered: RenderedPrompt
    answer: str
    answer_ids: tuple[int, ...]
    sentences: tuple[Sentence, ...]
    documents: tuple[tuple[tuple[int, float], ...], ...]
    explanation: SpanExplanation | None


def explain_citations(
    model: nn.Module,
    tokenizer: Any,
    messages: Sequence[Any] | None = None,
    documents: Sequence[Any] = (),
    *,
    prompt: str | None = None,
    answer: str | Sequence[int] | None = None,
    max_new_tokens: int = 64,
    method: str = DEFAULT_METHOD,
    chat_template: str | None = None,
    options: Mapping[str, Any] | None = None,
    deadline: Deadline | float | None = None,
) -> Citations:
    """Which documents each sentence of an answer rests on: the chat (or prompt) rendered with its documents
    (:func:`explainers.render_chat` / :func:`explainers.render_prompt`), the answer given or generated greedily, split
    into sentences, every sentence's summed log-probability explained from one forward (:func:`explain_spans`) and the
    documents ranked by the sum of each sentence's scores over their tokens (:func:`cite`).

    Args:
        model: the causal LM.
        tokenizer: its fast tokenizer.
        messages: chat messages (or give ``prompt``).
        documents: strings or ``{"title", "text"}``.
        prompt: a plain prompt instead of messages.
        answer: the answer, as text (tokenized without special tokens) or token ids; ``None``: generated (greedy,
            at most ``max_new_tokens``).
        max_new_tokens: the generation's budget when no answer is given.
        method: the attribution method (default :data:`~explainers.DEFAULT_METHOD`, ``attnlrp``).
        chat_template: a chat template instead of the tokenizer's.
        options: the method's options.
        deadline: abandon the work once this :class:`~explainers.deadline.Deadline` (or this many seconds from now)
            has passed: checked between generation steps and between chunks of the explanation.

    Raises:
        ExplainError: for bad messages, documents, method or options (see :func:`explainers.render_chat`);
            :class:`~explainers.deadline.DeadlineExceededError` once ``deadline`` has passed.
    """
    from ..chat import decoded_offsets, render_chat, render_prompt
    from .continuation import generate_continuation, given_continuation

    if (messages is None) == (prompt is None):
        raise InvalidTargetError("give messages or a prompt, not both")
    due = Deadline.of(deadline)
    if messages is not None:
        rendered = render_chat(tokenizer, messages, documents, chat_template=chat_template)
    else:
        rendered = render_prompt(tokenizer, prompt or "", documents)
    ids = torch.tensor([list(rendered.input_ids)])
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if answer is None:
        made = generate_continuation(model, inputs, max_new_tokens, deadline=due)
    else:
        given = tokenizer(answer, add_special_tokens=False)["input_ids"] if isinstance(answer, str) else list(answer)
        made = given_continuation(model, inputs, torch.tensor([given]))
    answer_ids = tuple(made.tokens[0][made.token_mask[0]].tolist())
    text, offsets = decoded_offsets(tokenizer, answer_ids)
    sentences = tuple(answer_sentences(text, offsets))
    explanation = None
    ranked: list[tuple[tuple[int, float], ...]] = []
    if sentences:
        explanation = explain_spans(
            model, made, [[s.steps for s in sentences]], method=method, options=options, deadline=due
        )
        labels = rendered.token_labels()
        count = len({field.index for field in rendered.fields if field.kind == "document"})
        for index in range(len(sentences)):
            ranked.append(tuple(cite(explanation.context_scores(0, index), labels, count)))
    return Citations(rendered, text, answer_ids, sentences, tuple(ranked), explanation)
