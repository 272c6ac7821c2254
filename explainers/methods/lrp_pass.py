"""Chefer et al.'s LRP (CVPR 2021) from a row's target: the one-hot of a sequence head's class, or a token classifier's
target seeded at its tokens; one pass for ``relevance``, ``lrp`` and ``partial_lrp``.

A token classifier's head is one linear layer applied to every token's last hidden state. A target (an entity) is
the summed logit ``Σ_j w_j · logit[p_j, c_j]`` of its terms (each token of the span and its tag). The LRP pass starts
from the one-hot of Chefer et al., one per term: relevance ``w_j`` at logit ``(p_j, c_j)`` and 0 elsewhere. The
αβ rule (α=1, β=0) carries it through the head to the last hidden states at those tokens
(:func:`~explainers.rules.lrp.token_head_relprop`), and the blocks' rules
(:func:`~explainers.rules.lrp.blocks_relevances`) down to every layer's attention probabilities (and, for full LRP,
to the first block's input), exactly as for a sequence head from its pooled token
(:func:`~explainers.rules.lrp.sequence_head_relevance`). The callers then read the maps as their method says,
reading the rows of the span's tokens (their mean) with the tokens read suppressed, as the rollouts of ``gae`` are
for every target of :mod:`explainers.tasks.targets`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from ..architectures.description import Architecture
from ..capture import Capture
from ..rules.lrp import (
    Affine,
    BlockWeights,
    Relevances,
    blocks_relevances,
    safe_divide,
    sequence_head_relevance,
    token_head_relprop,
)


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


def block_weights(arch: Architecture, dtype: torch.dtype) -> list[BlockWeights]:
    """The parameters of every block's six linear layers, detached, in ``dtype``."""

    def affine(linear: nn.Linear) -> Affine:
        bias = None if linear.bias is None else linear.bias.detach().to(dtype)
        return Affine(linear.weight.detach().to(dtype), bias)

    return [
        BlockWeights(
            query=affine(block.query),
            key=affine(block.key),
            value=affine(block.value),
            attention_output=affine(block.attention_output),
            ffn_in=affine(block.ffn_in),
            ffn_out=affine(block.ffn_out),
        )
        for block in arch.blocks
    ]


def lrp_relevances(
    capture: Capture,
    arch: Architecture,
    terms: tuple[Tensor, Tensor, Tensor] | None,
    start_layer: int,
    to_input: bool = False,
) -> Relevances:
    """Chefer et al.'s LRP pass for each row's target, from the logits down to block ``start_layer``.

    Args:
        capture: the rows' capture (activations and head inputs; ``targets`` on the classifier path).
        arch: the model's description (its blocks and head).
        terms: a token-level target's terms per row (:func:`term_relevance`), or ``None`` for a sequence head,
            seeded at the one-hot of each row's target class.
        start_layer: the lowest block visited.
        to_input: also return the relevance of the input of block ``start_layer``.
    """
    assert capture.activations is not None and capture.head_inputs is not None
    dtype = capture.activations[0].hidden.dtype
    if terms is not None:
        (head,) = arch.head
        hidden = capture.head_inputs[0].to(dtype)
        seed = term_relevance(terms, hidden.shape[1], head.out_features, dtype)
        top = token_head_relprop(hidden, head.weight.detach().to(dtype), seed)
    else:
        one_hot = torch.nn.functional.one_hot(capture.targets, capture.logits.shape[-1]).to(dtype)
        top = sequence_head_relevance(
            capture.activations[-1].hidden,
            capture.head_inputs,
            [linear.weight.detach().to(dtype) for linear in arch.head],
            one_hot,
            arch.head_paths,
            _head_shares(capture, arch, dtype),
        )
    return blocks_relevances(
        capture.activations,
        block_weights(arch, dtype),
        top,
        arch.num_heads,
        arch.norm_first,
        start_layer,
        masked=arch.modality == "text",
        to_input=to_input,
    )


def _head_shares(capture: Capture, arch: Architecture, dtype: torch.dtype) -> Sequence[Tensor] | None:
    """Per head, its magnitude share ``|z_h| / Σ|z|`` of the target logit, when the model averages several heads."""
    paths = arch.head_paths
    if len(paths) < 2:
        return None
    assert capture.head_inputs is not None
    targets = capture.targets.view(-1, 1)
    magnitudes = []
    first = 0
    for _, count in paths:
        last = arch.head[first + count - 1]
        inputs = capture.head_inputs[first + count - 1].to(dtype)
        bias = None if last.bias is None else last.bias.detach().to(dtype)
        logits = torch.nn.functional.linear(inputs, last.weight.detach().to(dtype), bias)
        magnitudes.append(logits.gather(1, targets).abs())
        first += count
    total = torch.stack(magnitudes).sum(dim=0)
    return [safe_divide(magnitude, total) for magnitude in magnitudes]
