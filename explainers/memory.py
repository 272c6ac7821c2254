"""How much memory an explanation needs, estimated before it runs, and the per-request budget that refuses it.

The methods that read attention maps (``attention``, ``rollout``, ``gae``, ``relevance``) run eager attention, which
materialises ``heads × n × n`` probabilities in every layer; ``gae`` and ``relevance`` keep them (and more maps of
the same size) for every layer until their kernels ran, so their memory grows with ``n²``. The gradient methods
(``grad_x_input``, ``integrated_gradients``, ``attnlrp``, ``cp_lrp``) run on the model's fused attention when it
has one (:func:`~explainers.architectures.attention.fused_implementation`) and need only activations, which grow with
``n``; on a model loaded with eager attention (or DeBERTa, which has no fused attention) they keep the maps too.

:func:`estimate_bytes` models a method's peak above the loaded model as

    element bytes × rows × (layers × ((maps × heads + head_means) × n² + activations × n × (hidden + intermediate))
                            + transient × heads × n² + forward × n × (hidden + intermediate))

with the counts each method declares at its registration (:class:`~explainers.methods.registry.Footprint`, on eager
and on fused attention: :attr:`~explainers.methods.registry.Method.memory`), fitted to peaks measured with
``bench/explainers.py --memory`` (the figures and the fit are in the closing note of issue 19); it errs on the high
side. A method that runs forwards of its own (integrated gradients) is estimated for the rows of one of its passes
(:attr:`~explainers.methods.registry.Forwards.rows_per_pass`). A *budget* (``memory_budget_mib``
of :func:`explainers.explain` / :func:`explainers.explain_batch`, ``handler.memory_budget_mib`` when served) refuses,
before anything is allocated, every request whose estimate exceeds it, with a :class:`MemoryBudgetError` that gives
the estimate and the methods that fit.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .architectures.attention import fused_implementation
from .architectures.description import Architecture, model_config
from .errors import ExplainError
from .methods.registry import Footprint, Method, OptionValue, get_method


class MemoryBudgetError(ExplainError):
    """The explanation would need more memory than the per-request budget allows (refused before it ran)."""


@dataclass(frozen=True)
class ModelSize:
    """What the estimate reads of a model: its layer count, heads, widths and the bytes of one element."""

    layers: int
    heads: int
    hidden: int
    intermediate: int
    element_bytes: int
    fused: bool

    @classmethod
    def of(cls, model: nn.Module, arch: Architecture) -> ModelSize:
        """Read the sizes from ``model``'s config (the text config of a multimodal one) and parameters."""
        config: Any = model_config(model)
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        hidden = int(getattr(text, "hidden_size", 0) or 0)
        intermediate = next(
            (
                int(value)
                for key in ("intermediate_size", "n_inner", "hidden_dim")
                if (value := getattr(text, key, None))
            ),
            int(float(getattr(text, "mlp_ratio", 4)) * hidden),
        )
        dtype = next((parameter.dtype for parameter in model.parameters()), torch.float32)
        # Attention maps and softmaxes run in float32 at least (bf16/fp16 models upcast their softmax).
        element = max(4, torch.empty((), dtype=dtype).element_size())
        return cls(
            arch.num_layers, arch.num_heads, hidden, intermediate, element, fused_implementation(model) is not None
        )


def footprint(method: Method, fused: bool) -> Footprint:
    """The footprint ``method`` declares for a model with (``fused``) or without a fused attention."""
    if fused and method.memory.fused is not None:
        return method.memory.fused
    return method.memory.eager


def estimate_bytes(size: ModelSize, method: str, rows: int, length: int, options: Mapping[str, OptionValue]) -> int:
    """Estimated peak bytes above the loaded model of explaining ``rows`` inputs of ``length`` tokens with ``method``.

    A method that runs forwards of its own is estimated for the rows of one of its passes (integrated gradients runs
    ``rows × steps`` rows per pass, bounded by ``internal_batch_size``).

    Args:
        size: what the estimate reads of the model (``explainers.memory.ModelSize.of(model, describe(model))``):
            layers, heads, widths, bytes per element, whether it runs fused attention.
        method: the registry name of the method.
        rows: the rows explained together.
        length: the tokens per row (padded length).
        options: the method's options, defaults filled in (integrated gradients' ``n_steps`` sets its rows).

    Raises:
        UnknownMethodError: for a name that is not registered.
    """
    chosen = get_method(method)
    if chosen.forwards is not None:
        rows = chosen.forwards.rows_per_pass(rows, options)
    shape = footprint(chosen, size.fused)
    squared = float(length) * float(length)
    width = float(length) * (size.hidden + size.intermediate)
    per_layer = (shape.maps * size.heads + shape.head_means) * squared + shape.activations * width
    at_once = shape.transient * size.heads * squared + shape.forward * width
    return int(size.element_bytes * rows * (size.layers * per_layer + at_once))


def mib(count: int) -> str:
    """``count`` bytes as ``"1,234 MiB"``."""
    return f"{count / 2**20:,.0f} MiB"


def check_budget(
    size: ModelSize,
    method: str,
    rows: int,
    length: int,
    options: Mapping[str, OptionValue],
    budget_mib: int | None,
    alternatives: Iterable[str] = (),
) -> None:
    """Refuse (before anything is allocated) an explanation whose estimate exceeds ``budget_mib``.

    Raises:
        MemoryBudgetError: naming the estimate, the budget, the length, and the ``alternatives`` that fit.
    """
    if budget_mib is None:
        return
    budget = budget_mib * 2**20
    needed = estimate_bytes(size, method, rows, length, options)
    if needed <= budget:
        return
    fitting = sorted(
        name for name in alternatives if name != method and estimate_bytes(size, name, rows, length, {}) <= budget
    )
    why = (
        "its attention maps grow with the square of the length"
        if footprint(get_method(method), size.fused).quadratic
        else "its activations grow with the length"
    )
    choices = f"methods that fit: {', '.join(fitting)}; " if fitting else ""
    raise MemoryBudgetError(
        f"method {method!r} needs about {mib(needed)} for {rows} x {length} tokens ({why}), over the per-request "
        f"memory budget of {mib(budget)}; {choices}or send fewer tokens"
    )
