"""The AttnLRP rules (Achtibat et al., "AttnLRP: Attention-Aware Layer-Wise Relevance Propagation for
Transformers", ICML 2024) as value-preserving modifications of the gradient.

AttnLRP is computed as a *modified gradient × input*: every rule below leaves the forward value of its tensor
exactly as it was (the custom autograd functions return their input, or the module's own output, unchanged) and
changes only what flows backward, so that ``input · modified_gradient`` of a layer is that layer's LRP relevance.
The functions here are pure: tensors in, tensors out, no hooks, no model. :mod:`explainers.architectures.rule_hooks`
attaches them to a model's own modules for the length of one pass.

Rule by rule (relevance ``R``, gradient ``g``, ``R_out = y ⊙ g_out`` at a layer's output ``y``):

* linear layers, biases, residual additions: the ε-rule with ε → 0 (LRP-0), which in gradient × input form *is*
  the plain gradient: ``R_in = x ⊙ Wᵀ(R_out / z)`` with ``z = Wx + b`` equals ``x ⊙ Wᵀ g_out``; a bias absorbs
  its share ``b ⊙ g_out``. Nothing to modify.
* elementwise activations: identity rule (paper Eq. 9) — :func:`identity_rule`.
* LayerNorm / RMSNorm: identity rule on the normalising statistic (paper Eq. 9, the statistic treated as a
  constant) — :func:`layer_norm_rule`, :func:`ratio_rule`.
* the attention matmuls ``Q·Kᵀ`` and ``A·V`` and gated products: uniform rule (paper Eq. 7) —
  :func:`uniform_rule`.
* softmax: the paper's softmax rule (Proposition 3.1); its gradient × input form is the plain gradient, see
  :func:`softmax_relevance`.

Equation numbers are those of the paper as the authors' code (``lxt``) cites them.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.autograd import Function

#: The stabiliser of the identity rule's ratio ``f(x)/x`` (the authors' code adds 1e-10 as well).
EPSILON = 1e-10


def _stabilised(x: Tensor) -> Tensor:
    """``x + ε·sign(x)`` with ``sign(0) = 1``: never zero, and equal to ``x`` to ~1e-10 relative. A new tensor.

    Computed as ``|x| + ε`` with the sign of ``x + 0`` (which turns ``-0`` into ``+0``, so ``sign(-0) = 1`` too):
    three vectorised passes, bit-identical to ``x + where(x >= 0, ε, -ε)`` in float32 and several times faster
    on CPU, where ``torch.where`` with scalar branches is not vectorised.
    """
    return x.abs().add_(EPSILON).copysign_(x + 0.0)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


class _ScaledGradient(Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, factor: float) -> Tensor:
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return grad * ctx.factor, None


def uniform_rule(x: Tensor, factor: float) -> Tensor:
    """The uniform rule (paper Eq. 7) for an ``n``-linear product, on one of its operands: ``x`` unchanged forward,
    gradient multiplied by ``factor`` backward.

    For a bilinear product ``z = a·b`` (``Q·Kᵀ``, ``A·V``, ``gate ⊙ up``) gradient × input gives each operand the
    *whole* relevance (``Σ a ⊙ ∂z/∂a = Σ b ⊙ ∂z/∂b = z``); the uniform rule gives each half, ``R_a = R_b = R_z/2``,
    so the gradient into each operand is halved (``factor = 1/2``). In attention the query and key pass both
    matmuls (``/2`` at ``Q·Kᵀ`` and ``/2`` at ``A·V``, upstream of the softmax), hence ``factor = 1/4`` on
    ``q`` and ``k`` and ``1/2`` on ``v``.

    Args:
        x: any tensor.
        factor: the gradient's multiplier.

    Returns:
        A tensor equal to ``x`` whose gradient is ``factor ·`` the incoming one.
    """
    return _ScaledGradient.apply(x, factor)


class _RatioGradient(Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, y: Tensor) -> Tensor:
        ctx.save_for_backward(x, y)
        return y.view_as(y)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        x, y = ctx.saved_tensors
        dtype = _compute_dtype(grad.dtype)
        stabilised = _stabilised(x.to(dtype))
        ratio = torch.div(y.to(dtype), stabilised, out=stabilised)  # in place: one full-size tensor fewer
        # Out of place: under ``is_grads_batched`` (vmap) ``grad`` is batched and ``ratio`` is not.
        return (grad.to(dtype) * ratio).to(grad.dtype), None


def ratio_rule(x: Tensor, y: Tensor) -> Tensor:
    """Pass ``y = f(x)`` (same shape, elementwise in effect) forward; backward, the gradient ``g · y/x``.

    Then ``x ⊙ ∂/∂x = y ⊙ g``: the relevance at the output ``R_out = y ⊙ g`` arrives unchanged at the input —
    the identity rule (paper Eq. 9), ``R_in = R_out``. Used for elementwise activations (see
    :func:`identity_rule`) and for RMSNorm: ``y = w ⊙ x · r(x)`` with ``r = 1/√(mean(x²)+ε)`` gives
    ``y/x = w·r``, exactly the gradient of RMSNorm with its statistic ``r`` held constant, whatever the
    variant's weight parametrisation (``w`` or ``1 + w``). The ratio is stabilised by ``ε = 1e-10`` as in the
    authors' code; at ``x = 0`` (where ``y = 0``) it is 0.

    Args:
        x: the module's input.
        y: its output, ``y.shape == x.shape``.

    Returns:
        ``y``, whose gradient flows to ``x`` (and not through the module's own graph).
    """
    if x.shape != y.shape:
        raise ValueError(f"the ratio rule needs an elementwise map, got input {tuple(x.shape)} -> {tuple(y.shape)}")
    return _RatioGradient.apply(x, y.detach())


def identity_rule(x: Tensor, y: Tensor) -> Tensor:
    """The identity rule (paper Eq. 9) for an elementwise activation ``y = f(x)`` (GELU, SiLU, tanh, ReLU, …):
    ``R_in = R_out``.

    In gradient × input form the gradient is ``g · f(x)/x``, so that ``x ⊙ (g · f(x)/x) = f(x) ⊙ g = R_out``.
    For ReLU it equals the plain gradient. See :func:`ratio_rule`.
    """
    return ratio_rule(x, y)


class _LayerNormGradient(Function):
    @staticmethod
    def forward(
        ctx: Any, x: Tensor, y: Tensor, inverse_std: Tensor, weight: Tensor | None, dims: tuple[int, ...]
    ) -> Tensor:
        if weight is None:
            ctx.save_for_backward(inverse_std)
        else:
            ctx.save_for_backward(inverse_std, weight)
        ctx.dims = dims
        return y.view_as(y)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None, None, None]:
        inverse_std, *weight = ctx.saved_tensors
        dtype = _compute_dtype(grad.dtype)
        scaled = grad.to(dtype)
        if weight:  # the product is a new tensor, centred in place
            scaled = scaled * weight[0].to(dtype)
            centred = scaled.sub_(scaled.mean(dim=ctx.dims, keepdim=True))
        else:  # ``scaled`` may be the incoming gradient itself: never written to
            centred = scaled - scaled.mean(dim=ctx.dims, keepdim=True)
        return centred.mul_(inverse_std).to(grad.dtype), None, None, None, None


def layer_norm_rule(x: Tensor, y: Tensor, weight: Tensor | None, eps: float, normalized_ndim: int = 1) -> Tensor:
    """The identity rule on LayerNorm's statistic (paper Eq. 9 applied to the division by the standard deviation):
    ``y = (x − mean(x)) / stop_grad(σ(x)) · w + b``.

    Forward: ``y`` unchanged. Backward: the gradient of that surrogate, ``(g·w − mean(g·w)) / σ``, with
    ``σ = √(var(x) + eps)`` (biased variance, over the normalised dimensions). The centring is linear in ``x``
    and the division by a constant is linear too, so relevance is conserved through it
    (``Σ x ⊙ ∂/∂x = Σ (y − b) ⊙ g``) except for the share ``b ⊙ g`` the bias absorbs.

    ``1/σ`` is the one LayerNorm's own kernel computes (``torch.native_layer_norm``'s ``rstd``, what
    ``nn.LayerNorm`` normalised with): the statistic of the forward itself, and on CPU several times faster than
    ``torch.var``'s Welford reduction, which made the rule's forward cost a tenth of a plain forward on MiniLM.

    Args:
        x: the LayerNorm's input ``(..., *normalized_shape)``.
        y: its output.
        weight: its elementwise weight (``None`` without affine parameters).
        eps: its epsilon.
        normalized_ndim: how many trailing dimensions are normalised.

    Returns:
        ``y`` with the rule's gradient flowing to ``x``.
    """
    dims = tuple(range(-normalized_ndim, 0))
    dtype = _compute_dtype(x.dtype)
    with torch.no_grad():
        _, _, inverse_std = torch.native_layer_norm(x.detach().to(dtype), x.shape[-normalized_ndim:], None, None, eps)
    return _LayerNormGradient.apply(x, y.detach(), inverse_std, None if weight is None else weight.detach(), dims)


def stop_gradient(x: Tensor) -> Tensor:
    """CP-LRP's treatment of the attention weights and gates (Ali et al. 2022): the tensor is a constant for the
    propagation (``x.detach()``), so all relevance of ``A·V`` goes to ``V`` and none through the softmax."""
    return x.detach()


def softmax_relevance(x: Tensor, s: Tensor, relevance_out: Tensor) -> Tensor:
    """The AttnLRP softmax rule (paper Proposition 3.1), explicitly: ``R_in = x ⊙ (R_out − s · Σ_j R_out_j)``.

    Why the implementation needs no modification at the softmax: with ``s = softmax(x)`` over the last dimension,
    the plain gradient is ``∂/∂x_i = s_i (g_i − Σ_j s_j g_j)``. With ``R_out = s ⊙ g`` (gradient × input at the
    output), ``x_i · ∂/∂x_i = x_i (s_i g_i − s_i Σ_j s_j g_j) = x_i (R_out_i − s_i Σ_j R_out_j)``: the plain
    gradient × input of the softmax *is* the rule. The rule does not conserve: per row it absorbs
    ``Σ_i R_out_i − Σ_i R_in_i`` (see :func:`softmax_absorption`), the way a bias does.

    Used by the tests and the absorption check; the modified-gradient pass never calls it.

    Args:
        x: ``(..., n)`` the softmax input (scaled scores plus the additive mask).
        s: ``(..., n)`` the softmax output.
        relevance_out: ``(..., n)`` relevance at ``s``.

    Returns:
        ``(..., n)`` relevance at ``x``; masked positions (``s = 0``) get 0.
    """
    total = relevance_out.sum(dim=-1, keepdim=True)
    inner = relevance_out - s * total
    # A masked position has s = 0 and R_out = 0: its relevance is 0 whatever the (very negative) mask value.
    return torch.where(s > 0, x * inner, torch.zeros_like(inner))


def softmax_absorption(x: Tensor, s: Tensor, relevance_out: Tensor) -> Tensor:
    """Relevance the softmax rule absorbs per row: ``Σ_i R_out_i − Σ_i R_in_i``, ``(...,)``.

    Expanding :func:`softmax_relevance`: ``Σ_i R_out_i · (1 − x_i) + (Σ_i s_i x_i) · Σ_j R_out_j`` — zero only
    in special cases, so AttnLRP's relevances of the inputs do not sum to the logit.
    """
    return relevance_out.sum(dim=-1) - softmax_relevance(x, s, relevance_out).sum(dim=-1)
