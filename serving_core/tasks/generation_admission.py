"""Admitting a batch's generation rows against the model's time budget (docs/SERVING.md, "Time budgets and
deadlines"): once before anything is written, and once more for each explanation when its answer is written.

Before writing, each row is estimated (:mod:`explainers.timing`'s public functions) for writing its
``max_new_tokens`` (or reading its given continuation) and, if it asks, explaining its targets at the length of prompt
and answer: first at their bound (the steps asked for; every step, at most ``max_new_tokens``; a sentence per step at
most; one for a sum or a span), and where that is over the budget at the least an explanation of the row can cost
(one target: a step, a sentence), since an answer's sentences and steps are only known once it is written. The rows
that only generate are counted first, then the rows that ask for an explanation, each in order; a row over the
budget, alone or beside the rows admitted before it, is refused with ``over_time_budget``, and a row whose deadline
has already passed with ``deadline_exceeded``.

Once the answers are written (:meth:`Admission.explanation`), each explanation is estimated for the targets its answer
really has (its sentences, its written steps) beside the actual seconds of the writing and the explanations admitted
before it; one that does not fit leaves its answer served with an explanation error (``over_time_budget``, saying
what fits) instead of refusing the row. One over what the writing left, alone, has the model probed again first, as a
row over the budget alone has before writing (:meth:`explainers.ServedSpeed.recheck`).

Each kind of work is admitted at the model's speed as the batches it served corrected it
(:class:`explainers.ServedSpeed`): the writing, then each method; :meth:`Admission.written` and
:meth:`Admission.explained` hand the actual seconds back to it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from explainers import (
    Architecture,
    BatchLedger,
    Continuation,
    ExplainError,
    ServedSpeed,
    StepSum,
    TimeBudgetError,
    check_explanation_budget,
    check_generation_budget,
    check_time_budget,
    generation_seconds,
    get_method,
    prediction_seconds,
    work_kind,
)

from ..errors import from_explain_error
from .generation_prompts import Prepared
from .generation_schema import GenerationOutcome


@dataclass
class Admission:
    """The time budget a batch's rows are admitted against, and what the batch was admitted for.

    Attributes:
        budget: the budget in seconds (``None``: every row is admitted).
        served: the model's speed, corrected by its served batches (``None``: not measured, every row is admitted).
        arch: the model's architecture (to resolve a method's options).
        alternatives: the methods that work on the model (named in a refusal).
        writing_s: the seconds the batch's writing took (:meth:`written`; the explanations are admitted beside it).
    """

    budget: float | None
    served: ServedSpeed | None
    arch: Architecture
    alternatives: Sequence[str]
    writing: BatchLedger | None = field(init=False, default=None)
    explaining: BatchLedger | None = field(init=False, default=None)
    spent: float = field(init=False, default=0.0)
    writing_s: float = field(init=False, default=0.0)

    def __post_init__(self) -> None:
        if self.budget is not None and self.served is not None:
            self.writing, self.explaining = self.served.ledger(), self.served.ledger()

    def admitted(self, prepared: Sequence[Prepared], outcomes: Sequence[GenerationOutcome]) -> list[Prepared]:
        """The rows admitted, in order (module docstring); each refused row's outcome gets its error.

        Args:
            prepared: the batch's valid rows.
            outcomes: the batch's outcomes, by row index.
        """
        admitted: list[Prepared] = []
        seconds = 0.0
        for item in sorted(prepared, key=lambda item: item.row.ask is not None):  # a stable sort: order kept
            deadline = item.row.deadline
            if deadline is not None and deadline.passed:
                outcomes[item.index].error = from_explain_error(deadline.exceeded("any work"))
                continue
            try:
                seconds += self.rechecked(item, seconds)
            except ExplainError as error:
                outcomes[item.index].error = from_explain_error(error)
                if item.row.ask is not None:
                    outcomes[item.index].method = item.row.ask.method
                continue
            admitted.append(item)
        return sorted(admitted, key=lambda item: item.index)

    def rechecked(self, item: Prepared, admitted_s: float) -> float:
        """:meth:`estimate`, once more after the model is probed again when the row is over the budget alone
        (:meth:`explainers.ServedSpeed.recheck`: only while no served batch has corrected the probe)."""
        try:
            return self.estimate(item, admitted_s)
        except TimeBudgetError as error:
            if error.beside or self.served is None or not self.served.recheck(self.kind(item)):
                raise
            return self.estimate(item, admitted_s)

    def kind(self, item: Prepared) -> str:
        """The kind of work that decides a row's admission: its method with its options, or the writing."""
        ask = item.row.ask
        if ask is None:
            return ServedSpeed.GENERATE
        method = get_method(ask.method)
        return work_kind(method.name, method.resolve_options(ask.options, self.arch))

    def estimate(self, item: Prepared, admitted_s: float) -> float:
        """A row's estimated seconds (0 without a budget): writing its tokens, then explaining its targets (at their
        bound, else at one target: module docstring).

        Args:
            item: the row.
            admitted_s: the estimated seconds of the rows admitted before it.

        Raises:
            TimeBudgetError: when it does not fit beside ``admitted_s`` seconds of the rows admitted before it (the
                refusal names the estimate at the targets' bound).
        """
        budget, writing_ledger, explaining = self.budget, self.writing, self.explaining
        if budget is None or writing_ledger is None or explaining is None:
            return 0.0
        row = item.row
        prompt = len(item.prompt_ids)
        new_tokens = len(item.continuation_ids) if item.continuation_ids is not None else row.max_new_tokens
        length = prompt + new_tokens
        speed = writing_ledger.speed(ServedSpeed.GENERATE, length)
        if item.continuation_ids is not None:
            writing = prediction_seconds(speed, length)
        else:
            writing = generation_seconds(speed, prompt, new_tokens)
        ask = row.ask
        if ask is None:
            if item.continuation_ids is None:
                writing = check_generation_budget(speed, prompt, new_tokens, budget, admitted_s)
            return writing
        method = get_method(ask.method)
        options = method.resolve_options(ask.options, self.arch)
        if isinstance(ask.steps, StepSum) or ask.span is not None:
            bound = 1  # one summed objective: the steps' sum, or the span asked for
        elif isinstance(ask.steps, tuple):
            bound = len(ask.steps)
        else:
            bound = max(new_tokens, 1)  # every step, or a sentence per step at most

        def check(targets: int) -> float:
            return check_time_budget(
                explaining.speed(work_kind(method.name, options), length), method, length, options, budget,
                self.alternatives, admitted_s, targets=targets, generate_s=writing,
            )  # fmt: skip

        try:
            return check(bound)
        except TimeBudgetError as error:
            if bound == 1 or item.continuation_ids is not None:
                raise  # the targets of a given continuation are known now: no less to hope for
            refusal = error
        try:
            return check(1)  # the least its explanation can cost; admitted again once the answer is written
        except TimeBudgetError:
            raise refusal from None

    def written(self, prepared: Sequence[Prepared], made: Continuation, seconds: float) -> None:
        """The batch's answers were written in ``seconds``: counted against the budget of its explanations, and a
        measure of the model's writing speed (its rows estimated for the tokens they wrote).

        Args:
            prepared: the admitted rows.
            made: their continuations, in order.
            seconds: the seconds the generation took (0: no row generated).
        """
        self.spent = self.writing_s = seconds
        if self.served is None or seconds <= 0:
            return
        measured = self.served.ledger()
        for position, item in enumerate(prepared):
            if not item.row.given:
                prompt, steps = len(item.prompt_ids), int(made.token_mask[position].sum())
                speed = measured.speed(ServedSpeed.GENERATE, prompt + steps)
                measured.add(ServedSpeed.GENERATE, generation_seconds(speed, prompt, steps), prompt + steps)
        measured.settle(seconds)

    def explanation(self, item: Prepared, targets: int, what: str, length: int) -> None:
        """Admit a written answer's explanation for its actual targets, beside the writing's actual seconds and the
        explanations admitted before it.

        Args:
            item: the row (it asks for an explanation).
            targets: the answer's actual targets (sentences, steps; 0: nothing to explain, admitted).
            what: the targets in words (``3 sentences``), for the refusal.
            length: the tokens of prompt and answer.

        Raises:
            TimeBudgetError: naming the estimate, what is left of the budget and what fits.
        """
        budget, explaining, ask = self.budget, self.explaining, item.row.ask
        if budget is None or explaining is None or ask is None or targets <= 0:
            return
        chosen = get_method(ask.method)
        resolved = chosen.resolve_options(ask.options, self.arch)
        kind = work_kind(chosen.name, resolved)

        def check() -> float:
            return check_explanation_budget(
                explaining.speed(kind, length), chosen, length, resolved, budget, self.spent, targets, what,
                self.alternatives,
            )  # fmt: skip

        try:
            seconds = check()
        except TimeBudgetError:
            # over what the writing left, alone: the model is probed again as before writing (a probe measured
            # while the machine was busy would else refuse such explanations until a batch of the kind corrects it)
            alone = self.spent <= self.writing_s
            if not alone or self.served is None or not self.served.recheck(kind):
                raise
            seconds = check()
        explaining.add(kind, seconds, length)
        self.spent += seconds

    def explained(self, seconds: float) -> None:
        """The admitted explanations ran in ``seconds``: a measure of the model's speed at them."""
        if self.explaining is not None and self.explaining.estimated > 0:
            self.explaining.settle(seconds)
