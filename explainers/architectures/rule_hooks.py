"""Attach the AttnLRP (or CP-LRP) rules of :mod:`explainers.rules.attnlrp` to a model's own modules for one pass.

Nothing of torch or transformers is replaced: the rules are forward hooks (and pre-hooks) on the model's module
*instances*, registered on the caller's ``ExitStack`` and removed when it closes, also on exceptions. Each hook
returns a tensor whose forward value is exactly the module's (so logits, attention probabilities and every other
captured value are unchanged) and whose gradient is the rule's. The hooks only shape the autograd graph of the
forward they run in: the backward of that graph gives the modified gradient, and no other pass is affected.

The modules are found by type, not by per-architecture paths:

* ``nn.LayerNorm`` → :func:`~explainers.rules.attnlrp.layer_norm_rule`;
* RMSNorm (``nn.RMSNorm`` or a class named ``…RMSNorm``) → :func:`~explainers.rules.attnlrp.ratio_rule`;
* elementwise activation modules (torch's GELU/SiLU/tanh/ReLU family, every ``transformers.activations`` class)
  → :func:`~explainers.rules.attnlrp.identity_rule`;
* gated MLPs (a module with ``gate_proj``, ``up_proj`` and ``down_proj``; or ModernBERT's ``Wi``/``Wo`` GLU whose
  ``Wi`` holds both halves): AttnLRP halves the gradient of the product (the uniform rule, at the input of the
  output projection); CP-LRP stops the gradient into the gate (the activated factor);
* a functional activation between two linear layers of the classification head (RoBERTa's ``torch.tanh``,
  DistilBERT's ReLU): the identity rule from the first layer's output to the second's input;
* attention: the uniform rule on the operands of ``Q·Kᵀ`` and ``A·V`` (gradient ×1/4 on the query and key,
  ×1/2 on the value) or, for CP-LRP, query and key detached; see :data:`PRODUCT_RULES`. It is applied by an
  observer of the generic attention capture (:mod:`explainers.architectures.attention`) to the ``(query, key, value)``
  every attention call hands the architecture's own eager attention, so it needs no per-architecture paths.

Dropout needs nothing: the explainers run the model in eval mode.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from itertools import pairwise
from typing import Any, Literal

import torch
from torch import Tensor, nn

from ..rules import attnlrp
from .attention import AttentionCall, AttentionObserver
from .description import Architecture

Variant = Literal["attnlrp", "cp_lrp"]
"""The rule set: ``attnlrp`` (AttnLRP, Achtibat et al. 2024) or ``cp_lrp`` (CP-LRP, Ali et al. 2022). They differ only
in how relevance crosses a product of two activations (the attention matmuls, a gated MLP's ``gate ⊙ up``):
:data:`PRODUCT_RULES`."""

_TORCH_ACTIVATIONS = (
    nn.GELU,
    nn.SiLU,
    nn.Tanh,
    nn.ReLU,
    nn.ReLU6,
    nn.LeakyReLU,
    nn.Mish,
    nn.Hardswish,
    nn.ELU,
)


def is_elementwise_activation(module: nn.Module) -> bool:
    """Whether ``module`` is an elementwise activation that the identity rule applies to."""
    return isinstance(module, _TORCH_ACTIVATIONS) or type(module).__module__ == "transformers.activations"


def is_rms_norm(module: nn.Module) -> bool:
    """Whether ``module`` is an RMSNorm (torch's or a transformers architecture's own class)."""
    return isinstance(module, nn.RMSNorm) or type(module).__name__.endswith("RMSNorm")


def _has(module: nn.Module, *names: str) -> bool:
    return all(isinstance(getattr(module, name, None), nn.Module) for name in names)


def is_gated_mlp(module: nn.Module) -> bool:
    """Whether ``module`` is a gated MLP ``down_proj(act(gate_proj(x)) * up_proj(x))`` (SwiGLU/GeGLU: Llama, Qwen,
    Mistral, Gemma)."""
    return _has(module, "gate_proj", "up_proj", "down_proj")


def is_chunked_glu(module: nn.Module) -> bool:
    """Whether ``module`` is a GLU whose input projection holds both halves, ``Wo(act(a) * b)`` with
    ``a, b = Wi(x).chunk(2)`` (ModernBERT)."""
    return _has(module, "Wi", "Wo", "act")


def _first_tensor(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor | None:
    for value in (*args, *kwargs.values()):
        if isinstance(value, Tensor):
            return value
    return None


def _output_rule(
    rule: Callable[[nn.Module, Tensor, Tensor], Tensor],
) -> Callable[[nn.Module, tuple[Any, ...], dict[str, Any], Any], Any]:
    """A forward hook applying ``rule(module, input, output)`` when the output is one tensor on the gradient path."""

    def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> Any:
        x = _first_tensor(args, kwargs)
        if x is None or not isinstance(output, Tensor) or not x.requires_grad:
            return None
        return rule(module, x, output)

    return hook


def _layer_norm(module: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    assert isinstance(module, nn.LayerNorm)
    return attnlrp.layer_norm_rule(x, y, module.weight, module.eps, len(module.normalized_shape))


def _elementwise(module: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    return attnlrp.ratio_rule(x, y) if x.shape == y.shape else y


def _gradient_scale(factor: float) -> Callable[[nn.Module, tuple[Any, ...]], tuple[Any, ...] | None]:
    def pre_hook(module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        if not args or not isinstance(args[0], Tensor):
            return None
        return (attnlrp.uniform_rule(args[0], factor), *args[1:])

    return pre_hook


def _detach_output(module: nn.Module, args: tuple[Any, ...], output: Any) -> Any:
    return output.detach() if isinstance(output, Tensor) else None


def _detach_first_half(module: nn.Module, args: tuple[Any, ...], output: Any) -> Any:
    """CP-LRP on a chunked GLU: the activated half (the gate) becomes a constant, the other half keeps its gradient."""
    if not isinstance(output, Tensor):
        return None
    first, second = output.chunk(2, dim=-1)
    return torch.cat([first.detach(), second], dim=-1)


def _uniform_operands(query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """AttnLRP's attention rule (uniform rule, paper Eq. 7, at both matmuls): the relevance of ``A·V`` is split equally
    between the attention weights and the value (gradient ×1/2 into both), and the relevance reaching the softmax input
    is split equally between query and key of ``Q·Kᵀ`` (×1/2 again), so query and key get ×1/4 and the value ×1/2.
    Scaling, the additive mask, rotary embeddings and the grouped-query repeat are linear and commute with these
    factors; the softmax keeps its plain gradient (the softmax rule)."""
    return attnlrp.uniform_rule(query, 0.25), attnlrp.uniform_rule(key, 0.25), attnlrp.uniform_rule(value, 0.5)


def _constant_weights(query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """CP-LRP's attention rule: query and key detached, so the attention weights are constants and ``A·V`` passes all
    relevance to the value."""
    return attnlrp.stop_gradient(query), attnlrp.stop_gradient(key), value


def _uniform_gate(module: nn.Module, hooks: ExitStack) -> None:
    """AttnLRP on a gated MLP: the uniform rule on the product, half the gradient to each factor (at the input of the
    output projection)."""
    down = module.get_submodule("down_proj" if is_gated_mlp(module) else "Wo")
    hooks.callback(down.register_forward_pre_hook(_gradient_scale(0.5)).remove)


def _constant_gate(module: nn.Module, hooks: ExitStack) -> None:
    """CP-LRP on a gated MLP: the gate (the activated factor) is a constant."""
    if is_gated_mlp(module):
        gate = module.get_submodule("gate_proj")
        hooks.callback(gate.register_forward_hook(_detach_output).remove)
    else:
        both = module.get_submodule("Wi")
        hooks.callback(both.register_forward_hook(_detach_first_half).remove)


@dataclass(frozen=True)
class ProductRules:
    """How a rule set carries relevance across products of two activations (values are unchanged in every case).

    Attributes:
        attention: the rule on the operands of one attention call, ``(query, key, value) → (query, key, value)``.
        gate: attaches the rule on a gated MLP's product (a module :func:`is_gated_mlp` or :func:`is_chunked_glu`) to
            the hook stack.
    """

    attention: Callable[[Tensor, Tensor, Tensor], tuple[Tensor, Tensor, Tensor]]
    gate: Callable[[nn.Module, ExitStack], None]


PRODUCT_RULES: dict[Variant, ProductRules] = {
    "attnlrp": ProductRules(_uniform_operands, _uniform_gate),
    "cp_lrp": ProductRules(_constant_weights, _constant_gate),
}
VARIANTS: tuple[Variant, ...] = tuple(PRODUCT_RULES)


def _attach_head_rules(arch: Architecture, hooks: ExitStack) -> None:
    """Identity rule for whatever elementwise function lies between consecutive linear layers of the head."""
    head = tuple(arch.head)
    groups: list[tuple[nn.Module, ...]] = []
    start = 0
    for _, length in arch.head_paths or ((0, len(head)),):  # one group of linears per head (DeiT has two)
        groups.append(head[start : start + length])
        start += length
    pairs = [pair for group in groups for pair in pairwise(group)]
    for first, second in pairs:
        seen: dict[str, Tensor] = {}

        def keep(module: nn.Module, args: tuple[Any, ...], output: Any, seen: dict[str, Tensor] = seen) -> None:
            if isinstance(output, Tensor):
                seen["z"] = output

        def link(module: nn.Module, args: tuple[Any, ...], seen: dict[str, Tensor] = seen) -> tuple[Any, ...] | None:
            z = seen.pop("z", None)
            if z is None or not args or not isinstance(args[0], Tensor) or args[0].shape != z.shape:
                return None
            if not z.requires_grad:
                return None
            return (attnlrp.identity_rule(z, args[0]), *args[1:])

        hooks.callback(first.register_forward_hook(keep).remove)
        hooks.callback(second.register_forward_pre_hook(link).remove)


class _AttentionRules(AttentionObserver):
    """The attention observer applying a rule set's attention rule (:class:`ProductRules`) to every attention
    call of the pass."""

    def __init__(self, operands: Callable[[Tensor, Tensor, Tensor], tuple[Tensor, Tensor, Tensor]]) -> None:
        self.operands = operands

    def before(self, call: AttentionCall, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        return self.operands(query, key, value)


def attach_rules(model: nn.Module, arch: Architecture, hooks: ExitStack, *, variant: Variant) -> AttentionObserver:
    """Attach ``variant``'s rules to ``model`` for the forward that follows; they are removed when ``hooks`` closes.

    The rules on the modules are forward hooks registered on ``hooks``; the attention rule is the returned observer,
    which the caller passes to :func:`explainers.architectures.attention.capturing_attention` for the same forward.

    Args:
        model: the classifier (inside :func:`explainers.capture.prepared_model`, so in eval mode).
        arch: its description.
        variant: ``attnlrp`` (AttnLRP, Achtibat et al. 2024) or ``cp_lrp`` (CP-LRP, Ali et al. 2022: AttnLRP's
            rules except that no relevance flows through the attention weights or the gates).
        hooks: where the hook handles are registered (closing it removes them).

    Returns:
        The attention observer that applies the attention rule to each attention call.
    """
    products = PRODUCT_RULES.get(variant)
    if products is None:
        raise ValueError(f"unknown LRP variant {variant!r}; valid: {', '.join(VARIANTS)}")
    for module in model.modules():
        if isinstance(module, nn.LayerNorm):
            hooks.callback(module.register_forward_hook(_output_rule(_layer_norm), with_kwargs=True).remove)
        elif is_rms_norm(module) or is_elementwise_activation(module):
            hooks.callback(module.register_forward_hook(_output_rule(_elementwise), with_kwargs=True).remove)
        if is_gated_mlp(module) or is_chunked_glu(module):
            products.gate(module, hooks)
    _attach_head_rules(arch, hooks)
    return _AttentionRules(products.attention)
