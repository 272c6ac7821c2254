"""Layer-wise relevance propagation rules of Chefer, Gur & Wolf (CVPR 2021), as pure tensor functions.

Chefer et al. propagate relevance from the target logit down to every block's attention probabilities with
these rules (their ``layers_ours.py``), which this module implements for whole padded batches:

* linear layers: the LRP-αβ rule with α=1, β=0, bias ignored (:func:`linear_relprop`);
* the two attention matmuls (``Q·Kᵀ`` and ``A·V``): the LRP-z rule on *both* operands, each half kept
  (:func:`matmul_relprop`, the halving is done by the caller as in the paper's code);
* skip connections ``x + f(x)``: the z-rule followed by the normalisation that makes the two shares add up to
  the relevance that entered the sum (:func:`add_relprop`). The authors' code sums over the whole tensor,
  batch included; here each example is normalised on its own, which is what makes batching exact;
* a tensor used several times (:func:`clone_relprop`): the relevances of the uses are summed;
* the additive attention mask of text models: the skip-connection rule with a zero mask
  (:func:`masked_scores_relprop`), as the reference code does;
* LayerNorm, softmax, GELU/ReLU/tanh and dropout pass relevance unchanged.

All functions take and return tensors; nothing here touches a model.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any, NamedTuple

import torch
from torch import Tensor

EPSILON = 1e-9


def safe_divide(numerator: Tensor, denominator: Tensor) -> Tensor:
    """``numerator / (denominator + 1e-9)``, and exactly 0 wherever the denominator is exactly 0.

    The stabiliser of Chefer et al.'s code (which shifts every denominator by ``+1e-9`` and masks exact zeros),
    written with two passes over the data instead of nine: this division runs on every activation of the model.
    Exact zeros (padding, ReLU zeros) therefore never receive relevance.
    """
    quotient = numerator / (denominator + EPSILON)
    return quotient.masked_fill_(denominator == 0, 0.0)


def own_share(value: Tensor, relevance: Tensor) -> Tensor:
    """``value · safe_divide(relevance, value)``, the z-rule share of a tensor divided by itself, in three passes.

    The zero mask of :func:`safe_divide` is not needed here: where ``value`` is exactly 0 the product with it is 0
    anyway (``relevance / 1e-9`` stays finite).
    """
    return value * (relevance / (value + EPSILON))


def linear_relprop(
    inputs: Tensor, weight: Tensor, relevance: Tensor, output: Tensor | None = None, bias: Tensor | None = None
) -> Tensor:
    """LRP-αβ rule with α=1, β=0 through ``y = x·Wᵀ (+ b)``; the bias takes no relevance.

    With ``x⁺ = max(x, 0)``, ``x⁻ = min(x, 0)`` and likewise for ``W``, each output's relevance is shared among
    the inputs in proportion to their positive contributions ``x⁺W⁺ + x⁻W⁻`` (the denominator is a sum of
    non-negative terms). A positive input's share comes through ``W⁺``, a negative input's through ``W⁻``.

    The denominator costs two matmuls, or one when the forward's ``output`` is given: ``x⁺W⁺ + x⁻W⁻ =
    (x·Wᵀ + |x|·|W|ᵀ) / 2`` with ``x·Wᵀ = y − b``. Only pass ``output`` if the forward computed it from these very
    ``inputs`` and ``weight`` in this precision (not under a lower-precision autocast).

    The stabiliser is the reference's ``+1e-9`` without its zero mask: the denominator is never negative, and where
    it is exactly 0 every contribution to it is 0, so the masked entries would only ever be multiplied by 0.

    Args:
        inputs: ``(..., in_features)`` input of the linear layer.
        weight: ``(out_features, in_features)``.
        relevance: ``(..., out_features)`` relevance of the outputs.
        output: ``(..., out_features)`` the layer's forward output ``x·Wᵀ + b`` (optional).
        bias: ``(out_features,)`` the layer's bias, if it has one and ``output`` is given.

    Returns:
        ``(..., in_features)`` relevance of the inputs.
    """
    shape = inputs.shape
    flat = inputs.reshape(-1, shape[-1])
    positive_weight = weight.clamp(min=0)
    negative_weight = weight - positive_weight
    positive_inputs = flat.clamp(min=0)
    negative_inputs = flat - positive_inputs
    if output is None:
        denominator = torch.addmm(positive_inputs @ positive_weight.T, negative_inputs, negative_weight.T)
        denominator.add_(EPSILON)
    else:
        # (y + |x|·|W|ᵀ)/2 − b/2 + ε, floored at ε: rounding can push a true 0 slightly below it.
        denominator = torch.addmm(output.reshape(-1, output.shape[-1]), flat.abs(), weight.abs().T, beta=0.5, alpha=0.5)
        offset = -EPSILON if bias is None else bias * 0.5 - EPSILON
        denominator.sub_(offset).clamp_(min=EPSILON)
    scaled = relevance.reshape(-1, relevance.shape[-1]) / denominator
    shares = (scaled @ positive_weight).mul_(positive_inputs)
    return shares.addcmul_(negative_inputs, scaled @ negative_weight).view(shape)


def matmul_relprop(
    left: Tensor, right: Tensor, relevance: Tensor, product: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """LRP-z rule through ``Z = left @ right`` for both operands (each gets the full share; callers halve).

    Args:
        left: ``(..., n, k)``.
        right: ``(..., k, m)``.
        relevance: ``(..., n, m)`` relevance of ``Z``.
        product: ``left @ right`` if the caller already has it.

    Returns:
        The relevance of ``left`` ``(..., n, k)`` and of ``right`` ``(..., k, m)``.
    """
    scaled = safe_divide(relevance, left @ right if product is None else product)
    return left * (scaled @ right.transpose(-1, -2)), right * (left.transpose(-1, -2) @ scaled)


def add_relprop(first: Tensor, second: Tensor, relevance: Tensor) -> tuple[Tensor, Tensor]:
    """Relevance through a skip connection ``first + second``, normalised per example.

    The z-rule gives ``a = first·R/Z`` and ``b = second·R/Z``; then, per example, the shares are rescaled so that
    ``a`` sums to ``|Σa| / (|Σa| + |Σb|) · ΣR`` and ``b`` to the rest, which keeps relevance conserved across the
    residual (Chefer et al., Sec. 3, "relevance and skip connections"). Sums run over every dimension but the
    first (the batch), unlike the reference code, which sums over the batch too.
    """
    scaled = safe_divide(relevance, first + second)
    share_first = first * scaled
    share_second = second * scaled
    dims = tuple(range(1, relevance.dim()))
    sum_first = share_first.sum(dim=dims, keepdim=True)
    sum_second = share_second.sum(dim=dims, keepdim=True)
    total = relevance.sum(dim=dims, keepdim=True)
    magnitude = sum_first.abs() + sum_second.abs()
    target_first = safe_divide(sum_first.abs(), magnitude) * total
    target_second = safe_divide(sum_second.abs(), magnitude) * total
    return share_first * safe_divide(target_first, sum_first), share_second * safe_divide(target_second, sum_second)


def masked_scores_relprop(scores: Tensor, relevance: Tensor) -> Tensor:
    """Relevance of the attention scores through the additive attention mask ``scores + mask``.

    Chefer et al.'s BERT code propagates through this addition with the skip-connection rule; with the mask 0 on
    real tokens the mask gets nothing and the scores get ``scores·R/scores``, renormalised (per example here) to
    the relevance that entered. Padded keys carry no relevance, so padding does not change a row's result.

    Args:
        scores: ``(batch, heads, n, n)`` scaled attention scores ``Q·Kᵀ/√d`` before the mask.
        relevance: ``(batch, heads, n, n)`` relevance of the masked scores.
    """
    share = own_share(scores, relevance)
    dims = tuple(range(1, relevance.dim()))
    total = relevance.sum(dim=dims, keepdim=True)
    share_sum = share.sum(dim=dims, keepdim=True)
    target = safe_divide(share_sum.abs(), share_sum.abs()) * total
    return share * safe_divide(target, share_sum)


def clone_relprop(value: Tensor, relevances: Sequence[Tensor]) -> Tensor:
    """Relevance of a tensor that fed several branches: the branches' relevances, summed.

    As in the reference code (``x · Σ_i r_i / x``, stabilised), entries where the tensor is exactly 0 get none.
    """
    total = relevances[0]
    for relevance in relevances[1:]:
        total = total + relevance
    return own_share(value, total)


def split_heads(tensor: Tensor, num_heads: int) -> Tensor:
    """``(batch, n, heads·d)`` → ``(batch, heads, n, d)``."""
    batch, length, width = tensor.shape
    return tensor.view(batch, length, num_heads, width // num_heads).transpose(1, 2)


def merge_heads(tensor: Tensor) -> Tensor:
    """``(batch, heads, n, d)`` → ``(batch, n, heads·d)``."""
    batch, heads, length, depth = tensor.shape
    return tensor.transpose(1, 2).reshape(batch, length, heads * depth)


@dataclass(frozen=True)
class BlockActivations:
    """What one Transformer block computed in the forward pass, as LRP needs it (all ``(batch, n, ·)``).

    Attributes:
        hidden: the block's input (the first skip connection's other operand).
        attention_input: the input of the query/key/value projections (``hidden`` after LayerNorm in pre-LN
            blocks, ``hidden`` itself in post-LN blocks).
        query, key, value: outputs of the three projections, heads merged.
        probabilities: attention probabilities ``(batch, heads, n, n)``.
        context: input of the attention output projection (``A·V``, heads merged).
        attention_out: output of the attention output projection.
        ffn_input: input of the first feed-forward layer.
        ffn_pre: output of the first feed-forward layer (before the activation).
        ffn_hidden: input of the second feed-forward layer (after the activation).
        ffn_out: output of the second feed-forward layer.
        forward_precision: the tensors are what the forward computed, in their own dtype (False once upcast from a
            half-precision autocast forward); only then are layer outputs reused as products in the LRP rules.
    """

    hidden: Tensor
    attention_input: Tensor
    query: Tensor
    key: Tensor
    value: Tensor
    probabilities: Tensor
    context: Tensor
    attention_out: Tensor
    ffn_input: Tensor
    ffn_pre: Tensor
    ffn_hidden: Tensor
    ffn_out: Tensor
    forward_precision: bool = True

    def map_tensors(self, function: Callable[[Tensor], Tensor]) -> BlockActivations:
        """The same activations with ``function`` applied to every tensor (e.g. row selection)."""
        changed: dict[str, Any] = {name: function(tensor) for name, tensor in self.tensors().items()}
        return replace(self, **changed)

    def tensors(self) -> dict[str, Tensor]:
        """The tensor fields, by name."""
        values = {item.name: getattr(self, item.name) for item in fields(self)}
        return {name: value for name, value in values.items() if isinstance(value, Tensor)}


class Affine(NamedTuple):
    """A linear layer's parameters: ``weight`` ``(out, in)`` and ``bias`` ``(out,)`` or ``None``."""

    weight: Tensor
    bias: Tensor | None


@dataclass(frozen=True)
class BlockWeights:
    """The parameters of one block's six linear layers."""

    query: Affine
    key: Affine
    value: Affine
    attention_output: Affine
    ffn_in: Affine
    ffn_out: Affine


def _linear(inputs: Tensor, layer: Affine, relevance: Tensor, output: Tensor, exact: bool) -> Tensor:
    """:func:`linear_relprop` through ``layer``, reusing the forward's ``output`` when ``exact``."""
    if exact:
        return linear_relprop(inputs, layer.weight, relevance, output, layer.bias)
    return linear_relprop(inputs, layer.weight, relevance)


def block_relprop(
    acts: BlockActivations,
    weights: BlockWeights,
    relevance: Tensor,
    num_heads: int,
    norm_first: bool,
    propagate_below: bool = True,
    masked: bool = False,
) -> tuple[Tensor | None, Tensor]:
    """Propagate relevance through one block, from its output to its input.

    Args:
        acts: the block's forward activations.
        weights: the block's linear weights.
        relevance: ``(batch, n, hidden)`` relevance of the block's output.
        num_heads: attention heads.
        norm_first: pre-LayerNorm block (ViT) if True, post-LayerNorm (BERT family) if False.
        propagate_below: if False, stop once the attention relevance is known (the input relevance is not needed).
        masked: the scores pass through an additive attention mask (text models; see
            :func:`masked_scores_relprop`).

    Returns:
        The relevance of the block's input (``None`` if ``propagate_below`` is False) and the relevance of the
        attention probabilities ``(batch, heads, n, n)`` (the "cam" of Chefer et al.).
    """
    exact = acts.forward_precision
    # Second skip connection: out = [LN](residual + FFN(...)).
    residual = acts.hidden + acts.attention_out if norm_first else acts.ffn_input
    relevance_ffn, relevance_residual = add_relprop(acts.ffn_out, residual, relevance)
    relevance_ffn = _linear(acts.ffn_hidden, weights.ffn_out, relevance_ffn, acts.ffn_out, exact)
    relevance_ffn = _linear(acts.ffn_input, weights.ffn_in, relevance_ffn, acts.ffn_pre, exact)
    relevance_mid = clone_relprop(residual, (relevance_ffn, relevance_residual))

    # First skip connection: mid = [LN](hidden + Attention(...)).
    relevance_attention, relevance_skip = add_relprop(acts.attention_out, acts.hidden, relevance_mid)
    relevance_context = _linear(acts.context, weights.attention_output, relevance_attention, acts.attention_out, exact)

    value = split_heads(acts.value, num_heads)
    relevance_probabilities, relevance_value = matmul_relprop(
        acts.probabilities,
        value,
        split_heads(relevance_context, num_heads),
        split_heads(acts.context, num_heads) if exact else None,
    )
    relevance_probabilities = relevance_probabilities / 2
    if not propagate_below:
        return None, relevance_probabilities
    relevance_value = relevance_value / 2

    query = split_heads(acts.query, num_heads)
    key = split_heads(acts.key, num_heads)
    key_t = key.transpose(-1, -2)
    product = query @ key_t
    relevance_scores = relevance_probabilities  # the softmax passes relevance unchanged
    if masked:
        relevance_scores = masked_scores_relprop(product / math.sqrt(query.shape[-1]), relevance_scores)
    relevance_query, relevance_key_t = matmul_relprop(query, key_t, relevance_scores, product)
    relevance_query = merge_heads(relevance_query / 2)
    relevance_key = merge_heads(relevance_key_t.transpose(-1, -2) / 2)
    relevance_value = merge_heads(relevance_value)

    relevance_projections = clone_relprop(
        acts.attention_input,
        (
            _linear(acts.attention_input, weights.query, relevance_query, acts.query, exact),
            _linear(acts.attention_input, weights.key, relevance_key, acts.key, exact),
            _linear(acts.attention_input, weights.value, relevance_value, acts.value, exact),
        ),
    )
    relevance_input = clone_relprop(acts.hidden, (relevance_projections, relevance_skip))
    return relevance_input, relevance_probabilities


def head_relprop(head_inputs: Sequence[Tensor], head_weights: Sequence[Tensor], relevance: Tensor) -> Tensor:
    """Propagate relevance from the logits through the classification head to the first token's vector.

    Args:
        head_inputs: the input of each head linear layer, in forward order; the first is the first token's vector
            ``(batch, hidden)``.
        head_weights: the matching weight matrices.
        relevance: ``(batch, num_labels)`` relevance of the logits (one-hot of the target in Chefer et al.).

    Returns:
        ``(batch, hidden)`` relevance of the first token's vector.
    """
    for inputs, weight in zip(reversed(head_inputs), reversed(head_weights), strict=True):
        relevance = linear_relprop(inputs, weight, relevance)
    first = head_inputs[0]
    return own_share(first, relevance)


def attention_relevances(
    blocks: Sequence[BlockActivations],
    weights: Sequence[BlockWeights],
    head_inputs: Sequence[Tensor],
    head_weights: Sequence[Tensor],
    logit_relevance: Tensor,
    num_heads: int,
    norm_first: bool,
    start_layer: int = 0,
    masked: bool = False,
    head_paths: Sequence[tuple[int, int]] | None = None,
    head_shares: Sequence[Tensor] | None = None,
) -> list[Tensor | None]:
    """LRP relevance of every block's attention probabilities, from the target logit down to ``start_layer``.

    Args:
        blocks: activations of each block, input side first.
        weights: weights of each block.
        head_inputs: inputs of the head's linear layers (see :func:`head_relprop`).
        head_weights: weights of the head's linear layers.
        logit_relevance: ``(batch, num_labels)`` starting relevance (one-hot of each row's target; a zero row
            yields zero relevance).
        num_heads: attention heads.
        norm_first: pre-LayerNorm blocks (ViT) or post-LayerNorm blocks (BERT family).
        start_layer: the lowest block whose attention relevance is needed; blocks below are not visited.
        masked: the attention scores pass through an additive mask (text models).
        head_paths: per head ``(token it reads, number of its linears in head_inputs)``; ``None``: one head on the
            first token. DeiT with a teacher has two heads whose logits the model averages.
        head_shares: per head ``(batch, 1)`` share of the logit relevance, for several heads: each head's share
            of the summed target logits, normalised by magnitude as the skip-connection rule of Chefer et al.
            (``|z_h| / Σ|z|``), so the shares sum to 1.

    Returns:
        One ``(batch, heads, n, n)`` tensor per block (``None`` below ``start_layer``).
    """
    relevance = sequence_head_relevance(
        blocks[-1].hidden, head_inputs, head_weights, logit_relevance, head_paths, head_shares
    )
    return blocks_relevances(blocks, weights, relevance, num_heads, norm_first, start_layer, masked).attention


def token_head_relprop(hidden: Tensor, weight: Tensor, relevance: Tensor) -> Tensor:
    """Propagate relevance from a token-classification head's logits to the last hidden states.

    A token classifier (``*ForTokenClassification``) applies one linear layer to every token's last hidden state;
    its logits are ``(batch, n, num_labels)``. The αβ rule with α=1, β=0 (bias ignored) runs per token, exactly as
    :func:`head_relprop` does for the first token of a sequence head, so a token's relevance stays at that token.

    Args:
        hidden: ``(batch, n, hidden)`` the head's input (the encoder's last hidden states).
        weight: ``(num_labels, hidden)`` the head's weight.
        relevance: ``(batch, n, num_labels)`` relevance of the logits: for a span, 1 at each of its tokens' explained
            label and 0 elsewhere (the one-hot of Chefer et al., one per token of the span); zero rows give zero.

    Returns:
        ``(batch, n, hidden)`` relevance of the last hidden states.
    """
    return own_share(hidden, linear_relprop(hidden, weight, relevance))


class Relevances(NamedTuple):
    """What an LRP pass through the blocks gives: ``attention``, the relevance of each block's attention probabilities
    (``None`` below ``start_layer``), and ``below``, the relevance of the input of the block at ``start_layer``
    ``(batch, n, hidden)`` when it was asked (``None`` otherwise)."""

    attention: list[Tensor | None]
    below: Tensor | None


def blocks_relevances(
    blocks: Sequence[BlockActivations],
    weights: Sequence[BlockWeights],
    relevance: Tensor,
    num_heads: int,
    norm_first: bool,
    start_layer: int = 0,
    masked: bool = False,
    to_input: bool = False,
) -> Relevances:
    """LRP relevance of every block's attention probabilities, from the relevance of the last block's output down,
    and with ``to_input`` the relevance of the input of block ``start_layer`` as well (``start_layer`` 0: the input of
    the first block, which Chefer et al.'s full LRP reads).

    Args:
        blocks: activations of each block, input side first.
        weights: weights of each block.
        relevance: ``(batch, n, hidden)`` relevance of the last block's output (from :func:`sequence_head_relevance`
            at the tokens a sequence head reads, or :func:`token_head_relprop` for a token head).
        num_heads: attention heads.
        norm_first: pre-LayerNorm blocks (ViT) or post-LayerNorm blocks (BERT family).
        start_layer: the lowest block visited.
        masked: the attention scores pass through an additive mask (text models).
        to_input: also propagate through block ``start_layer`` to its input.

    Returns:
        :class:`Relevances`: one ``(batch, heads, n, n)`` tensor per block (``None`` below ``start_layer``), and the
        input's relevance when asked.
    """
    cams: list[Tensor | None] = [None] * len(blocks)
    below: Tensor | None = None
    for index in range(len(blocks) - 1, start_layer - 1, -1):
        below, cams[index] = block_relprop(
            blocks[index],
            weights[index],
            relevance,
            num_heads,
            norm_first,
            propagate_below=to_input or index > start_layer,
            masked=masked,
        )
        if below is None:
            break
        relevance = below
    return Relevances(cams, below if to_input else None)


def sequence_head_relevance(
    hidden: Tensor,
    head_inputs: Sequence[Tensor],
    head_weights: Sequence[Tensor],
    logit_relevance: Tensor,
    head_paths: Sequence[tuple[int, int]] | None = None,
    head_shares: Sequence[Tensor] | None = None,
) -> Tensor:
    """The relevance of the last block's output ``(batch, n, hidden)`` (shaped like ``hidden``) from a sequence
    head's logits: each head's share at the token it reads (see :func:`attention_relevances`)."""
    relevance = torch.zeros_like(hidden)
    paths = ((0, len(head_inputs)),) if head_paths is None else head_paths
    shares = [None] * len(paths) if head_shares is None else list(head_shares)
    first = 0
    for (token, count), share in zip(paths, shares, strict=True):
        path_relevance = logit_relevance if share is None else logit_relevance * share
        relevance[:, token] += head_relprop(
            head_inputs[first : first + count], head_weights[first : first + count], path_relevance
        )
        first += count
    return relevance
