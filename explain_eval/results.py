"""The results the faithfulness evaluations share, below every evaluation and every command.

- :class:`GenerationFaithfulness`, the drop table of ``explain-eval --generation`` in each of its views (the token and
  word views of :mod:`explain_eval.generation`, the document view of :mod:`explain_eval.documents`), and how its
  per-prompt drops are summarised (:func:`summarise`, :func:`summary_table`);
- :data:`RANDOM`, the name of the seeded random ranking every evaluation compares against;
- the statistics of the tables (:func:`mean_or_nan`, :func:`mean_and_stderr`, :func:`finite_or_lowest`), which
  ``bench/`` uses too.

It imports nothing of the project, so every evaluation module, and the benchmarks, may import it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: The seeded random ranking, the reference of every faithfulness table.
RANDOM = "random"
#: How the token view removes tokens (the default of :attr:`GenerationFaithfulness.removal`).
REMOVAL = (
    "the step's k highest-scored prompt tokens deleted (the rest of the prompt packed, positions from 0), the "
    "continuation before the step kept; teacher-forced"
)


def mean_or_nan(values: Sequence[float]) -> float:
    """The mean of ``values``, NaN for no value."""
    return statistics.fmean(values) if values else math.nan


def mean_and_stderr(values: Sequence[float]) -> tuple[float, float]:
    """The mean and its standard error (sample standard deviation / sqrt(n)); the mean is NaN for no value, the error
    for fewer than two."""
    stderr = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else math.nan
    return mean_or_nan(values), stderr


def finite_or_lowest(value: float) -> float:
    """``value``, or ``-inf`` where it is NaN or infinite: a sort key that ranks undefined numbers last when sorting
    from the highest."""
    return value if math.isfinite(value) else -math.inf


@dataclass
class GenerationFaithfulness:
    """Drops of the step tokens' log-probability, per method and ``k``.

    Attributes:
        model: name shown in the table.
        prompts: the prompts evaluated.
        continuations: each prompt's greedy continuation (decoded).
        new_tokens: ``T``, the most tokens generated per prompt.
        steps: the generated steps, all prompts together.
        ks: how many prompt tokens each step loses.
        mean_log_probability: the steps' mean unperturbed log-probability.
        drops: ``drops[method][str(k)]`` = ``{"mean", "stderr", "vs_random", "vs_random_stderr", "steps", "prompts"}``.
        seconds: ``seconds[method]`` the explanation's wall time (all prompts, one call), ``seconds["generate"]``.
        removal: how tokens are removed (:data:`REMOVAL`, :data:`explain_eval.generation.WORD_REMOVAL`, or
            :data:`explain_eval.documents.DOCUMENT_REMOVAL`).
        view: ``token``, ``word`` (``k`` counts words) or ``document`` (``k`` documents, per sentence:
            :mod:`explain_eval.documents`).
    """

    model: str
    prompts: list[str]
    continuations: list[str]
    new_tokens: int
    steps: int
    ks: list[int]
    mean_log_probability: float
    drops: dict[str, dict[str, dict[str, float]]]
    seconds: dict[str, float] = field(default_factory=dict)
    removal: str = REMOVAL
    view: str = "token"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "view": self.view,
            "model": self.model,
            "prompts": self.prompts,
            "continuations": self.continuations,
            "new_tokens": self.new_tokens,
            "steps": self.steps,
            "ks": self.ks,
            "mean_log_probability": self.mean_log_probability,
            "drops": self.drops,
            "seconds": self.seconds,
            "removal": self.removal,
        }


def summarise(
    drops: Mapping[int, Sequence[float]], reference: Mapping[int, Sequence[float]] | None
) -> dict[str, float]:
    """Mean ± standard error over prompts of the per-prompt mean drop (and of the paired difference to the
    reference's drops of the same steps). ``drops[row]`` are a prompt's steps, in the same order as ``reference``."""
    rows = [row for row, values in drops.items() if values]
    means = [statistics.fmean(drops[row]) for row in rows]
    mean, stderr = mean_and_stderr(means)
    summary = {"mean": mean, "stderr": stderr, "steps": sum(len(drops[row]) for row in rows)}
    summary["prompts"] = len(rows)
    if reference is not None:
        paired = [statistics.fmean(a - b for a, b in zip(drops[row], reference[row], strict=True)) for row in rows]
        summary["vs_random"], summary["vs_random_stderr"] = mean_and_stderr(paired)
    return summary


def summary_table(
    per_method: Mapping[str, Mapping[int, Mapping[int, Sequence[float]]]], ks: Sequence[int]
) -> dict[str, dict[str, dict[str, float]]]:
    """Each method's :func:`summarise` at each ``k``, paired with the ``random`` ranking's drops where it ran."""
    reference = per_method.get(RANDOM)
    return {
        method: {
            str(k): summarise(drops[k], None if method == RANDOM or reference is None else reference[k]) for k in ks
        }
        for method, drops in per_method.items()
    }
