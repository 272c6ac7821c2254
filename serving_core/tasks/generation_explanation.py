"""Explaining a batch's generation rows, once their answers are written.

Each row that asks is one member of a group: the library's planner (:func:`explainers.group_rows`) groups the rows by
method, options, target kind (steps, a sum of steps, or spans of the answer: its sentences or the span asked for),
whether foils contrast them, and deadline. Each group is one :func:`explainers.explain_continuation` or
:func:`explainers.explain_spans` (one forward for the group, one batched backward); a row's own steps, foils and
sentences are its share of the group's targets. Scores are then summed into the units the row asked for
(:mod:`~serving_core.tasks.generation_context`). A group whose deadline passes is abandoned between chunks of steps.

Before the groups run, each member is admitted for the targets its written answer really has (its sentences or
steps: :meth:`Member.targets`) by the caller's ``admit`` (the time budget,
:meth:`~serving_core.tasks.generation_admission.Admission.explanation`); a member refused there keeps its answer and
gets the refusal as its ``explanation_error``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from explainers import (
    Continuation,
    Deadline,
    ExplainError,
    GroupKey,
    InvalidTargetError,
    SpanExplanation,
    StepSum,
    TimeBudgetError,
    decoded_offsets,
    explain_continuation,
    explain_spans,
    group_rows,
    resolve_steps,
    span_steps,
)

from ..errors import RowError, from_explain_error
from .chat_schema import AnswerSpan
from .generation_context import PromptAttribution, RowContext, row_context, sentence_spans
from .generation_prompts import Prepared, explains_spans
from .generation_schema import SENTENCES, GenerationAsk, GenerationOutcome
from .generation_stopping import clipped
from .in_memory import InMemory

logger = logging.getLogger(__name__)


@dataclass
class Member:
    """A row's share of its explanation group.

    Attributes:
        position: the row's position among the prepared rows.
        steps: its steps (indices, or a sum); ``None`` for spans.
        foils: its foil ids, if any.
        context: its context units.
        spans: its sentences (or the one span asked for), when it explains spans of its answer.
        mode: ``sentences`` or ``span``.
    """

    position: int
    steps: tuple[int, ...] | StepSum | None
    foils: list[int] | None
    context: RowContext
    spans: list[AnswerSpan] | None = None
    mode: str = ""

    def targets(self) -> tuple[int, str]:
        """The member's objectives (one per sentence, per step, one for a sum or a span) and their description."""
        if self.spans is not None:
            count = len(self.spans)
            return count, f"{count} sentence{'s' if count != 1 else ''}" if self.mode == SENTENCES else "span"
        if isinstance(self.steps, StepSum):
            return 1, "summed steps"
        count = len(self.steps or ())
        return count, f"{count} step{'s' if count != 1 else ''}"

    def key(self, ask: GenerationAsk, deadline: Deadline | None) -> GroupKey:
        """The member's group key: its method and options (as asked), its target kind, its contrast, its deadline.

        Args:
            ask: the row's explanation request.
            deadline: the row's deadline.
        """
        if self.spans is not None:
            return GroupKey.of(ask.method, ask.options, "spans", contrast=self.foils is not None, deadline=deadline)
        if isinstance(self.steps, StepSum):
            summed = (self.steps.start, self.steps.stop)
            return GroupKey.of(
                ask.method, ask.options, "sum", summed=summed, contrast=self.foils is not None, deadline=deadline
            )
        return GroupKey.of(ask.method, ask.options, "steps", contrast=self.foils is not None, deadline=deadline)


class Explanations:
    """Explains the written answers of one causal LM's batches."""

    def __init__(self, model: nn.Module, tokenizer: Any) -> None:
        """Explain with ``model``, decoding with ``tokenizer``.

        Args:
            model: the causal LM.
            tokenizer: its tokenizer.
        """
        self.model = model
        self.tokenizer = tokenizer

    def explain(
        self,
        prepared: Sequence[Prepared],
        made: Continuation,
        outcomes: list[GenerationOutcome],
        admit: Callable[[Prepared, int, str, int], None] | None = None,
    ) -> tuple[float, float]:
        """Explain the rows that ask, one group per key (module docstring), into their outcomes.

        Args:
            prepared: the batch's admitted rows.
            made: their continuations, one row each, in order.
            outcomes: the batch's outcomes, by row index (their answers filled).
            admit: ``admit(item, targets, what, length)`` admits a row for its answer's actual targets
                (:meth:`Member.targets`) at ``length`` tokens (prompt and answer), raising
                :class:`~explainers.TimeBudgetError` when they do not fit (``None``: every row is admitted).

        Returns:
            The forward and backward seconds, summed over the groups.
        """
        members: dict[int, Member] = {}
        keys: dict[int, GroupKey] = {}
        for position, item in enumerate(prepared):
            ask = item.row.ask
            if ask is None or outcomes[item.index].error is not None:
                continue
            try:
                member = self.member(position, item, ask, made, len(outcomes[item.index].text))
            except ExplainError as error:
                outcomes[item.index].error = from_explain_error(error)
                continue
            if admit is not None:
                try:
                    admit(item, *member.targets(), len(item.prompt_ids) + int(made.token_mask[position].sum()))
                except TimeBudgetError as error:  # the answer stands; its explanation does not fit
                    outcomes[item.index].method = ask.method
                    outcomes[item.index].explanation_error = from_explain_error(error)
                    continue
            members[position] = member
            keys[position] = member.key(ask, item.row.deadline)
        forward = backward = 0.0
        for group in group_rows(keys):
            key, positions = group.key, list(group.rows)
            assert key.method is not None
            grouped = [members[position] for position in positions]
            subset = made.rows(positions)
            try:
                if key.target == "spans":
                    result: Any = self._explain_spans(subset, grouped, key)
                else:
                    result = self._explain_steps(subset, grouped, key)
            except ExplainError as error:
                for position in positions:
                    outcomes[prepared[position].index].error = from_explain_error(error)
                continue
            except Exception:
                logger.exception("explaining a group of %d generation rows failed", len(positions))
                for position in positions:
                    outcomes[prepared[position].index].error = RowError(
                        "internal", "the batch failed on the server; see the server log"
                    )
                continue
            timings = result.seconds if result is not None else {}
            forward += float(timings.get("forward", 0.0))
            backward += float(timings.get("backward", 0.0))
            seconds = float(timings.get("attribution", 0.0))
            for offset, member in enumerate(grouped):
                outcome = outcomes[prepared[member.position].index]
                self._fill(outcome, key.method, result, offset, member, seconds)
        return forward, backward

    def member(self, position: int, item: Prepared, ask: GenerationAsk, made: Continuation, length: int) -> Member:
        """A row's share of its group: its steps or spans, foils, and its context units.

        Args:
            position: the row's position among the prepared rows (and in ``made``).
            item: the row.
            ask: its explanation request.
            made: the batch's continuations.
            length: the characters of the row's answer text (fewer than its tokens decode to when a stop sequence cut
                it).

        Raises:
            ExplainError: for steps, foils or a span that do not fit the row's answer.
        """
        row_steps = int(made.token_mask[position].sum())
        ids = made.tokens[position, :row_steps].tolist()
        answer, offsets = clipped(*decoded_offsets(self.tokenizer, ids), length)
        context = row_context(
            item.rendered,
            self._texts(item.prompt_ids),
            answer,
            offsets,
            self._texts(ids),
            ask.granularity,
            len(item.row.documents),
        )
        if explains_spans(ask, item.row):
            if ask.span is None:
                return Member(position, None, None, context, sentence_spans(answer, offsets), SENTENCES)
            start, end = ask.span
            steps = span_steps(answer, offsets, start, end)
            return Member(position, None, None, context, [AnswerSpan(answer[start:end], start, end, steps)], "span")
        resolved = resolve_steps(ask.steps if not isinstance(ask.steps, str) else None, row_steps)
        foils = item.foils
        if foils is not None and len(foils) not in (1, row_steps):
            raise InvalidTargetError(
                f"contrast has {len(foils)} foils for {row_steps} steps: give one for every step or one each"
            )
        return Member(position, resolved, foils, context)

    def _texts(self, ids: Sequence[int]) -> list[str]:
        """Each token decoded on its own (a unit's text where the token has no character offsets: a BOS, an EOS, or
        every token of a slow tokenizer), never a ``Ġ``/``▁`` piece."""
        return [str(self.tokenizer.decode([token])) for token in ids]

    def _explain_spans(self, subset: Continuation, members: Sequence[Member], key: GroupKey) -> SpanExplanation | None:
        """One forward for every span of the group's rows (``None`` when no row has a sentence to explain)."""
        spans = [[span.steps for span in member.spans or []] for member in members]
        if not any(spans):
            return None
        assert key.method is not None
        options = dict(key.options)
        return explain_spans(self.model, subset, spans, method=key.method, options=options, deadline=key.deadline)

    def _explain_steps(self, subset: Continuation, members: Sequence[Member], key: GroupKey) -> Any:
        """One forward for the group's steps (or sums), the rows' own steps and foils as ``wanted`` and foil ids."""
        total = subset.steps
        device = subset.tokens.device
        wanted = torch.zeros((len(members), total), dtype=torch.bool, device=device)
        foil_ids = torch.full((len(members), total), -1, dtype=torch.long, device=device)
        for offset, member in enumerate(members):
            if isinstance(member.steps, StepSum):
                wanted[offset] = True
            else:
                wanted[offset, list(member.steps or ())] = True
            if member.foils is not None:
                count = int(subset.token_mask[offset].sum())
                repeated = member.foils * (count if len(member.foils) == 1 else 1)
                foil_ids[offset, :count] = torch.tensor(repeated[:count], device=device)
        summed = StepSum(*key.summed) if key.summed is not None else None
        assert key.method is not None
        return explain_continuation(
            self.model,
            subset,
            method=key.method,
            steps=summed,
            contrast=foil_ids if key.contrast else None,
            options=dict(key.options),
            wanted=wanted,
            deadline=key.deadline,
        )

    def _fill(
        self, outcome: GenerationOutcome, method: str, result: Any, offset: int, member: Member, seconds: float
    ) -> None:
        """A member's explanation, summed into its units, into its outcome (or its error, for scores not finite);
        in sentences, its scores over the tokens are kept in memory beside them
        (:attr:`GenerationOutcome.token_scores`)."""
        if result is not None and not bool(torch.isfinite(result.scores[offset].float()).all()):
            outcome.error = RowError(
                "attribution_failed", f"method {result.method!r} gave NaN or infinite scores for this row"
            )
            return
        context = member.context
        outcome.method = method if result is None else result.method
        outcome.options = {} if result is None else dict(result.options)
        outcome.attribution_seconds = seconds
        outcome.granularity = context.granularity
        outcome.context = list(context.described)
        kept: list[torch.Tensor] | None = None  # sentences: the token scores, for the monitor's words
        if context.granularity == "sentence" and context.rendered is not None:
            attribution = PromptAttribution(context.rendered, context.pieces)
            outcome.token_scores, kept = InMemory(attribution), attribution.scores
        if member.spans is not None:
            for index, span in enumerate(member.spans):
                token_scores = result.context_scores(offset, index).float().cpu()
                if kept is not None:
                    kept.append(token_scores)
                span.scores = context.scores(token_scores)
                span.value = float(result.values[offset, index])
                span.documents = context.cite(token_scores) if context.documents else None
            if member.mode == SENTENCES:
                outcome.sentences = member.spans
            else:
                outcome.span = member.spans[0]
            return
        steps = member.steps
        if isinstance(steps, StepSum):
            start, stop = steps.span(int(result.generated_mask[offset].sum()))
            outcome.summed = (start, stop)
            token_scores = result.context_scores(offset, 0).float().cpu()
            if kept is not None:
                kept.append(token_scores)
            outcome.sum_scores = context.scores(token_scores)
            outcome.sum_value = float(result.values[offset, 0])
            return
        for step in steps or ():
            entry = outcome.steps[step]
            entry.explained = True
            token_scores = result.context_scores(offset, step).float().cpu()
            if kept is not None:
                kept.append(token_scores)
            entry.scores = context.scores(token_scores)
            entry.value = float(result.values[offset, step])
            if result.contrast is not None and int(result.contrast[offset, step]) >= 0:
                entry.foil_id = int(result.contrast[offset, step])
                entry.foil = str(self.tokenizer.convert_ids_to_tokens(entry.foil_id))
