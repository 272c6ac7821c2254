"""The perturbation test of Chefer, Gur & Wolf (CVPR 2021, §4.2) as pure tensor functions.

For each example, the *candidates* (text: real, non-special tokens; images: every patch) are ranked by an
explanation's scores. At each fraction ``f`` of ``FRACTIONS`` (0%, 10% … 90%) the ``floor(f · n)`` candidates ranked
first are removed:

- **positive** perturbation removes the *highest*-scored candidates first: a faithful explanation makes the model
  lose its prediction fast, so a **lower** area under the curve is better;
- **negative** perturbation removes the *lowest*-scored first: the prediction should survive, **higher** is better.

Removal (stated wherever results are shown): text tokens are **replaced by the tokenizer's mask token**
(``[MASK]``; the sequence keeps its length and positions) by default, or **deleted** (the remaining tokens are
packed to the left); image patches are **set to zero in the normalised ``pixel_values``** (the processor's mean
colour). Ties in the scores are broken by position (earlier first), so results are deterministic.

The curves track, per fraction, the accuracy against the gold label (the quantity Chefer et al. plot) and the mean
probability of the class that was explained (the unperturbed prediction). An AUC is the trapezoidal area under a
curve over ``[0, 0.9]`` divided by 0.9, in percent: an explanation under which nothing changes scores the
unperturbed accuracy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

FRACTIONS: tuple[float, ...] = tuple(step / 10 for step in range(10))


def removal_counts(candidates: Tensor, fractions: Sequence[float] = FRACTIONS) -> Tensor:
    """How many candidates each example loses at each fraction: ``floor(f · n)``.

    Args:
        candidates: ``(batch, positions)`` bool, the removable positions.
        fractions: the removed fractions, each in ``[0, 1]``.

    Returns:
        ``(len(fractions), batch)`` long tensor.
    """
    if any(not 0.0 <= fraction <= 1.0 for fraction in fractions):
        raise ValueError(f"fractions must lie in [0, 1], got {list(fractions)}")
    totals = candidates.sum(dim=-1).double()
    fraction_tensor = torch.tensor(list(fractions), dtype=torch.float64)[:, None]
    return torch.floor(fraction_tensor * totals[None, :] + 1e-9).long()


def removal_masks(scores: Tensor, candidates: Tensor, positive: bool, fractions: Sequence[float] = FRACTIONS) -> Tensor:
    """Which positions are removed at each fraction.

    Args:
        scores: ``(batch, positions)`` the explanation's scores (images: the patch grid flattened row-major).
        candidates: ``(batch, positions)`` bool, the removable positions; others are never removed.
        positive: remove the highest scores first (``True``) or the lowest first (``False``).
        fractions: the removed fractions.

    Returns:
        ``(len(fractions), batch, positions)`` bool, ``True`` = removed. The removed set grows with the fraction.

    Raises:
        ValueError: if the shapes differ.
    """
    candidates = candidates.bool()
    ranks = candidate_ranks(scores, candidates, positive)
    counts = removal_counts(candidates, fractions).to(scores.device)
    return (ranks[None, :, :] < counts[:, :, None]) & candidates[None]


def candidate_ranks(scores: Tensor, candidates: Tensor, positive: bool) -> Tensor:
    """Each position's rank in the removal order: 0 for the first removed (the highest score when ``positive``, else
    the lowest); candidates come before the other positions, ties go to the earlier position.

    Args:
        scores: ``(batch, positions)``.
        candidates: ``(batch, positions)`` bool.
        positive: rank the highest scores first.

    Returns:
        ``(batch, positions)`` long.

    Raises:
        ValueError: if the shapes differ.
    """
    if scores.shape != candidates.shape or scores.dim() != 2:
        raise ValueError(f"scores {tuple(scores.shape)} and candidates {tuple(candidates.shape)} must be (batch, n)")
    keyed = scores.double() if positive else -scores.double()
    keyed = keyed.masked_fill(~candidates.bool(), float("-inf"))
    order = torch.sort(keyed, dim=-1, descending=True, stable=True).indices
    ranks = torch.empty_like(order)
    ranks.scatter_(-1, order, torch.arange(order.shape[-1], device=order.device).expand_as(order))
    return ranks


def mask_tokens(input_ids: Tensor, remove: Tensor, mask_token_id: int) -> Tensor:
    """Replace the removed tokens by the mask token (length and positions unchanged).

    Args:
        input_ids: ``(batch, length)``.
        remove: ``(batch, length)`` bool.
        mask_token_id: the tokenizer's ``mask_token_id``.
    """
    return input_ids.masked_fill(remove.bool(), mask_token_id)


def delete_tokens(
    input_ids: Tensor, attention_mask: Tensor, remove: Tensor, pad_token_id: int
) -> tuple[Tensor, Tensor]:
    """Delete the removed tokens: the kept tokens are packed to the left, the rest is padding.

    Args:
        input_ids: ``(batch, length)``, right-padded.
        attention_mask: ``(batch, length)``.
        remove: ``(batch, length)`` bool (only real tokens should be removed).
        pad_token_id: the id written into the freed positions.

    Returns:
        ``(input_ids, attention_mask)`` of the same shape.
    """
    keep = attention_mask.bool() & ~remove.bool()
    # stable sort puts kept positions first, in their original order
    order = torch.sort((~keep).to(torch.int8), dim=-1, stable=True).indices
    packed = torch.gather(input_ids, -1, order)
    new_mask = torch.gather(keep, -1, order)
    return packed.masked_fill(~new_mask, pad_token_id), new_mask.to(attention_mask.dtype)


def zero_patches(pixel_values: Tensor, remove: Tensor) -> Tensor:
    """Set the removed patches of the normalised image to zero.

    Args:
        pixel_values: ``(batch, channels, height, width)``.
        remove: ``(batch, grid_h, grid_w)`` bool; the patch size is ``height / grid_h`` by ``width / grid_w``.

    Raises:
        ValueError: if the grid does not tile the image.
    """
    batch, _, height, width = pixel_values.shape
    grid_h, grid_w = remove.shape[-2:]
    if height % grid_h or width % grid_w or remove.shape[0] != batch:
        raise ValueError(f"a {grid_h}x{grid_w} grid does not tile a {height}x{width} image batch of {batch}")
    pixel_mask = remove.bool().repeat_interleave(height // grid_h, dim=-2).repeat_interleave(width // grid_w, dim=-1)
    return pixel_values.masked_fill(pixel_mask[:, None, :, :], 0.0)


@dataclass(frozen=True)
class PerturbationOutcome:
    """Per fraction and example: whether the perturbed prediction is right, and the explained class's probability.

    Attributes:
        correct: ``(fractions, batch)`` bool, prediction == gold label.
        target_probability: ``(fractions, batch)`` probability of the explained class.
    """

    correct: Tensor
    target_probability: Tensor


def perturbation_outcome(
    scores: Tensor,
    candidates: Tensor,
    predict_removed: Callable[[Tensor], Tensor],
    targets: Tensor,
    labels: Tensor,
    positive: bool,
    fractions: Sequence[float] = FRACTIONS,
) -> PerturbationOutcome:
    """Run one perturbation test on a batch.

    Args:
        scores: ``(batch, positions)`` explanation scores.
        candidates: ``(batch, positions)`` removable positions.
        predict_removed: maps a ``(rows, positions)`` bool removal mask of ``rows = len(fractions) · batch`` rows
            (fraction-major: the batch repeated per fraction) to class probabilities ``(rows, classes)``.
        targets: ``(batch,)`` the explained classes.
        labels: ``(batch,)`` the gold labels.
        positive: positive (highest first) or negative (lowest first) perturbation.
        fractions: the removed fractions.

    Returns:
        The per-fraction, per-example outcome.
    """
    masks = removal_masks(scores, candidates, positive, fractions)
    steps, batch, positions = masks.shape
    probabilities = predict_removed(masks.reshape(steps * batch, positions)).reshape(steps, batch, -1).float()
    predicted = probabilities.argmax(dim=-1)
    target_probability = probabilities.gather(
        -1, targets.to(probabilities.device)[None, :, None].expand(steps, batch, 1)
    )
    return PerturbationOutcome(predicted == labels.to(predicted.device)[None, :], target_probability[..., 0])


def area_under_curve(values: Sequence[float], fractions: Sequence[float] = FRACTIONS) -> float:
    """Trapezoidal area under ``values`` over ``fractions``, divided by the fraction range (a mean level).

    Raises:
        ValueError: if the lengths differ or fewer than two points are given.
    """
    if len(values) != len(fractions) or len(values) < 2:
        raise ValueError(f"{len(values)} values for {len(fractions)} fractions (need at least 2)")
    area = sum(
        (fractions[index + 1] - fractions[index]) * (values[index] + values[index + 1]) / 2
        for index in range(len(values) - 1)
    )
    return float(area / (fractions[-1] - fractions[0]))
