"""Admitting a batch's generation rows against the model's time budget (docs/SERVING.md, "Time budgets and
deadlines"), before anything is generated.

Each row is estimated (:mod:`explainers.timing`'s public functions) for writing its ``max_new_tokens`` (or reading its
given continuation) and, if it asks, explaining its steps (every step, at most ``max_new_tokens``; one for a sum or a
span; a sentence per step at most) at the length of prompt and answer. The rows that only generate are counted first,
then the rows that ask for an explanation, each in order; a row over the budget, alone or beside the rows admitted
before it, is refused with ``over_time_budget``, and a row whose deadline has already passed with
``deadline_exceeded``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from explainers import (
    Architecture,
    ExplainError,
    ModelSpeed,
    StepSum,
    check_generation_budget,
    check_time_budget,
    generation_seconds,
    get_method,
    prediction_seconds,
)

from ..errors import from_explain_error
from .generation_prompts import Prepared
from .generation_schema import GenerationOutcome


@dataclass(frozen=True)
class Admission:
    """The time budget a batch's rows are admitted against.

    Attributes:
        budget: the budget in seconds (``None``: every row is admitted).
        speed: the model's measured speed (``None``: not measured, every row is admitted).
        arch: the model's architecture (to resolve a method's options).
        alternatives: the methods that work on the model (named in a refusal).
    """

    budget: float | None
    speed: ModelSpeed | None
    arch: Architecture
    alternatives: Sequence[str]

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
                seconds += self.estimate(item, seconds)
            except ExplainError as error:
                outcomes[item.index].error = from_explain_error(error)
                if item.row.ask is not None:
                    outcomes[item.index].method = item.row.ask.method
                continue
            admitted.append(item)
        return sorted(admitted, key=lambda item: item.index)

    def estimate(self, item: Prepared, admitted_s: float) -> float:
        """A row's estimated seconds (0 without a budget): writing its tokens, then explaining its steps.

        Args:
            item: the row.
            admitted_s: the estimated seconds of the rows admitted before it.

        Raises:
            TimeBudgetError: when it does not fit beside ``admitted_s`` seconds of the rows admitted before it.
        """
        budget, speed = self.budget, self.speed
        if budget is None or speed is None:
            return 0.0
        row = item.row
        prompt = len(item.prompt_ids)
        if item.continuation_ids is not None:
            new_tokens = len(item.continuation_ids)
            writing = prediction_seconds(speed, prompt + new_tokens)
        else:
            new_tokens = row.max_new_tokens
            writing = generation_seconds(speed, prompt, new_tokens)
        ask = row.ask
        if ask is None:
            if item.continuation_ids is not None:
                return writing
            return check_generation_budget(speed, prompt, new_tokens, budget, admitted_s)
        method = get_method(ask.method)
        options = method.resolve_options(ask.options, self.arch)
        if isinstance(ask.steps, StepSum) or ask.span is not None:
            targets = 1  # one summed objective: the steps' sum, or the span asked for
        elif isinstance(ask.steps, tuple):
            targets = len(ask.steps)
        else:
            targets = max(new_tokens, 1)  # every step, or a sentence per step at most
        return check_time_budget(
            speed, method, prompt + new_tokens, options, budget, self.alternatives, admitted_s,
            targets=targets, generate_s=writing,
        )  # fmt: skip
