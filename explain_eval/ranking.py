"""``explain-eval --all``: one faithfulness table that ranks every registered method on every default model.

For each model (the default ``sentiment``, ``digits`` and ``entities`` builds and the demo ``writer``), each seed
draws ``n`` held-out examples, and each method that applies explains them; a seeded ``random`` ranking is the
reference. One target probability ``p`` per example is then measured under removals ordered by the explanation:

- Chefer et al.'s **positive / negative perturbation AUC** (MoRF / LeRF, 0-90% of the candidates removed;
  :mod:`explain_eval.faithfulness`), on ``p`` rather than accuracy (the token-level and generation targets have no
  gold label to be accurate against);
- **ABPC**, the area between those two curves (AttnLRP), ERASER's **comprehensiveness** and **sufficiency** over
  the bins 1, 5, 10, 20, 50% (:mod:`explain_eval.erasure`);
- the method's **cost**: wall seconds of its explanation per example, measured in the same run, on the same batches.

Each seed gives each metric's mean over its examples; the table gives the mean over seeds ± its standard error. A
seed draws the sample, the random ranking and the methods' own ``seed`` option (SmoothGrad's noise). A method that a
model's family or task refuses, or that refuses its inputs, is listed as ``n/a`` with the library's reason.

The targets and removals, per model (also written into the output):

- ``sentiment`` (text classifier): the predicted class; tokens replaced by ``[MASK]`` (length kept);
- ``digits`` (image classifier): the predicted class; patches set to 0 in the normalised pixels;
- ``entities`` (token classifier): the label predicted at the **first token of the first predicted entity** of the
  sentence (sentences without a predicted entity are not drawn), read at that token; tokens replaced by ``[MASK]``;
- ``writer`` (causal LM): the **greedy next token** after the prompt (:mod:`explain_eval.generation`'s first step),
  its probability teacher-forced after the prompt with tokens **deleted** (positions counted again).

The command's parts: this module, the protocol (:class:`Subject`, what a model under test provides, and
:func:`evaluate_subject`, which measures :data:`METRICS` on it); :mod:`explain_eval.ranking_subjects`, the four default
models as subjects; :mod:`explain_eval.ranking_report`, the tables and the output files (and ``--merge``);
:mod:`explain_eval.ranking_cli`, the command.

Example::

    explain-eval --all --n 100 --writer-n 12 --seeds 0,1,2 --out docs/faithfulness-all
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
from torch import Tensor

from .erasure import (
    ERASER_BINS,
    abpc,
    comprehensiveness_masks,
    curve_areas,
    erasure_score,
    sufficiency_masks,
)
from .faithfulness import FRACTIONS, removal_masks
from .results import RANDOM, mean_and_stderr

logger = logging.getLogger(__name__)

#: The metrics of the table, their column titles and whether higher is better.
METRICS: dict[str, tuple[str, bool]] = {
    "abpc": ("ABPC ↑", True),
    "positive_auc": ("positive AUC ↓", False),
    "negative_auc": ("negative AUC ↑", True),
    "comprehensiveness": ("comprehensiveness ↑", True),
    "sufficiency": ("sufficiency ↓", False),
}


class Subject:
    """One model under test: its held-out pool, its explanations and its target probability under removals.

    Subclasses (:mod:`explain_eval.ranking_subjects`) define the task; :func:`evaluate_subject` runs the same protocol
    on each.
    """

    name: str
    task: str
    target: str
    removal: str
    model_type: str
    registry_task: str

    def pool_size(self) -> int:
        """How many held-out examples can be drawn."""
        raise NotImplementedError

    def order(self, indices: list[int]) -> list[int]:
        """The drawn examples in the order they are batched (similar lengths together)."""
        return sorted(indices)

    def batch(self, indices: Sequence[int]) -> Any:
        """The model inputs of some drawn examples."""
        raise NotImplementedError

    def explain(self, batch: Any, method: str, options: Mapping[str, Any]) -> Tensor:
        """``(rows, positions)`` scores of the batch's targets (images: the patch grid flattened row-major)."""
        raise NotImplementedError

    def candidates(self, batch: Any) -> Tensor:
        """``(rows, positions)`` bool, the removable positions."""
        raise NotImplementedError

    def full_probability(self, batch: Any) -> Tensor:
        """``(rows,)`` the target probability of the unperturbed inputs."""
        raise NotImplementedError

    def removed_probability(self, batch: Any, rows: Tensor, removed: Tensor) -> Tensor:
        """``(k,)`` the target probability of example ``rows[i]`` of the batch after the removal ``removed[i]``
        (``rows``: ``(k,)`` long; ``removed``: ``(k, positions)`` bool)."""
        raise NotImplementedError

    def refusal(self, method: str) -> str | None:
        """Why the model's family or task refuses ``method`` (``None``: it applies)."""
        from explainers.architectures.support import refusal

        return refusal(self.model_type, method, self.registry_task)


@dataclass
class MethodResult:
    """One method on one model: each seed's metric means and cost, or why it does not apply."""

    per_seed: dict[str, list[float]] = field(default_factory=lambda: {metric: [] for metric in METRICS})
    seconds_per_example: list[float] = field(default_factory=list)
    not_applicable: str | None = None

    def summary(self) -> dict[str, Any]:
        """JSON-ready: per metric ``{"mean", "stderr", "per_seed"}``, the cost, or ``not_applicable``."""
        if self.not_applicable is not None:
            return {"not_applicable": self.not_applicable}
        document: dict[str, Any] = {}
        for metric, values in self.per_seed.items():
            mean, stderr = mean_and_stderr(values)
            document[metric] = {"mean": mean, "stderr": stderr, "per_seed": values}
        mean, stderr = mean_and_stderr(self.seconds_per_example)
        document["seconds_per_example"] = {"mean": mean, "stderr": stderr, "per_seed": self.seconds_per_example}
        return document


def batch_metrics(
    scores: Tensor, candidates: Tensor, full: Tensor, removed: Callable[[Tensor, Tensor], Tensor]
) -> dict[str, Tensor]:
    """Every metric of one batch under one ranking, per example, from one call of ``removed``.

    The removals of the four tests overlap (ERASER's top k is a MoRF step; keeping only the top k is a LeRF step;
    short inputs repeat counts): each distinct removal of an example is asked for once, and removing nothing is the
    unperturbed probability.

    Args:
        scores: ``(batch, positions)`` the ranking's scores.
        candidates: ``(batch, positions)`` bool.
        full: ``(batch,)`` the unperturbed target probability.
        removed: maps ``rows`` ``(k,)`` and removal masks ``(k, positions)`` to the target probabilities ``(k,)``
            (see :meth:`Subject.removed_probability`).

    Returns:
        ``{metric: (batch,) float64}`` for each metric of :data:`METRICS`, in probability units (0-1).
    """
    fractions = FRACTIONS[1:]
    masks = torch.cat(
        [
            removal_masks(scores, candidates, True, fractions),
            removal_masks(scores, candidates, False, fractions),
            comprehensiveness_masks(scores, candidates, ERASER_BINS),
            sufficiency_masks(scores, candidates, ERASER_BINS),
        ]
    )
    full = full.double()
    probabilities = distinct_removals(masks, full, removed)
    cut = len(fractions)
    most_first = torch.cat([full[None], probabilities[:cut]])
    least_first = torch.cat([full[None], probabilities[cut : 2 * cut]])
    bins = len(ERASER_BINS)
    return {
        "abpc": abpc(most_first, least_first, FRACTIONS),
        "positive_auc": curve_areas(most_first, FRACTIONS),
        "negative_auc": curve_areas(least_first, FRACTIONS),
        "comprehensiveness": erasure_score(full, probabilities[2 * cut : 2 * cut + bins]),
        "sufficiency": erasure_score(full, probabilities[2 * cut + bins :]),
    }


def distinct_removals(masks: Tensor, full: Tensor, removed: Callable[[Tensor, Tensor], Tensor]) -> Tensor:
    """``(steps, batch)`` the probabilities of ``masks`` ``(steps, batch, positions)``, asking ``removed`` once per
    distinct (example, mask) and not at all for an empty mask (``full`` of that example)."""
    steps, batch, positions = masks.shape
    keyed = torch.cat([torch.arange(batch)[None, :, None].expand(steps, batch, 1), masks.long()], dim=-1)
    unique, inverse = torch.unique(keyed.reshape(steps * batch, positions + 1), dim=0, return_inverse=True)
    rows, unique_masks = unique[:, 0], unique[:, 1:].bool()
    values = full[rows].clone()
    needed = unique_masks.any(dim=-1)
    if bool(needed.any()):
        values[needed] = removed(rows[needed], unique_masks[needed]).double()
    return values[inverse].reshape(steps, batch)


def evaluate_subject(
    subject: Subject,
    methods: Sequence[str],
    n: int,
    seeds: Sequence[int],
    batch_size: int,
    on_seed: Callable[[dict[str, MethodResult], int], None] | None = None,
    full_means: list[float] | None = None,
    options: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, MethodResult]:
    """Run every method (and ``random``) on ``n`` drawn examples per seed; see the module docstring.

    Args:
        subject: the model under test.
        methods: registry names and/or ``random``.
        n: examples drawn per seed (all of the pool if it is smaller).
        seeds: one sample, random ranking and method seed each.
        batch_size: examples explained together.
        on_seed: called with the results so far after each seed.
        full_means: if given, receives each seed's mean unperturbed target probability.
        options: each method's options (``{"integrated_gradients": {"n_steps": 16}}``); others take their defaults.

    Returns:
        ``{method: MethodResult}`` in the order of ``methods``.
    """
    from explainers import ExplainError, get_method

    results = {method: MethodResult() for method in methods}
    for method in methods:
        if method != RANDOM:
            results[method].not_applicable = subject.refusal(method)
    if subject.pool_size() == 0:
        raise ValueError(f"{subject.name}: no held-out example to draw")
    for seed in seeds:
        count = min(n, subject.pool_size())
        drawn = subject.order(random.Random(seed).sample(range(subject.pool_size()), count))
        generator = torch.Generator().manual_seed(seed)
        sums: dict[str, dict[str, float]] = {method: dict.fromkeys(METRICS, 0.0) for method in methods}
        seconds = dict.fromkeys(methods, 0.0)
        full_sum = 0.0
        started = time.perf_counter()
        for start in range(0, count, batch_size):
            batch = subject.batch(drawn[start : start + batch_size])
            candidates = subject.candidates(batch)
            full = subject.full_probability(batch)
            full_sum += float(full.sum())
            for method in methods:
                if results[method].not_applicable is not None:
                    continue
                clock = time.perf_counter()
                if method == RANDOM:
                    scores = torch.rand(candidates.shape, generator=generator, dtype=torch.float64)
                else:
                    names = {option.name for option in get_method(method).options}
                    chosen = dict((options or {}).get(method, {}))
                    if "seed" in names:
                        chosen["seed"] = seed
                    try:
                        scores = subject.explain(batch, method, chosen)
                    except ExplainError as error:
                        results[method].not_applicable = str(error)
                        logger.info("%s: %s does not apply: %s", subject.name, method, error)
                        continue
                seconds[method] += time.perf_counter() - clock
                values = batch_metrics(scores, candidates, full, partial(subject.removed_probability, batch))
                for metric, tensor in values.items():
                    sums[method][metric] += float(tensor.sum())
            logger.info(
                "%s seed %d: %d/%d examples (%.0f s)", subject.name, seed, min(start + batch_size, count), count,
                time.perf_counter() - started,
            )  # fmt: skip
        for method in methods:
            if results[method].not_applicable is None:
                for metric in METRICS:
                    results[method].per_seed[metric].append(sums[method][metric] / count)
                results[method].seconds_per_example.append(seconds[method] / count)
        if full_means is not None:
            full_means.append(full_sum / count)
        if on_seed is not None:
            on_seed(results, seed)
    return results
