"""Attribution kernels: attention matrices (and their gradients or relevances) in, token scores out.

Pure, batched, device-neutral tensor functions, no model calls and no hooks. Shapes: ``batch`` examples,
``heads`` attention heads, ``n`` tokens (padding included); ``mask`` is ``(batch, n)`` with 1 for real tokens.

The explained row is where the classifier's head reads (:mod:`explainers.architectures.heads`): ``readout (batch, n)``
weights (one-hot for a single token, ``1/length`` over the real tokens for mean pooling, ½ and ½ for DeiT's class and
distillation tokens); ``None`` means the first token. The scores are ``readout · M`` for the method's matrix
``M``, computed as a row vector from the top layer down (``O(n²)`` per layer instead of the ``O(n³)`` of the full
matrix product; the same result by associativity). ``read_tokens (batch, n)`` marks the single tokens the head
reads, whose self-relevance (from the identity) the rollouts of Chefer et al. suppress; ``None`` means the first
token.

:func:`raw_attention` and :func:`rollout_scores` also take several explained rows per example, ``readout
(batch, k, n)``, and then return ``(batch, k, n)``: the ``k`` rows of the same maps, read in one pass over each layer
(token-level heads explain many targets from one forward: :mod:`explainers.tasks.targets`).
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


def head_mean(attention: Tensor) -> Tensor:
    """``(batch, heads, n, n)`` → ``(batch, n, n)`` mean over heads; an already averaged ``(batch, n, n)`` as is."""
    return attention.mean(dim=1) if attention.dim() == 4 else attention


def _first_token(batch: int, length: int, like: Tensor) -> Tensor:
    readout = torch.zeros(batch, length, dtype=like.dtype, device=like.device)
    readout[:, 0] = 1
    return readout


def _readout(readout: Tensor | None, like: Tensor) -> Tensor:
    batch, length = like.shape[0], like.shape[-1]
    return _first_token(batch, length, like) if readout is None else readout.to(like.dtype)


def _row_times(row: Tensor, matrix: Tensor) -> Tensor:
    """``(batch, n) · (batch, n, n)`` → ``(batch, n)``; several rows ``(batch, k, n)`` → ``(batch, k, n)``."""
    if row.dim() == 3:
        return torch.bmm(row, matrix)
    return torch.bmm(row.unsqueeze(1), matrix).squeeze(1)


def raw_attention(attention: Tensor, readout: Tensor | None = None) -> Tensor:
    """Attention of the explained row to every token in one layer, averaged over heads.

    Args:
        attention: ``(batch, heads, n, n)`` attention probabilities of one layer, or their head mean.
        readout: ``(batch, n)`` weights of the rows the head reads (``None``: the first token), or ``(batch, k, n)``
            for ``k`` explained rows per example.

    Returns:
        ``(batch, n)`` (or ``(batch, k, n)``); each row sums to 1 over the real tokens. Class-agnostic and *not* a
        faithfulness claim (Jain & Wallace 2019).
    """
    mixed = head_mean(attention)
    return _row_times(_readout(readout, mixed), mixed)


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
        mixed = head_mean(attention)
        augmented = _row_normalise(0.5 * (mixed + _identity_like(mixed)))
        joint = augmented if joint is None else augmented @ joint
    if joint is None:
        raise ValueError(f"start_layer {start_layer} leaves no layer to roll out (got {len(attentions)} layers)")
    return joint


def rollout_scores(attentions: Sequence[Tensor], start_layer: int = 0, readout: Tensor | None = None) -> Tensor:
    """The explained row of :func:`rollout_matrix`: ``readout · Â_L ··· Â_start``, computed from the top down.

    Args:
        attentions: per layer ``(batch, heads, n, n)`` probabilities or their head means ``(batch, n, n)``.
        start_layer: the first layer included.
        readout: ``(batch, n)`` weights of the rows the head reads (``None``: the first token), or ``(batch, k, n)``
            for ``k`` explained rows per example.

    Returns:
        ``(batch, n)`` (or ``(batch, k, n)``); sums to 1 (padding columns are 0).
    """
    _check_start_layer(start_layer, len(attentions))
    row: Tensor | None = None
    for attention in reversed(attentions[start_layer:]):
        mixed = head_mean(attention)
        row = _times_normalised_plus_identity(_readout(readout, mixed) if row is None else row, mixed, 1.0)
    assert row is not None
    return row


def _times_normalised_plus_identity(row: Tensor, matrix: Tensor, weight: float) -> Tensor:
    """``row · norm(weight·M + I)`` without forming the matrix: with ``s`` the row sums of ``weight·M + I``,
    ``row · diag(1/s) · (weight·M + I) = (row/s)·M·weight + row/s`` (one matrix-vector product per layer)."""
    sums = weight * matrix.sum(dim=-1) + 1
    scaled = row / (sums.unsqueeze(1) if row.dim() == 3 else sums)
    return weight * _row_times(scaled, matrix) + scaled


def _check_start_layer(start_layer: int, layers: int) -> None:
    """Raise ``ValueError`` unless ``start_layer`` leaves a layer to roll out (``0 <= start_layer < layers``)."""
    if not 0 <= start_layer < layers:
        raise ValueError(f"start_layer {start_layer} leaves no layer to roll out (got {layers} layers)")


def _suppress_read_tokens(scores: Tensor, mask: Tensor, read_tokens: Tensor | None) -> Tensor:
    """Replace the scores of the tokens the head reads by the row's minimum over real tokens (Chefer et al.'s
    [CLS] rule, applied to whichever single tokens the head reads; ``None``: the first token)."""
    real_minimum = scores.masked_fill(mask == 0, float("inf")).min(dim=-1, keepdim=True).values
    if read_tokens is None:
        scores = scores.clone()
        scores[:, 0] = real_minimum[:, 0]
        return scores
    return torch.where(read_tokens, real_minimum.expand_as(scores), scores)


def gradient_weighted(values: Tensor, gradients: Tensor) -> Tensor:
    """``E_h[(∇A ⊙ values)⁺]``: positive part of the gradient-weighted values, averaged over heads.

    Args:
        values: ``(batch, heads, n, n)`` attention probabilities (GAE) or their LRP relevance (Chefer et al.).
        gradients: ``(batch, heads, n, n)`` gradient of the target logit with respect to the probabilities.

    Returns:
        ``(batch, n, n)``.
    """
    return (gradients * values).clamp_(min=0).mean(dim=1)  # in place: the product is a new tensor


def relevance_scores(
    relevances: Sequence[Tensor | None],
    gradients: Sequence[Tensor],
    mask: Tensor,
    start_layer: int = 0,
    readout: Tensor | None = None,
    read_tokens: Tensor | None = None,
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
        readout: ``(batch, n)`` weights of the rows the head reads (``None``: the first token).
        read_tokens: ``(batch, n)`` bool, the single tokens the head reads (``None``: the first token).

    Returns:
        ``(batch, n)`` scores, exactly 0 at padding.
    """
    _check_start_layer(start_layer, len(gradients))
    row: Tensor | None = None
    for relevance, gradient in zip(reversed(relevances[start_layer:]), reversed(gradients[start_layer:]), strict=True):
        if relevance is None:
            raise ValueError("relevance of a layer at or above start_layer is missing")
        weighted = gradient_weighted(relevance, gradient)
        row = _times_normalised_plus_identity(_readout(readout, weighted) if row is None else row, weighted, 1.0)
    assert row is not None
    return _suppress_read_tokens(row, mask, read_tokens) * mask


def gae_scores(
    attentions: Sequence[Tensor],
    gradients: Sequence[Tensor],
    mask: Tensor,
    start_layer: int = 0,
    readout: Tensor | None = None,
    read_tokens: Tensor | None = None,
) -> Tensor:
    """Generic attention-model explainability (Chefer, Gur & Wolf, ICCV 2021), self-attention rule.

    ``R = I``; for each layer from ``start_layer`` up: ``Ā = E_h[(∇A ⊙ A)⁺]`` and ``R ← R + Ā·R``. The first row
    row of ``R`` is returned (``readout · R``, computed from the top down as ``r ← r + r·Ā``), its self-relevance
    at the tokens the head reads (which starts at 1 from the identity) replaced by the row minimum over real
    tokens, as for ``relevance``.

    Returns:
        ``(batch, n)`` scores, exactly 0 at padding.
    """
    _check_start_layer(start_layer, len(attentions))
    row = _readout(readout, attentions[-1])
    for attention, gradient in zip(reversed(attentions[start_layer:]), reversed(gradients[start_layer:]), strict=True):
        row = row + _row_times(row, gradient_weighted(attention, gradient))
    return _suppress_read_tokens(row, mask, read_tokens) * mask


def _pair_mask(mask: Tensor) -> Tensor:
    """``(batch, n)`` → ``(batch, n, n)``: 1 where both the query and the key are real tokens."""
    real = mask.to(torch.bool)
    return real.unsqueeze(-1) & real.unsqueeze(-2)


def _min_max(values: Tensor, where: Tensor) -> Tensor:
    """``values`` rescaled to ``[0, 1]`` by their minimum and maximum over ``where`` (per example, every dimension
    but the first); 0 where the range is empty or the values are all equal."""
    dims = tuple(range(1, values.dim()))
    low = values.masked_fill(~where, float("inf")).amin(dim=dims, keepdim=True)
    high = values.masked_fill(~where, float("-inf")).amax(dim=dims, keepdim=True)
    spread = high - low
    scaled = (values - low) / torch.where(spread > 0, spread, torch.ones_like(spread))
    return torch.where((spread > 0) & where, scaled, torch.zeros_like(scaled))


def zero_read_tokens(scores: Tensor, read_tokens: Tensor | None) -> Tensor:
    """``scores`` with the tokens the head reads set to 0 (``None``: the first token), as the authors' code sets the
    [CLS] entry."""
    if read_tokens is None:
        scores = scores.clone()
        scores[..., 0] = 0
        return scores
    return scores.masked_fill(read_tokens.to(torch.bool), 0.0)


def gradcam_scores(
    attention: Tensor,
    gradient: Tensor,
    mask: Tensor,
    readout: Tensor | None = None,
    read_tokens: Tensor | None = None,
    whole_map: bool = True,
) -> Tensor:
    """GradCAM on the last layer's attention, as Chefer et al.'s baselines define it (their ``generate_attn_gradcam``
    for BERT, ``generate_cam_attn`` for ViT, hila-chefer/Transformer-Explainability).

    Each head's map is weighted by the mean of its gradient, averaged over heads, its negative part dropped, and
    rescaled to ``[0, 1]`` by its minimum and maximum:

    * ``whole_map`` (their BERT code): the gradient mean and the rescaling run over the whole ``n × n`` map of the
      real tokens; the explained row is read from the rescaled map and the tokens the head reads get 0;
    * otherwise (their ViT code): both run over the explained row's entries of the patches only (``mask`` marks
      them), and the row is returned.

    Args:
        attention: ``(batch, heads, n, n)`` the last layer's attention probabilities.
        gradient: ``(batch, heads, n, n)`` the target's gradient with respect to them.
        mask: ``(batch, n)`` 1 for the tokens scored (real tokens; the patches of an image).
        readout: ``(batch, n)`` weights of the explained row (``None``: the first token).
        read_tokens: ``(batch, n)`` bool, the tokens the head reads (``None``: the first token).
        whole_map: the BERT variant (text) or the ViT variant (images).

    Returns:
        ``(batch, n)`` scores in ``[0, 1]``, exactly 0 outside ``mask``.
    """
    rows = _readout(readout, attention[:, 0])
    if whole_map:
        pairs = _pair_mask(mask)
        counts = pairs.sum(dim=(-2, -1)).clamp(min=1).to(gradient.dtype).view(-1, 1, 1, 1)
        weights = (gradient * pairs.unsqueeze(1)).sum(dim=(-2, -1), keepdim=True) / counts
        cam = (attention * weights).mean(dim=1).clamp(min=0)
        row = _row_times(rows, _min_max(cam, pairs))
        return zero_read_tokens(row, read_tokens) * mask
    real = mask.to(torch.bool)
    heads = attention.shape[1]
    picked = rows.unsqueeze(1).expand(-1, heads, -1).unsqueeze(2)  # (batch, heads, 1, n)
    row_attention = (picked @ attention).squeeze(2)  # (batch, heads, n)
    row_gradient = (picked @ gradient).squeeze(2)
    counts = real.sum(dim=-1).clamp(min=1).to(gradient.dtype).view(-1, 1, 1)
    weights = (row_gradient * real.unsqueeze(1)).sum(dim=-1, keepdim=True) / counts
    cam = (row_attention * weights).mean(dim=1).clamp(min=0)
    return _min_max(cam, real) * mask


def partial_lrp_scores(
    relevance: Tensor, mask: Tensor, readout: Tensor | None = None, read_tokens: Tensor | None = None
) -> Tensor:
    """Partial LRP (Voita et al. 2019, as Chefer et al.'s baseline ``generate_LRP_last_layer``): the LRP relevance of
    the last layer's attention probabilities, its negative part dropped, averaged over heads, the explained row with
    the tokens the head reads set to 0.

    Args:
        relevance: ``(batch, heads, n, n)`` relevance of the last layer's attention probabilities.
        mask: ``(batch, n)`` 1 for the real tokens.
        readout: ``(batch, n)`` weights of the explained row (``None``: the first token).
        read_tokens: ``(batch, n)`` bool, the tokens the head reads (``None``: the first token).

    Returns:
        ``(batch, n)`` scores, exactly 0 at padding.
    """
    cam = relevance.clamp(min=0).mean(dim=1)
    row = _row_times(_readout(readout, cam), cam)
    return zero_read_tokens(row, read_tokens) * mask
