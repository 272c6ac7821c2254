"""One forward pass (and at most one gradient pass) that captures what the requested methods need.

Everything that touches the model lives here: switching to eager attention, hooks on stock modules, the
forward, and ``torch.autograd.grad`` with respect to the attention probabilities and input embeddings. The
:func:`prepared_model` context manager undoes every change, also when an exception escapes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from .architectures import Architecture, model_config
from .errors import UnsupportedModelError
from .lrp import BlockActivations

ATTENTIONS = "attentions"
ATTENTION_GRADIENTS = "attention_gradients"
ACTIVATIONS = "activations"
EMBEDDING_GRADIENTS = "embedding_gradients"
NEEDS = frozenset({ATTENTIONS, ATTENTION_GRADIENTS, ACTIVATIONS, EMBEDDING_GRADIENTS})
GRADIENT_NEEDS = frozenset({ATTENTION_GRADIENTS, EMBEDDING_GRADIENTS})


@contextmanager
def prepared_model(model: nn.Module) -> Iterator[ExitStack]:
    """Put ``model`` in the state the explainers need and restore it afterwards, whatever happens.

    Inside the block the model runs eager attention (fused kernels return no attention probabilities) and every
    submodule is in eval mode. On exit the original attention implementation and each submodule's ``training``
    flag are restored, and every hook registered on the yielded ``ExitStack`` is removed. Parameters,
    ``requires_grad`` flags and ``.grad`` are never touched. Not thread-safe: explain one batch at a time per model.

    Raises:
        UnsupportedModelError: if the model runs fused attention and cannot be switched to eager.
    """
    config = model_config(model)
    original = config._attn_implementation
    training = [(module, module.training) for module in model.modules()]
    setter = getattr(model, "set_attn_implementation", None)
    switched = False
    with ExitStack() as hooks:
        try:
            if original != "eager":
                if setter is None:
                    raise UnsupportedModelError(
                        f"the model runs {original!r} attention, which returns no attention probabilities; load it "
                        "with attn_implementation='eager'"
                    )
                setter("eager")
                switched = True
                if config._attn_implementation != "eager":
                    raise UnsupportedModelError(
                        f"could not switch the model from {original!r} to eager attention; load it with "
                        "attn_implementation='eager'"
                    )
            model.eval()
            yield hooks
        finally:
            hooks.close()
            if switched and setter is not None:
                setter(original)
            for module, flag in training:
                module.training = flag


def _remember(hooks: ExitStack, handle: RemovableHandle) -> None:
    hooks.callback(handle.remove)


@dataclass
class Capture:
    """What one forward (and gradient) pass captured; every tensor is detached.

    Attributes:
        logits: ``(batch, num_labels)``.
        targets: ``(batch,)`` the class each row is explained for.
        attentions: per layer ``(batch, heads, n, n)`` probabilities, if asked.
        attention_gradients: per layer gradients of the target logit w.r.t. the probabilities, if asked.
        activations: per block forward activations for LRP, if asked.
        head_inputs: inputs of the classification head's linear layers, if activations were asked.
        embeddings: ``(batch, n, hidden)`` input embeddings (word or patch), if embedding gradients were asked.
        embedding_gradients: gradient of the target logit w.r.t. ``embeddings``.
        seconds: wall time of each stage (``forward``, ``backward``).
    """

    logits: Tensor
    targets: Tensor
    attentions: list[Tensor] | None = None
    attention_gradients: list[Tensor] | None = None
    activations: list[BlockActivations] | None = None
    head_inputs: list[Tensor] | None = None
    embeddings: Tensor | None = None
    embedding_gradients: Tensor | None = None
    seconds: dict[str, float] = field(default_factory=dict)

    def upcast(self) -> Capture:
        """The same capture with half-precision tensors (from a bf16/fp16 autocast forward) in float32.

        Attribution maths (LRP, rollout products) accumulates in float32 at least, whatever the forward ran in.
        """

        def up(tensor: Tensor) -> Tensor:
            return tensor.float() if tensor.dtype in (torch.float16, torch.bfloat16) else tensor

        def up_all(tensors: list[Tensor] | None) -> list[Tensor] | None:
            return None if tensors is None else [up(tensor) for tensor in tensors]

        activations = None
        if self.activations is not None:
            activations = []
            for acts in self.activations:
                # A half-precision tensor (a linear layer's bf16 output, say): the forward ran in lower precision.
                lowered = any(tensor.dtype in (torch.float16, torch.bfloat16) for tensor in acts.tensors().values())
                activations.append(
                    replace(acts.map_tensors(up), forward_precision=acts.forward_precision and not lowered)
                )
        return Capture(
            logits=up(self.logits),
            targets=self.targets,
            attentions=up_all(self.attentions),
            attention_gradients=up_all(self.attention_gradients),
            activations=activations,
            head_inputs=up_all(self.head_inputs),
            embeddings=None if self.embeddings is None else up(self.embeddings),
            embedding_gradients=None if self.embedding_gradients is None else up(self.embedding_gradients),
            seconds=self.seconds,
        )

    def rows(self, index: Tensor) -> Capture:
        """The same capture restricted to the rows ``index`` (a ``LongTensor``)."""

        def pick(tensors: list[Tensor] | None) -> list[Tensor] | None:
            return None if tensors is None else [tensor[index] for tensor in tensors]

        activations = None
        if self.activations is not None:
            activations = [acts.map_tensors(lambda tensor: tensor[index]) for acts in self.activations]
        return Capture(
            logits=self.logits[index],
            targets=self.targets[index],
            attentions=pick(self.attentions),
            attention_gradients=pick(self.attention_gradients),
            activations=activations,
            head_inputs=pick(self.head_inputs),
            embeddings=None if self.embeddings is None else self.embeddings[index],
            embedding_gradients=None if self.embedding_gradients is None else self.embedding_gradients[index],
            seconds=self.seconds,
        )


class _Recorder:
    """Forward hooks that keep the inputs/outputs of the modules LRP reads (per call, never on the model)."""

    def __init__(self, arch: Architecture, hooks: ExitStack) -> None:
        self.inputs: dict[int, Tensor] = {}
        self.outputs: dict[int, Tensor] = {}
        self.hidden: dict[int, Tensor] = {}
        linears: list[nn.Module] = list(arch.head)
        for block in arch.blocks:
            linears += [block.query, block.key, block.value, block.attention_output, block.ffn_in, block.ffn_out]
        for linear in linears:
            _remember(hooks, linear.register_forward_hook(self._on_linear))
        for index, block in enumerate(arch.blocks):
            _remember(hooks, block.layer.register_forward_pre_hook(self._on_layer(index), with_kwargs=True))

    def _on_linear(self, module: nn.Module, args: tuple[Any, ...], output: Tensor) -> None:
        self.inputs[id(module)] = args[0].detach()
        self.outputs[id(module)] = output.detach()

    def _on_layer(self, index: int) -> Callable[[nn.Module, tuple[Any, ...], dict[str, Any]], None]:
        def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            hidden = args[0] if args else kwargs["hidden_states"]
            self.hidden[index] = hidden.detach()

        return hook

    def block_activations(self, arch: Architecture, probabilities: list[Tensor]) -> list[BlockActivations]:
        result = []
        for index, block in enumerate(arch.blocks):
            result.append(
                BlockActivations(
                    hidden=self.hidden[index],
                    attention_input=self.inputs[id(block.query)],
                    query=self.outputs[id(block.query)],
                    key=self.outputs[id(block.key)],
                    value=self.outputs[id(block.value)],
                    probabilities=probabilities[index],
                    context=self.inputs[id(block.attention_output)],
                    attention_out=self.outputs[id(block.attention_output)],
                    ffn_input=self.inputs[id(block.ffn_in)],
                    ffn_pre=self.outputs[id(block.ffn_in)],
                    ffn_hidden=self.inputs[id(block.ffn_out)],
                    ffn_out=self.outputs[id(block.ffn_out)],
                )
            )
        return result

    def head_inputs(self, arch: Architecture) -> list[Tensor]:
        return [self.inputs[id(linear)] for linear in arch.head]


class _EmbeddingLeaf:
    """Forward hook that turns the input embeddings into a leaf that requires grad (optionally scaled per row).

    Making the embeddings the graph's leaf lets ``autograd.grad`` work even when the user froze every parameter,
    and keeps the backward pass out of the embedding tables.
    """

    def __init__(self, scale: Tensor | None = None) -> None:
        self.scale = scale
        self.original: Tensor | None = None
        self.leaf: Tensor | None = None

    def __call__(self, module: nn.Module, args: tuple[Any, ...], output: Tensor) -> Tensor:
        self.original = output.detach()
        value = self.original if self.scale is None else self.original * self.scale.view(-1, 1, 1)
        self.leaf = value.requires_grad_(True)
        return self.leaf


def _keep_probabilities(store: dict[int, Tensor], index: int) -> Callable[[nn.Module, tuple[Any, ...], Any], None]:
    """A forward hook keeping the attention probabilities an eager attention module returns second."""

    def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        weights = output[1] if isinstance(output, tuple) and len(output) > 1 else None
        if weights is None:
            raise UnsupportedModelError(
                f"{type(module).__name__} returned no attention probabilities; load the model with eager attention"
            )
        store[index] = weights

    return hook


def run_capture(
    model: nn.Module,
    arch: Architecture,
    inputs: Mapping[str, Tensor],
    needs: frozenset[str],
    resolve_targets: Callable[[Tensor], Tensor],
    gradient_rows: Tensor | None = None,
    rules: Callable[[ExitStack], None] | None = None,
) -> Capture:
    """Run the model once and capture what ``needs`` lists.

    Args:
        model: the classifier, already inside :func:`prepared_model`.
        arch: its description.
        inputs: validated model inputs on the model's device.
        needs: a subset of :data:`NEEDS`.
        resolve_targets: maps the logits to the ``(batch,)`` target classes.
        gradient_rows: optional ``(batch,)`` bool mask of the rows whose target logit is differentiated
            (the others get zero gradients and zero relevance); all rows by default.
        rules: optional modified-gradient rules (a method's ``rules`` bound to the model), attached to the model
            for this forward only; the gradients captured are then the rules' (values are unchanged).

    Returns:
        The :class:`Capture`.
    """
    unknown = needs - NEEDS
    if unknown:
        raise ValueError(f"unknown capture needs {sorted(unknown)}; valid: {sorted(NEEDS)}")
    wants_gradients = bool(needs & GRADIENT_NEEDS)
    wants_attentions = bool(needs & {ATTENTIONS, ATTENTION_GRADIENTS, ACTIVATIONS})
    probabilities: dict[int, Tensor] = {}
    with ExitStack() as hooks:
        recorder = _Recorder(arch, hooks) if ACTIVATIONS in needs else None
        if wants_attentions:
            for index, block in enumerate(arch.blocks):
                _remember(hooks, block.attention.register_forward_hook(_keep_probabilities(probabilities, index)))
        leaf = _EmbeddingLeaf() if wants_gradients else None
        if leaf is not None:
            _remember(hooks, arch.input_embeddings.register_forward_hook(leaf))
        if rules is not None:
            rules(hooks)
        started = time.perf_counter()
        with torch.enable_grad() if wants_gradients else torch.no_grad():
            logits: Tensor = model(**inputs, return_dict=True).logits
        forward_done = time.perf_counter()
    attentions = [probabilities[index] for index in range(arch.num_layers)] if wants_attentions else None
    targets = resolve_targets(logits.detach())
    capture = Capture(logits=logits.detach(), targets=targets)
    capture.seconds["forward"] = forward_done - started
    if attentions is not None:
        capture.attentions = [attention.detach() for attention in attentions]
    if wants_gradients:
        assert leaf is not None and leaf.leaf is not None
        weights = torch.zeros_like(logits)
        weights.scatter_(1, targets.view(-1, 1), 1.0)
        if gradient_rows is not None:
            weights = weights * gradient_rows.view(-1, 1).to(weights.dtype)
        wrt: list[Tensor] = []
        if ATTENTION_GRADIENTS in needs:
            assert attentions is not None
            wrt += attentions
        if EMBEDDING_GRADIENTS in needs:
            wrt.append(leaf.leaf)
        gradients = torch.autograd.grad((logits * weights).sum(), wrt, allow_unused=True)
        gradients = tuple(torch.zeros_like(t) if g is None else g for g, t in zip(gradients, wrt, strict=True))
        if ATTENTION_GRADIENTS in needs:
            capture.attention_gradients = list(gradients[: arch.num_layers])
        if EMBEDDING_GRADIENTS in needs:
            capture.embeddings = leaf.leaf.detach()
            capture.embedding_gradients = gradients[-1]
        capture.seconds["backward"] = time.perf_counter() - forward_done
    if recorder is not None:
        assert capture.attentions is not None
        capture.activations = recorder.block_activations(arch, capture.attentions)
        capture.head_inputs = recorder.head_inputs(arch)
    return capture.upcast()


def scaled_embedding_gradients(
    model: nn.Module, arch: Architecture, inputs: Mapping[str, Tensor], scale: Tensor, targets: Tensor
) -> tuple[Tensor, Tensor]:
    """Gradient of the target logit w.r.t. input embeddings multiplied row-wise by ``scale``.

    Used by integrated gradients: ``inputs`` already holds each example repeated once per step, and
    ``scale`` (one value per row) moves each copy along the straight path from the zero embedding.

    Returns:
        The unscaled embeddings ``(rows, n, hidden)`` and the gradients at the scaled point.
    """
    leaf = _EmbeddingLeaf(scale)
    with ExitStack() as hooks:
        _remember(hooks, arch.input_embeddings.register_forward_hook(leaf))
        with torch.enable_grad():
            logits = model(**inputs, return_dict=True).logits
    assert leaf.leaf is not None and leaf.original is not None
    selected = logits.gather(1, targets.view(-1, 1)).sum()
    (gradient,) = torch.autograd.grad(selected, [leaf.leaf])
    return leaf.original, gradient
