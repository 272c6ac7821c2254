"""Attribution kernels: attention matrices (and their gradients or relevances) in, token scores out.

Pure, batched, device-neutral tensor functions, no model calls and no hooks. Shapes: ``batch`` examples,
``heads`` attention heads, ``n`` tokens (padding included); ``mask`` is ``(batch, n)`` with 1 for real tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def _identity_like(matrix: Tensor) -> Tensor:
    batch, length, _ = matrix.shape
    return torch.eye(length, dtype=matrix.dtype, device=matrix.device).expand(batch, length, length)


def _row_normalise(matrix: Tensor) -> Tensor:
    return matrix / matrix.sum(dim=-1, keepdim=True)


def raw_attention(attention: Tensor) -> Tensor:
    """Attention of the first token to every token in one layer, averaged over heads.

    Args:
        attention: ``(batch, heads, n, n)`` attention probabilities of one layer.

    Returns:
        ``(batch, n)``; each row sums to 1 over the real tokens. Class-agnostic and *not* a faithfulness claim
        (Jain & Wallace 2019).
    """
    return attention.mean(dim=1)[:, 0]


def rollout_matrix(attentions: Sequence[Tensor], start_layer: int = 0) -> Tensor:
    """Attention rollout (Abnar & Zuidema 2020): ``R = Â_L ··· Â_start`` with ``Â = norm(½·(mean_h A + I))``.

    Args:
        attentions: per layer ``(batch, heads, n, n)`` attention probabilities, input side first.
        start_layer: the first layer included.

    Returns:
        ``(batch, n, n)``; every row sums to 1.
    """
    joint: Tensor | None = None
    for attention in attentions[start_layer:]:
        mixed = attention.mean(dim=1)
        augmented = _row_normalise(0.5 * (mixed + _identity_like(mixed)))
        joint = augmented if joint is None else augmented @ joint
    if joint is None:
        raise ValueError(f"start_layer {start_layer} leaves no layer to roll out (got {len(attentions)} layers)")
    return joint


def _suppress_first_token(scores: Tensor, mask: Tensor) -> Tensor:
    """Replace each row's first-token score by the row's minimum over real tokens (Chefer et al.'s [CLS] rule)."""
    real_minimum = scores.masked_fill(mask == 0, float("inf")).min(dim=-1).values
    scores = scores.clone()
    scores[:, 0] = real_minimum
    return scores


def gradient_weighted(values: Tensor, gradients: Tensor) -> Tensor:
    """``E_h[(∇A ⊙ values)⁺]``: positive part of the gradient-weighted values, averaged over heads.

    Args:
        values: ``(batch, heads, n, n)`` attention probabilities (GAE) or their LRP relevance (Chefer et al.).
        gradients: ``(batch, heads, n, n)`` gradient of the target logit with respect to the probabilities.

    Returns:
        ``(batch, n, n)``.
    """
    return (gradients * values).clamp(min=0).mean(dim=1)


def relevance_scores(
    relevances: Sequence[Tensor | None], gradients: Sequence[Tensor], mask: Tensor, start_layer: int = 0
) -> Tensor:
    """Chefer, Gur & Wolf (CVPR 2021), Eq. 13–14: roll out the gradient-weighted relevance maps.

    Per layer ``Ā = E_h[(∇A ⊙ R^(A))⁺]``; then ``C = norm(Ā_L + I) ··· norm(Ā_start + I)`` with each row
    renormalised to sum 1 (as in the authors' current code); the first row of ``C`` is returned with the
    first token's self-relevance replaced by the row minimum over real tokens, as the authors' code does.

    Args:
        relevances: per layer ``(batch, heads, n, n)`` LRP relevance of the attention probabilities
            (``None`` below ``start_layer``).
        gradients: per layer ``(batch, heads, n, n)`` gradient of the target logit w.r.t. the probabilities.
        mask: ``(batch, n)`` 1 for real tokens, 0 for padding.
        start_layer: first layer included.

    Returns:
        ``(batch, n)`` scores, exactly 0 at padding.
    """
    joint: Tensor | None = None
    for relevance, gradient in zip(relevances[start_layer:], gradients[start_layer:], strict=True):
        if relevance is None:
            raise ValueError("relevance of a layer at or above start_layer is missing")
        weighted = gradient_weighted(relevance, gradient)
        augmented = _row_normalise(weighted + _identity_like(weighted))
        joint = augmented if joint is None else augmented @ joint
    if joint is None:
        raise ValueError(f"start_layer {start_layer} leaves no layer to roll out (got {len(gradients)} layers)")
    return _suppress_first_token(joint[:, 0], mask) * mask


def gae_scores(attentions: Sequence[Tensor], gradients: Sequence[Tensor], mask: Tensor, start_layer: int = 0) -> Tensor:
    """Generic attention-model explainability (Chefer, Gur & Wolf, ICCV 2021), self-attention rule.

    ``R = I``; for each layer from ``start_layer`` up: ``Ā = E_h[(∇A ⊙ A)⁺]`` and ``R ← R + Ā·R``. The first row
    of ``R`` is returned, its self-relevance (which starts at 1 from the identity) replaced by the row minimum
    over real tokens, as for ``relevance``.

    Returns:
        ``(batch, n)`` scores, exactly 0 at padding.
    """
    if not 0 <= start_layer < len(attentions):
        raise ValueError(f"start_layer must be in [0, {len(attentions)}), got {start_layer}")
    first = attentions[0]
    batch, _, length, _ = first.shape
    joint = torch.eye(length, dtype=first.dtype, device=first.device).expand(batch, length, length)
    for attention, gradient in zip(attentions[start_layer:], gradients[start_layer:], strict=True):
        joint = joint + gradient_weighted(attention, gradient) @ joint
    return _suppress_first_token(joint[:, 0], mask) * mask
