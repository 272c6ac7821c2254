"""Faithfulness metrics beyond Chefer et al.'s AUC, as pure tensor functions over a model's target probability.

Every metric here reads one quantity: the probability ``p`` of the explained target (a class, an entity token's
label, a greedy next token) after some of the input's *candidates* (tokens, patches) are removed, in the order an
explanation ranks them (:func:`explain_eval.faithfulness.candidate_ranks`).

- **Perturbation curves** (Chefer et al. 2021; :mod:`explain_eval.faithfulness`): ``p`` after removing
  ``floor(f · n)`` candidates for ``f`` in 0%, 10% … 90%, most relevant first (*MoRF*, Chefer's positive test) or
  least relevant first (*LeRF*, the negative test). An AUC is the curve's trapezoidal area over ``[0, 0.9]`` divided
  by 0.9 (a mean level).
- **ABPC**, the area between the perturbation curves (Achtibat et al. 2024, AttnLRP): ``AUC(LeRF) - AUC(MoRF)``; a
  faithful ranking keeps ``p`` when the least relevant go and loses it when the most relevant go, so **higher** is
  better and a random ranking scores about 0.
- **Comprehensiveness** (DeYoung et al. 2020, ERASER): ``p(x) - p(x without its top k%)``, averaged over the bins
  ``k`` of :data:`ERASER_BINS`; **higher** is better.
- **Sufficiency** (ERASER): ``p(x) - p(only the top k% of x kept)``, averaged over the same bins; **lower** is
  better (the top tokens alone keep the prediction).

The top ``k%`` of ``n`` candidates is ``ceil(k · n)`` of them (at least one, at most ``n``): on a 20-token tweet the
1% bin is its most relevant token, not nothing. Non-candidates (special tokens) are never removed, also when "only
the top k%" are kept.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from .faithfulness import FRACTIONS, candidate_ranks

#: ERASER's bins: the shares of the candidates taken as "the top k%" (DeYoung et al. 2020, §4).
ERASER_BINS: tuple[float, ...] = (0.01, 0.05, 0.10, 0.20, 0.50)


def top_counts(candidates: Tensor, bins: Sequence[float] = ERASER_BINS) -> Tensor:
    """How many candidates make each example's top ``k``: ``ceil(k · n)``, clipped to ``[min(1, n), n]``.

    Args:
        candidates: ``(batch, positions)`` bool.
        bins: the shares ``k``, each in ``(0, 1]``.

    Returns:
        ``(len(bins), batch)`` long.

    Raises:
        ValueError: for a share outside ``(0, 1]``.
    """
    if any(not 0.0 < share <= 1.0 for share in bins):
        raise ValueError(f"bins must lie in (0, 1], got {list(bins)}")
    totals = candidates.bool().sum(dim=-1)
    shares = torch.tensor(list(bins), dtype=torch.float64)[:, None]
    counts = torch.ceil(shares * totals.double()[None, :] - 1e-9).long()
    return torch.minimum(counts.clamp(min=1), totals[None, :])


def top_masks(scores: Tensor, candidates: Tensor, bins: Sequence[float] = ERASER_BINS) -> Tensor:
    """Each bin's top ``k`` candidates (highest scores; ties: the earlier position).

    Args:
        scores: ``(batch, positions)``.
        candidates: ``(batch, positions)`` bool.
        bins: the shares ``k``.

    Returns:
        ``(len(bins), batch, positions)`` bool, ``True`` = among the top ``k``.
    """
    candidates = candidates.bool()
    ranks = candidate_ranks(scores, candidates, True)
    counts = top_counts(candidates, bins).to(scores.device)
    return (ranks[None] < counts[:, :, None]) & candidates[None]


def comprehensiveness_masks(scores: Tensor, candidates: Tensor, bins: Sequence[float] = ERASER_BINS) -> Tensor:
    """The removals of the comprehensiveness test: each bin's top ``k`` candidates (``(bins, batch, positions)``)."""
    return top_masks(scores, candidates, bins)


def sufficiency_masks(scores: Tensor, candidates: Tensor, bins: Sequence[float] = ERASER_BINS) -> Tensor:
    """The removals of the sufficiency test: every candidate but each bin's top ``k`` (``(bins, batch, positions)``)."""
    return candidates.bool()[None] & ~top_masks(scores, candidates, bins)


def erasure_score(full: Tensor, perturbed: Tensor) -> Tensor:
    """Per example, the mean over bins of ``full - perturbed``: comprehensiveness when ``perturbed`` is the
    probability without the top ``k``, sufficiency when it is the probability with only the top ``k``.

    Args:
        full: ``(batch,)`` the unperturbed target probability.
        perturbed: ``(bins, batch)`` the perturbed ones.

    Returns:
        ``(batch,)`` float64.

    Raises:
        ValueError: if the shapes do not match.
    """
    if perturbed.dim() != 2 or full.shape != perturbed.shape[1:]:
        raise ValueError(
            f"full {tuple(full.shape)} and perturbed {tuple(perturbed.shape)} must be (batch,), (bins, batch)"
        )
    return (full.double()[None, :] - perturbed.double()).mean(dim=0)


def curve_areas(curves: Tensor, fractions: Sequence[float] = FRACTIONS) -> Tensor:
    """Per example, the trapezoidal area under a curve over ``fractions`` divided by their range (a mean level,
    as :func:`explain_eval.faithfulness.area_under_curve` computes it for one curve).

    Args:
        curves: ``(len(fractions), batch)``.
        fractions: increasing, at least two.

    Returns:
        ``(batch,)`` float64.

    Raises:
        ValueError: for a length mismatch, fewer than two points or fractions that do not increase.
    """
    if curves.dim() != 2 or curves.shape[0] != len(fractions) or len(fractions) < 2:
        raise ValueError(f"curves {tuple(curves.shape)} must be (fractions = {len(fractions)} >= 2, batch)")
    steps = torch.tensor(list(fractions), dtype=torch.float64)
    widths = steps[1:] - steps[:-1]
    if bool((widths <= 0).any()):
        raise ValueError(f"fractions must increase, got {list(fractions)}")
    values = curves.double()
    area = (widths[:, None] * (values[1:] + values[:-1]) / 2).sum(dim=0)
    return area / (steps[-1] - steps[0])


def abpc(most_first: Tensor, least_first: Tensor, fractions: Sequence[float] = FRACTIONS) -> Tensor:
    """The area between the perturbation curves, per example: ``area(least relevant first) - area(most relevant
    first)`` (each as :func:`curve_areas`); higher is better.

    Args:
        most_first: ``(len(fractions), batch)`` the MoRF curve (Chefer's positive perturbation).
        least_first: ``(len(fractions), batch)`` the LeRF curve (the negative perturbation).
        fractions: the removed fractions of both curves.

    Returns:
        ``(batch,)`` float64.
    """
    if most_first.shape != least_first.shape:
        raise ValueError(f"curves {tuple(most_first.shape)} and {tuple(least_first.shape)} differ")
    return curve_areas(least_first, fractions) - curve_areas(most_first, fractions)
