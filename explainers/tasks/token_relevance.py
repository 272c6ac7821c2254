"""Chefer et al.'s relevance (CVPR 2021) for a token classifier's targets: LRP seeded at the target's tokens.

A token classifier's head is one linear layer applied to every token's last hidden state. A target (an entity) is
the summed logit ``Σ_j w_j · logit[p_j, c_j]`` of its terms (each token of the span and its tag). The LRP pass starts
from the one-hot of Chefer et al., one per term: relevance ``w_j`` at logit ``(p_j, c_j)`` and 0 elsewhere. The
αβ rule (α=1, β=0) carries it through the head to the last hidden states at those tokens
(:func:`~explainers.rules.lrp.token_head_relprop`), and the blocks' rules
(:func:`~explainers.rules.lrp.blocks_attention_relevances`) down to every layer's attention probabilities, exactly as
for a sequence head from its pooled token. The maps are then weighted by the gradients of the same target and
rolled out (:func:`~explainers.rules.maps.relevance_scores`), reading the rows of the span's tokens (their mean) with
their self-relevance suppressed, as the rollouts of ``gae`` are for every target of :mod:`explainers.tasks.targets`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..architectures.description import Architecture
from ..capture import Capture
from ..rules import maps
from ..rules.lrp import BlockWeights, blocks_attention_relevances, token_head_relprop


def term_relevance(terms: tuple[Tensor, Tensor, Tensor], length: int, classes: int, dtype: torch.dtype) -> Tensor:
    """The starting relevance ``(rows, n, C)`` of each row's target: its terms' weights at ``(position, class)``.

    Args:
        terms: ``positions``, ``labels`` (long) and ``weights`` (float), each ``(rows, J)``; unused terms have
            weight 0.
        length: ``n``.
        classes: ``C``.
        dtype: of the result.
    """
    positions, labels, weights = terms
    rows = positions.shape[0]
    seed = torch.zeros((rows, length * classes), dtype=dtype, device=positions.device)
    seed.scatter_add_(1, positions * classes + labels, weights.to(dtype))
    return seed.view(rows, length, classes)


def token_relevance_scores(
    capture: Capture,
    arch: Architecture,
    weights: list[BlockWeights],
    terms: tuple[Tensor, Tensor, Tensor],
    mask: Tensor,
    start_layer: int,
    readout: Tensor,
    read_tokens: Tensor,
) -> Tensor:
    """Relevance scores of each row's target (one virtual row per target).

    Args:
        capture: the rows' capture: activations, head inputs ``[(rows, n, hidden)]`` and the attention gradients of
            each row's own target.
        arch: the token classifier's description (one linear head: ``arch.head``).
        weights: its blocks' weights, in the activations' dtype.
        terms: each row's target terms (see :func:`term_relevance`).
        mask: ``(rows, n)`` the positions the target may depend on (real tokens).
        start_layer: first block included.
        readout: ``(rows, n)`` the rows of the maps the target reads (uniform over the span).
        read_tokens: ``(rows, n)`` bool, the tokens whose self-relevance is suppressed.

    Returns:
        ``(rows, n)`` scores, exactly 0 outside ``mask``.
    """
    assert capture.activations is not None and capture.head_inputs is not None
    assert capture.attention_gradients is not None
    (head,) = arch.head
    dtype = capture.activations[0].hidden.dtype
    hidden = capture.head_inputs[0].to(dtype)
    seed = term_relevance(terms, hidden.shape[1], head.out_features, dtype)
    top = token_head_relprop(hidden, head.weight.detach().to(dtype), seed)
    relevances = blocks_attention_relevances(
        capture.activations,
        weights,
        top,
        arch.num_heads,
        arch.norm_first,
        start_layer,
        masked=True,
    )
    return maps.relevance_scores(relevances, capture.attention_gradients, mask, start_layer, readout, read_tokens)
