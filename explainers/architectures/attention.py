"""A generic attention capture for any transformers model, through the library's own extension point.

transformers 5 dispatches the attention of most architectures through ``AttentionInterface``: each attention
module looks up ``config._attn_implementation`` there and calls what it finds, falling back to its own modeling
file's ``eager_attention_forward``. This module registers **one new name**, :data:`CAPTURE_IMPLEMENTATION`, in
``AttentionInterface`` (and the eager mask builder under the same new name in ``AttentionMaskInterface``, so the
masks are the eager ones). No existing entry, class or module function is replaced. The registered function
delegates to the calling module's own ``eager_attention_forward`` (found from the module's class, walking its
MRO to the modeling module that defines one), so the forward is numerically that of eager attention (one
deliberate exception, for float64 models only, is described at :func:`_float32_safe`).

:func:`attention_implementation` switches a model (its config and every sub-config and submodule config) to
that name and back, also on exceptions. :func:`capturing_attention` does the same and, for the length of the
block, records each attention call in an :class:`AttentionCapture` and lets an observer act on it. Outside a
capture block (another thread, a nested forward the caller did not want recorded) the registered function is
plain eager attention. The active capture lives in a :class:`contextvars.ContextVar`, the only process-wide
object besides the registered name; nothing is stored on modules.

Calls are recorded **per call, not per module**: ALBERT runs one attention module for every layer, so a call is
identified by its order in the forward (:attr:`AttentionCall.index`) together with the module and how many times
that module was called before (:attr:`AttentionCall.repeat`).

Observer protocol (:class:`AttentionObserver`): for every attention call inside :func:`capturing_attention`,

1. ``observer.before(call, query, key, value)`` is called with the tensors the architecture hands its attention
   function: ``query (batch, heads, n, head_dim)``, ``key`` and ``value (batch, kv_heads, n, head_dim)``
   (``kv_heads < heads`` under grouped-query attention; the eager function repeats them). It returns the
   ``(query, key, value)`` to use; returning other tensors of the same shapes and values (for example tensors
   wrapped in an identity-forward autograd function that rescales or stops their gradient, as the AttnLRP rules
   do) changes the backward pass only. The forward value must stay the same: the capture does not check it.
2. The architecture's eager attention runs on them.
3. ``observer.after(call, attn_output, attn_weights)`` sees the eager function's outputs: ``attn_output
   (batch, n, heads, head_dim)`` and the probabilities ``attn_weights (batch, heads, n, n)``, both still in the
   autograd graph.

The observer's own state is the observer object, which belongs to the caller's block: nothing survives the block.

**The fused capture** (for the methods that need gradients through attention but no maps: gradient × input,
integrated gradients, AttnLRP, CP-LRP). ``capturing_attention(model, fused=name)`` switches the model to a second
new name, :data:`FUSED_CAPTURE_IMPLEMENTATION`, whose function hands the observer's ``(query, key, value)`` to the
implementation the model was loaded with (``name``, from :func:`fused_implementation`: ``sdpa``, or any other
implementation registered in both ``AttentionInterface`` and ``AttentionMaskInterface``), looked up in the
interface at each call, never replaced; the masks come from that implementation's own mask builder. The fused
kernels keep no ``(batch, heads, n, n)`` maps for the backward, so memory grows with ``n``, not ``n²``. ``before``
works as above (AttnLRP's uniform rule is a gradient scaling of q, k and v, CP-LRP's a stop-gradient into q and k:
both act on the operands, so they are the same on any implementation); ``after`` is not called (fused kernels
return no probabilities), and ``keep`` must be ``"none"``. Outside a capture block the fused name runs ``sdpa``.

DeBERTa-v2/v3 (``DisentangledSelfAttention``) does not route through the interface. Inside a capture block it gets
a small adapter with the same contract, made of forward hooks that are removed on exit: ``before`` is called from
the hooks on ``query_proj``, ``key_proj`` and ``value_proj`` (each hook replaces its projection's output; the
observer receives the three as ``(batch, heads, n, head_dim)`` views and may return replacements, which are
reshaped back). Because DeBERTa reuses the projected query and key in its relative-position terms (content →
position and position → content), a replacement applies there too. ``after`` is called from the hook on the
module itself with the context layer reshaped to ``(batch, n, heads, head_dim)`` and the probabilities taken at
the attention-probability dropout (identity in eval mode), ``(batch, heads, n, n)``. DeBERTa's attention has no
fused form in transformers, so it always runs its own (eager) attention: :func:`fused_implementation` is ``None``
for it and its memory grows with ``n²`` whatever the method.
"""

from __future__ import annotations

import contextvars
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any, Literal, cast

import torch
from torch import Tensor, nn
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, eager_mask

from ..errors import UnsupportedModelError

CAPTURE_IMPLEMENTATION = "explainers_capture"
"""The name registered in ``AttentionInterface`` and ``AttentionMaskInterface`` (a new name; nothing replaced)."""

FUSED_CAPTURE_IMPLEMENTATION = "explainers_capture_fused"
"""The second new name: the observer around the model's own fused attention (see the module docstring)."""

_OURS = frozenset({CAPTURE_IMPLEMENTATION, FUSED_CAPTURE_IMPLEMENTATION})

Keep = Literal["none", "mean", "heads"]
"""What a capture keeps of each call's probabilities: nothing, the head mean (detached, ``(batch, n, n)``: all
rollout and raw attention need), or the per-head probabilities still in the graph (``(batch, heads, n, n)``: for
methods that differentiate with respect to them)."""


@dataclass(frozen=True)
class AttentionCall:
    """One attention call of a captured forward.

    Attributes:
        index: order of the call in the forward (0 for the first attention call).
        module: the calling attention module.
        repeat: how many times this same module was called earlier in the forward (0 unless weights are shared).
    """

    index: int
    module: nn.Module
    repeat: int


class AttentionObserver:
    """Acts on each attention call of a capture; the defaults change nothing (subclass and override)."""

    def before(self, call: AttentionCall, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Return the ``(query, key, value)`` the attention runs on (same shapes and forward values).

        Args:
            call: which attention call this is (:class:`AttentionCall`).
            query: the call's queries, as the architecture passes them to its attention function.
            key: its keys.
            value: its values.
        """
        return query, key, value

    def after(self, call: AttentionCall, attn_output: Tensor, attn_weights: Tensor) -> None:
        """See the call's output and probabilities (not called under the fused capture, which has no probabilities).

        Args:
            call: which attention call this is (:class:`AttentionCall`).
            attn_output: the call's output ``(batch, n, heads, head_dim)``.
            attn_weights: its probabilities ``(batch, heads, n, n)``.
        """


class AttentionCapture:
    """What one :func:`capturing_attention` block recorded.

    Attributes:
        keep: what is kept of each call's probabilities (see :data:`Keep`).
        observer: the observer, or ``None``.
        fused: the implementation the fused capture delegates to (``None``: the architecture's eager attention).
        calls: every attention call, in order.
        probabilities: per call, as ``keep`` says (empty list for ``"none"``).
    """

    def __init__(self, keep: Keep, observer: AttentionObserver | None, fused: str | None = None) -> None:
        self.keep = keep
        self.observer = observer
        self.fused = fused
        self.calls: list[AttentionCall] = []
        self.probabilities: list[Tensor] = []
        self._repeats: dict[int, int] = {}

    def start_call(self, module: nn.Module) -> AttentionCall:
        """Number a new call of ``module``."""
        repeat = self._repeats.get(id(module), 0)
        self._repeats[id(module)] = repeat + 1
        call = AttentionCall(index=len(self.calls), module=module, repeat=repeat)
        self.calls.append(call)
        return call

    def before(self, call: AttentionCall, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Let the observer replace the call's inputs.

        Args:
            call: which attention call this is.
            query: the call's queries.
            key: its keys.
            value: its values.

        Returns:
            The ``(query, key, value)`` the attention runs on.
        """
        if self.observer is None:
            return query, key, value
        return self.observer.before(call, query, key, value)

    def after(self, call: AttentionCall, attn_output: Tensor, attn_weights: Tensor) -> None:
        """Record the call's probabilities and show the outputs to the observer.

        Args:
            call: which attention call this is.
            attn_output: the call's output ``(batch, n, heads, head_dim)``.
            attn_weights: its probabilities ``(batch, heads, n, n)``.
        """
        if self.keep == "heads":
            self.probabilities.append(attn_weights)
        elif self.keep == "mean":
            self.probabilities.append(attn_weights.detach().mean(dim=1))
        if self.observer is not None:
            self.observer.after(call, attn_output, attn_weights)


_ACTIVE: contextvars.ContextVar[AttentionCapture | None] = contextvars.ContextVar("explainers_capture", default=None)


def eager_attention_of(module: nn.Module) -> Callable[..., tuple[Tensor, Tensor]]:
    """The ``eager_attention_forward`` of the modeling module that defines ``module``'s class (or a base class).

    Raises:
        UnsupportedModelError: if no class in the MRO comes from a modeling module with one.
    """
    for cls in type(module).__mro__:
        found = getattr(sys.modules.get(cls.__module__), "eager_attention_forward", None)
        if callable(found):
            return found
    raise UnsupportedModelError(
        f"{type(module).__name__} calls the attention interface, but its modeling module defines no "
        "eager_attention_forward to delegate to"
    )


_FLOAT32_LOWEST = torch.finfo(torch.float32).min


def _float32_safe(attention_mask: Tensor | None) -> Tensor | None:
    """A float64 additive mask with its ``-1.8e308`` entries raised to float32's lowest value.

    Several architectures' eager attention (Llama, Mistral, Gemma, ModernBERT, ...) runs its softmax in float32:
    in a float64 model, the float64 mask value becomes ``-inf`` there, and a query that sees no key (a padding
    query under a sliding window or left padding) gets NaN probabilities, which ``0 · NaN`` then spreads to the
    real tokens of the next layer. With the mask at float32's lowest value every query that sees a real key gets
    bit-identical probabilities (the masked terms are exactly 0 either way) and a fully masked query gets uniform
    ones instead of NaN. Masks of any other dtype are passed unchanged.
    """
    if attention_mask is None or attention_mask.dtype != torch.float64:
        return attention_mask
    return attention_mask.clamp(min=_FLOAT32_LOWEST)


def _capturing_attention(
    module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None, **kwargs: Any
) -> tuple[Tensor, Tensor]:
    """The function registered as :data:`CAPTURE_IMPLEMENTATION`: the module's own eager attention, recorded."""
    eager = eager_attention_of(module)
    attention_mask = _float32_safe(attention_mask)
    capture = _ACTIVE.get()
    if capture is None:
        return eager(module, query, key, value, attention_mask, **kwargs)
    call = capture.start_call(module)
    query, key, value = capture.before(call, query, key, value)
    attn_output, attn_weights = eager(module, query, key, value, attention_mask, **kwargs)
    capture.after(call, attn_output, attn_weights)
    return attn_output, attn_weights


#: What the fused name runs when no capture is active (another thread, during a capture block of this model).
_FUSED_FALLBACK = "sdpa"


def _fused_delegate() -> tuple[str, AttentionCapture | None]:
    capture = _ACTIVE.get()
    if capture is None or capture.fused is None:
        return _FUSED_FALLBACK, capture
    return capture.fused, capture


def _capturing_fused_attention(
    module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None, **kwargs: Any
) -> tuple[Tensor, Tensor | None]:
    """The function registered as :data:`FUSED_CAPTURE_IMPLEMENTATION`: the loaded implementation, observed."""
    name, capture = _fused_delegate()
    delegate = cast(Callable[..., tuple[Tensor, Tensor | None]], AttentionInterface._global_mapping[name])
    if capture is None:
        return delegate(module, query, key, value, attention_mask, **kwargs)
    call = capture.start_call(module)
    query, key, value = capture.before(call, query, key, value)
    return delegate(module, query, key, value, attention_mask, **kwargs)


def _fused_mask(*args: Any, **kwargs: Any) -> Any:
    """The mask builder registered as :data:`FUSED_CAPTURE_IMPLEMENTATION`: the loaded implementation's own."""
    name, _ = _fused_delegate()
    builder = cast(Callable[..., Any], AttentionMaskInterface._global_mapping[name])
    return builder(*args, **kwargs)


def _register_name(name: str, attention: Callable[..., Any], mask: Callable[..., Any]) -> None:
    """Register ``name`` once (re-importing this module finds it already there, with this function)."""
    existing = AttentionInterface._global_mapping.get(name)
    if existing is not None and getattr(existing, "__qualname__", None) != attention.__qualname__:
        raise RuntimeError(f"{name!r} is already registered in AttentionInterface by someone else")
    AttentionInterface.register(name, attention)
    if name not in AttentionMaskInterface._global_mapping:
        AttentionMaskInterface.register(name, mask)


_register_name(CAPTURE_IMPLEMENTATION, _capturing_attention, eager_mask)
_register_name(FUSED_CAPTURE_IMPLEMENTATION, _capturing_fused_attention, _fused_mask)


def fused_implementation(model: nn.Module) -> str | None:
    """The fused attention the model was loaded with, if the fused capture can run on it; else ``None``.

    ``None`` (the methods then run on the architecture's eager attention) when the model was loaded with ``eager``;
    when its implementation is not registered in both ``AttentionInterface`` and ``AttentionMaskInterface``; when
    its attention does not go through the interface (DeBERTa-v2); and for ``sdpa`` with attention-logit
    soft-capping (Gemma 2's ``attn_logit_softcapping``), which ``sdpa`` cannot compute. Read the value before any
    capture switches the model (inside a capture block the configs name the capture).
    """
    config = getattr(model, "config", None)
    name = getattr(config, "_attn_implementation", None)
    if not isinstance(name, str) or name == "eager" or name in _OURS:
        return None
    if name not in AttentionInterface._global_mapping or name not in AttentionMaskInterface._global_mapping:
        return None
    deberta = _deberta_attention_class()
    if deberta is not None and any(isinstance(module, deberta) for module in model.modules()):
        return None
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config  # type: ignore[union-attr]
    if name == "sdpa" and getattr(text_config, "attn_logit_softcapping", None) is not None:
        return None
    return name


def _configs(model: nn.Module) -> list[Any]:
    """Every distinct config of ``model``: its own, its sub-configs at any depth and every submodule's."""
    found: dict[int, Any] = {}
    pending: list[Any] = [getattr(model, "config", None)]
    pending += [getattr(module, "config", None) for module in model.modules()]
    while pending:
        config = pending.pop()
        if config is None or id(config) in found or not hasattr(config, "_attn_implementation_internal"):
            continue
        found[id(config)] = config
        for key in getattr(config, "sub_configs", {}) or {}:
            pending.append(getattr(config, key, None))
    return list(found.values())


@contextmanager
def attention_implementation(model: nn.Module, implementation: str = CAPTURE_IMPLEMENTATION) -> Iterator[None]:
    """Switch every config of ``model`` to ``implementation`` for the block; restore each one's value on exit.

    The switch sets each config's attention implementation directly (no validation or kernel loading), so a model
    loaded with ``sdpa`` or any other implementation comes back with exactly what it had, also on exceptions.

    Args:
        model: a transformers model; every config and sub-config it holds is switched.
        implementation: the attention implementation's registered name (default: the capture's own).
    """
    configs = _configs(model)
    originals = [config._attn_implementation_internal for config in configs]
    try:
        for config in configs:
            config._attn_implementation_internal = implementation
        yield
    finally:
        for config, original in zip(configs, originals, strict=True):
            config._attn_implementation_internal = original


def _deberta_attention_class() -> type | None:
    module = sys.modules.get("transformers.models.deberta_v2.modeling_deberta_v2")
    return getattr(module, "DisentangledSelfAttention", None)


def _heads_view(tensor: Tensor, heads: int) -> Tensor:
    batch, length, _ = tensor.shape
    return tensor.view(batch, length, heads, -1).transpose(1, 2)


def _from_heads(tensor: Tensor) -> Tensor:
    batch, heads, length, head_dim = tensor.shape
    return tensor.transpose(1, 2).reshape(batch, length, heads * head_dim)


class _DebertaAdapter:
    """Forward hooks giving DeBERTa-v2's own attention the observer contract of :func:`_capturing_attention`."""

    def __init__(self, module: nn.Module, capture: AttentionCapture, hooks: ExitStack) -> None:
        self.module = module
        self.capture = capture
        self.heads = int(module.num_attention_heads)  # type: ignore[arg-type]
        self.call: AttentionCall | None = None
        self.replaced: dict[str, Tensor] = {}
        self.sources: dict[str, Tensor] = {}  # the tensor each projection of this call's tokens reads
        self.weights: Tensor | None = None
        for name in _PROJECTIONS:
            projection: nn.Module = getattr(module, name)
            hooks.callback(projection.register_forward_hook(self._on_projection(name)).remove)
        hooks.callback(module.register_forward_pre_hook(self._on_start, with_kwargs=True).remove)
        hooks.callback(module.dropout.register_forward_hook(self._on_probabilities).remove)  # type: ignore[union-attr]
        hooks.callback(module.register_forward_hook(self._on_end).remove)

    def _on_start(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.call = self.capture.start_call(module)
        self.replaced, self.sources = {}, {}
        self.weights = None
        if self.capture.observer is None:
            return
        hidden = args[0] if args else kwargs["hidden_states"]
        query_states = kwargs.get("query_states")
        if query_states is None and len(args) > 3:
            query_states = args[3]
        sources = {"query_proj": hidden if query_states is None else query_states}
        # DeBERTa projects query, key and value one after the other; the observer sees the three together, so they
        # are computed here with the projections' own weights (the same operation, so the same values) and the
        # projections' outputs are swapped for the observer's replacements by the hooks below.
        self.sources = {name: sources.get(name, hidden) for name in _PROJECTIONS}
        projected = []
        for name in _PROJECTIONS:
            linear: nn.Linear = getattr(module, name)
            output = nn.functional.linear(self.sources[name], linear.weight, linear.bias)
            projected.append(_heads_view(output, self.heads))
        query, key, value = self.capture.before(self.call, *projected)
        replaced = (query, key, value)
        self.replaced = {name: _from_heads(tensor) for name, tensor in zip(_PROJECTIONS, replaced, strict=True)}

    def _on_projection(self, name: str) -> Callable[[nn.Module, tuple[Any, ...], Tensor], Tensor | None]:
        def hook(projection: nn.Module, args: tuple[Any, ...], output: Tensor) -> Tensor | None:
            # Only the projection of this call's tokens is swapped: with ``share_att_key`` (DeBERTa-v3) the same
            # query/key projections also run on the relative position embeddings, which stay as they are.
            if self.call is None or not args or args[0] is not self.sources.get(name):
                return None
            return self.replaced.get(name)

        return hook

    def _on_probabilities(self, module: nn.Module, args: tuple[Any, ...], output: Tensor) -> None:
        if self.call is not None:
            self.weights = output

    def _on_end(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        call, weights = self.call, self.weights
        self.call, self.weights, self.replaced, self.sources = None, None, {}, {}
        if call is None or weights is None:
            raise UnsupportedModelError("DeBERTa-v2 attention ran without attention probabilities; cannot capture it")
        context = output[0] if isinstance(output, tuple) else output
        batch, length, _ = context.shape
        self.capture.after(call, context.view(batch, length, self.heads, -1), weights)


_PROJECTIONS = ("query_proj", "key_proj", "value_proj")


@contextmanager
def capturing_attention(
    model: nn.Module, *, keep: Keep = "heads", observer: AttentionObserver | None = None, fused: str | None = None
) -> Iterator[AttentionCapture]:
    """Record every attention call of the forwards run inside the block (and let ``observer`` act on them).

    The model is switched to :data:`CAPTURE_IMPLEMENTATION` (or, with ``fused``, to
    :data:`FUSED_CAPTURE_IMPLEMENTATION`) for the block (see :func:`attention_implementation`) and DeBERTa-v2
    attention modules get the adapter described in the module docstring; everything is undone on exit, also when
    the block raises. Captures do not nest: a capture inside another raises ``RuntimeError``.

    Args:
        model: any transformers model whose attention goes through ``AttentionInterface`` (or DeBERTa-v2).
        keep: what to keep of each call's probabilities (:data:`Keep`); ``"none"`` with ``fused``.
        observer: optional :class:`AttentionObserver`.
        fused: the fused implementation to run the attention on (:func:`fused_implementation` of the model, read
            before the model is switched), or ``None`` for the architecture's eager attention.

    Yields:
        The :class:`AttentionCapture`, filled as the forward runs.

    Raises:
        ValueError: ``fused`` with ``keep`` other than ``"none"`` (fused kernels return no probabilities), or a
            ``fused`` name that is not registered in both interfaces (or is one of the capture's own names).
    """
    if _ACTIVE.get() is not None:
        raise RuntimeError("an attention capture is already active in this context; captures do not nest")
    if fused is not None:
        if keep != "none":
            raise ValueError(f"a fused capture keeps no probabilities (keep='none'), got keep={keep!r}")
        registered = fused in AttentionInterface._global_mapping and fused in AttentionMaskInterface._global_mapping
        if fused in _OURS or fused == "eager" or not registered:
            raise ValueError(f"{fused!r} is not a fused attention implementation registered in transformers")
    capture = AttentionCapture(keep, observer, fused)
    deberta = _deberta_attention_class()
    with ExitStack() as stack:
        implementation = CAPTURE_IMPLEMENTATION if fused is None else FUSED_CAPTURE_IMPLEMENTATION
        stack.enter_context(attention_implementation(model, implementation))
        if deberta is not None:
            for module in model.modules():
                if isinstance(module, deberta):
                    _DebertaAdapter(module, capture, stack)
        token = _ACTIVE.set(capture)
        stack.callback(_ACTIVE.reset, token)
        yield capture
