"""The pass: one forward (and at most one gradient call) that captures what the requested methods need.

Everything that touches the model lives here: switching the attention implementation, hooks on stock modules, the
forward, and ``torch.autograd.grad`` with respect to the attention probabilities and input embeddings (one backward
of a classifier's target logits, or batched vector-Jacobian products for many targets: :func:`batched_gradients`). The
:func:`prepared_model` context manager undoes every change, also when an exception escapes.

Which attention a pass runs: a pass whose needs ask for attention maps (``attentions``, ``attention_gradients``,
``activations``) runs the architecture's eager attention (the generic capture of
:mod:`explainers.architectures.attention`); a pass that needs none runs on the model's own fused attention when the
caller gives it (``fused``, from :func:`~explainers.architectures.attention.fused_implementation`), through the fused
capture, so that its memory grows with ``n`` and not ``n²``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from .architectures.attention import AttentionObserver, Keep, attention_implementation, capturing_attention
from .architectures.description import Architecture
from .errors import UnsupportedModelError
from .rules.lrp import BlockActivations

ATTENTIONS = "attentions"
ATTENTION_GRADIENTS = "attention_gradients"
ACTIVATIONS = "activations"
EMBEDDING_GRADIENTS = "embedding_gradients"
NEEDS = frozenset({ATTENTIONS, ATTENTION_GRADIENTS, ACTIVATIONS, EMBEDDING_GRADIENTS})
#: The needs that differentiate the target logit (a grad-enabled forward and a backward).
GRADIENT_NEEDS = frozenset({ATTENTION_GRADIENTS, EMBEDDING_GRADIENTS})
#: The needs that read attention maps (the architecture's eager attention, whatever the model was loaded with).
MAP_NEEDS = frozenset({ATTENTIONS, ATTENTION_GRADIENTS, ACTIVATIONS})

CHUNK_BYTES = 512 * 2**20
"""Default bound on the gradients one batched vector-Jacobian call returns (a chunk of rounds)."""


@contextmanager
def prepared_model(model: nn.Module) -> Iterator[ExitStack]:
    """Put ``model`` in the state the explainers need and restore it afterwards, whatever happens.

    Inside the block the model runs the capture attention
    (:data:`~explainers.architectures.attention.CAPTURE_IMPLEMENTATION`: the architecture's own eager attention,
    recorded only inside :func:`run_capture`), on every config and sub-config, and every submodule is in eval mode.
    On exit each config's attention implementation (``sdpa``, ``eager``, anything) and each submodule's ``training``
    flag are restored, and every hook registered on the yielded ``ExitStack`` is removed. Parameters,
    ``requires_grad`` flags and ``.grad`` are never touched. Not thread-safe: explain one batch at a time per model.
    """
    training = [(module, module.training) for module in model.modules()]
    with ExitStack() as hooks:
        try:
            with attention_implementation(model):
                model.eval()
                yield hooks
        finally:
            hooks.close()
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
        attentions: per layer ``(batch, heads, n, n)`` probabilities if gradients or activations were asked, else
            the head means ``(batch, n, n)`` (all ``attention`` and ``rollout`` read), if asked.
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
    """Forward hooks that keep the inputs/outputs of the modules LRP reads, per call (ALBERT calls one layer many
    times), never on the model."""

    def __init__(self, arch: Architecture, hooks: ExitStack) -> None:
        self.inputs: dict[int, list[Tensor]] = {}
        self.outputs: dict[int, list[Tensor]] = {}
        self.hidden: dict[int, list[Tensor]] = {}
        linears: list[nn.Module] = list(arch.head)
        for block in arch.blocks:
            linears += [block.query, block.key, block.value, block.attention_output, block.ffn_in, block.ffn_out]
        for linear in {id(linear): linear for linear in linears}.values():
            _remember(hooks, linear.register_forward_hook(self._on_linear))
        for layer in {id(block.layer): block.layer for block in arch.blocks}.values():
            _remember(hooks, layer.register_forward_pre_hook(self._on_layer, with_kwargs=True))

    def _on_linear(self, module: nn.Module, args: tuple[Any, ...], output: Tensor) -> None:
        self.inputs.setdefault(id(module), []).append(args[0].detach())
        self.outputs.setdefault(id(module), []).append(output.detach())

    def _on_layer(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        hidden = args[0] if args else kwargs["hidden_states"]
        self.hidden.setdefault(id(module), []).append(hidden.detach())

    def block_activations(self, arch: Architecture, probabilities: list[Tensor]) -> list[BlockActivations]:
        result = []
        calls: dict[int, int] = {}

        def call_of(module: nn.Module) -> int:
            return calls.get(id(module), 0)

        for index, block in enumerate(arch.blocks):
            # The call of each module that belongs to this block: the number of earlier blocks sharing it.
            call = call_of(block.layer)

            def take(store: dict[int, list[Tensor]], module: nn.Module, call: int = call) -> Tensor:
                return store[id(module)][call]

            result.append(
                BlockActivations(
                    hidden=take(self.hidden, block.layer),
                    attention_input=take(self.inputs, block.query),
                    query=take(self.outputs, block.query),
                    key=take(self.outputs, block.key),
                    value=take(self.outputs, block.value),
                    probabilities=probabilities[index],
                    context=take(self.inputs, block.attention_output),
                    attention_out=take(self.outputs, block.attention_output),
                    ffn_input=take(self.inputs, block.ffn_in),
                    ffn_pre=take(self.outputs, block.ffn_in),
                    ffn_hidden=take(self.inputs, block.ffn_out),
                    ffn_out=take(self.outputs, block.ffn_out),
                )
            )
            calls[id(block.layer)] = call + 1
        return result

    def head_inputs(self, arch: Architecture) -> list[Tensor]:
        return [self.inputs[id(linear)][0] for linear in arch.head]


EmbeddingMap = Callable[[Tensor], Tensor]
"""A function of the input embeddings ``(rows, n, hidden)`` applied in a forward: integrated gradients' path scaling,
a perturbation method's occluded or noisy copies."""


class _EmbeddingLeaf:
    """Forward hook that turns the input embeddings (through ``change``, when given) into the graph's leaf, requiring
    grad when ``gradients``.

    Making the embeddings the graph's leaf lets ``autograd.grad`` work even when the user froze every parameter,
    and keeps the backward pass out of the embedding tables.
    """

    def __init__(self, change: EmbeddingMap | None = None, gradients: bool = True) -> None:
        self.change = change
        self.gradients = gradients
        self.original: Tensor | None = None
        self.leaf: Tensor | None = None

    def __call__(self, module: nn.Module, args: tuple[Any, ...], output: Tensor) -> Tensor:
        self.original = output.detach()
        value = self.original if self.change is None else self.change(self.original)
        self.leaf = value.requires_grad_(True) if self.gradients else value
        return self.leaf


@dataclass
class Forward:
    """One forward pass of :func:`forward_pass`, its autograd graph still alive when gradients were asked.

    Attributes:
        logits: the model's logits (in the graph of a grad-enabled pass).
        attentions: per attention call the probabilities as the capture kept them (``None`` if not asked): per head
            ``(batch, heads, n, n)`` in the graph, or head means ``(batch, n, n)`` detached.
        leaf: the input embeddings made the graph's leaf (``None`` if no gradient or embedding map was asked).
        recorder: the activations LRP reads (``None`` if not asked).
        needs: what the pass was asked to capture.
        seconds: ``forward`` wall time.
    """

    logits: Tensor
    attentions: list[Tensor] | None
    leaf: _EmbeddingLeaf | None
    recorder: _Recorder | None
    needs: frozenset[str]
    seconds: dict[str, float]

    @property
    def gradient_inputs(self) -> list[Tensor]:
        """The tensors gradients are taken with respect to, in order: the attention probabilities of every call if
        ``attention_gradients`` was asked, then the input embeddings if ``embedding_gradients`` was."""
        wrt: list[Tensor] = []
        if ATTENTION_GRADIENTS in self.needs:
            assert self.attentions is not None
            wrt += self.attentions
        if EMBEDDING_GRADIENTS in self.needs:
            assert self.leaf is not None and self.leaf.leaf is not None
            wrt.append(self.leaf.leaf)
        return wrt

    def capture(self, arch: Architecture, targets: Tensor, gradients: tuple[Tensor, ...] | None = None) -> Capture:
        """The :class:`Capture` of this pass, every tensor detached.

        Args:
            arch: the model's description.
            targets: ``(batch,)`` the class each row is explained for.
            gradients: the gradients with respect to :attr:`gradient_inputs`, in that order (``None``: none taken).
        """
        capture = Capture(logits=self.logits.detach(), targets=targets, seconds=dict(self.seconds))
        if self.attentions is not None:
            capture.attentions = [attention.detach() for attention in self.attentions]
        if gradients is not None:
            if ATTENTION_GRADIENTS in self.needs:
                capture.attention_gradients = list(gradients[: arch.num_layers])
            if EMBEDDING_GRADIENTS in self.needs:
                assert self.leaf is not None and self.leaf.leaf is not None
                capture.embeddings = self.leaf.leaf.detach()
                capture.embedding_gradients = gradients[-1]
        if self.recorder is not None:
            assert capture.attentions is not None
            capture.activations = self.recorder.block_activations(arch, capture.attentions)
            capture.head_inputs = self.recorder.head_inputs(arch)
        return capture


def forward_pass(
    model: nn.Module,
    arch: Architecture,
    inputs: Mapping[str, Tensor],
    needs: frozenset[str],
    rules: Callable[[ExitStack], AttentionObserver | None] | None = None,
    embeddings: EmbeddingMap | None = None,
    fused: str | None = None,
    cache: Any = None,
) -> Forward:
    """Run the model once, recording what ``needs`` lists, and keep the graph for the gradients to come.

    The hooks (attention capture, activation recorder, embedding leaf, the rules') are removed when the forward
    returns; the autograd graph they shaped stays until the caller's last gradient call frees it.

    Args:
        model: the model, already inside :func:`prepared_model`.
        arch: its description.
        inputs: validated model inputs on the model's device.
        needs: a subset of :data:`NEEDS`.
        rules: optional modified-gradient rules (see :func:`run_capture`).
        embeddings: optional function of the input embeddings the forward runs on (integrated gradients' scaling
            along its path, a perturbation); the leaf is its result.
        fused: the model's fused attention implementation (``None``: eager), used when ``needs`` ask for no
            attention maps (a pass that needs maps runs eager attention whatever ``fused`` says).
        cache: a causal LM's key/value cache (a ``transformers`` ``Cache``): the forward reads the positions it holds
            as the prefix of ``inputs`` (whose ``input_ids`` are then the positions after it, and ``attention_mask``
            covers both) and appends the new ones to it. It is passed to this call only (``use_cache=True`` as an
            argument; the model's config is not touched).

    Returns:
        The :class:`Forward`.

    Raises:
        UnsupportedModelError: if the model's attention did not go through the capture once per layer.
    """
    unknown = needs - NEEDS
    if unknown:
        raise ValueError(f"unknown capture needs {sorted(unknown)}; valid: {sorted(NEEDS)}")
    wants_gradients = bool(needs & GRADIENT_NEEDS)
    wants_attentions = bool(needs & MAP_NEEDS)
    per_head = bool(needs & {ATTENTION_GRADIENTS, ACTIVATIONS})
    keep: Keep = "heads" if per_head else "mean" if wants_attentions else "none"
    with ExitStack() as hooks:
        recorder = _Recorder(arch, hooks) if ACTIVATIONS in needs else None
        leaf = _EmbeddingLeaf(embeddings, wants_gradients) if wants_gradients or embeddings is not None else None
        if leaf is not None:
            _remember(hooks, arch.input_embeddings.register_forward_hook(leaf))
        observer = None if rules is None else rules(hooks)
        attention = None if wants_attentions else fused
        recorded = hooks.enter_context(capturing_attention(model, keep=keep, observer=observer, fused=attention))
        started = time.perf_counter()
        with torch.enable_grad() if wants_gradients else torch.no_grad():
            extra: dict[str, Any] = {} if cache is None else {"cache": cache, "use_cache": True}
            logits: Tensor = model(**inputs, **extra, return_dict=True).logits
        forward_done = time.perf_counter()
    if len(recorded.calls) != arch.num_layers:
        raise UnsupportedModelError(
            f"the {arch.model_type} model made {len(recorded.calls)} attention calls through the capture, expected "
            f"{arch.num_layers} (one per layer): its attention does not go through transformers' AttentionInterface"
        )
    attentions = recorded.probabilities if wants_attentions else None
    return Forward(logits, attentions, leaf, recorder, needs, {"forward": forward_done - started})


def bind_rules(
    rules: Callable[[nn.Module, Architecture, ExitStack], AttentionObserver | None] | None,
    model: nn.Module,
    arch: Architecture,
) -> Callable[[ExitStack], AttentionObserver | None] | None:
    """A method's modified-gradient ``rules`` bound to ``model``, ready to attach to one pass's hook stack
    (``None`` for true gradients)."""
    if rules is None:
        return None
    bound = rules
    return lambda hooks: bound(model, arch, hooks)


def run_capture(
    model: nn.Module,
    arch: Architecture,
    inputs: Mapping[str, Tensor],
    needs: frozenset[str],
    resolve_targets: Callable[[Tensor], Tensor],
    gradient_rows: Tensor | None = None,
    rules: Callable[[ExitStack], AttentionObserver | None] | None = None,
    fused: str | None = None,
) -> Capture:
    """Run the model once and capture what ``needs`` lists (a :func:`forward_pass` and at most one gradient call).

    Args:
        model: the classifier, already inside :func:`prepared_model`.
        arch: its description.
        inputs: validated model inputs on the model's device.
        needs: a subset of :data:`NEEDS`.
        resolve_targets: maps the logits to the ``(batch,)`` target classes.
        gradient_rows: optional ``(batch,)`` bool mask of the rows whose target logit is differentiated
            (the others get zero gradients and zero relevance); all rows by default.
        rules: optional modified-gradient rules (a method's ``rules`` bound to the model): called with this
            forward's hook stack, they attach their hooks there and return the attention observer to run (or
            ``None``); the gradients captured are then the rules' (values are unchanged).
        fused: the model's fused attention, for a pass that needs no attention maps (see :func:`forward_pass`).

    Returns:
        The :class:`Capture`.
    """
    forward = forward_pass(model, arch, inputs, needs, rules, fused=fused)
    logits = forward.logits
    targets = resolve_targets(logits.detach())
    gradients = None
    if needs & GRADIENT_NEEDS:
        started = time.perf_counter()
        weights = torch.zeros_like(logits)
        weights.scatter_(1, targets.view(-1, 1), 1.0)
        if gradient_rows is not None:
            weights = weights * gradient_rows.view(-1, 1).to(weights.dtype)
        wrt = forward.gradient_inputs
        found = torch.autograd.grad((logits * weights).sum(), wrt, allow_unused=True)
        gradients = tuple(torch.zeros_like(t) if g is None else g for g, t in zip(found, wrt, strict=True))
        forward.seconds["backward"] = time.perf_counter() - started
    return forward.capture(arch, targets, gradients).upcast()


def rounds_per_call(wrt: Sequence[Tensor], rounds: int, chunk_bytes: int, maps: bool) -> int:
    """Rounds of targets per batched vector-Jacobian call whose gradients fit ``chunk_bytes``: the gradients of one
    round are the size of ``wrt`` (twice that with the per-head maps, which the virtual rows of ``gae`` copy as well).
    """
    per_round = sum(tensor.numel() * tensor.element_size() for tensor in wrt) * (2 if maps else 1)
    return max(1, min(rounds, chunk_bytes // max(per_round, 1)))


def batched_gradients(outputs: Tensor, wrt: Sequence[Tensor], retain: bool) -> tuple[Tensor, ...]:
    """``(c,)`` scalar outputs → per input in ``wrt`` its ``(c, *shape)`` gradients, in one batched backward
    (``torch.autograd.grad(..., is_grads_batched=True)``, a vmap over the backward); ``retain`` keeps the graph for
    another call."""
    grad_outputs = torch.eye(outputs.shape[0], dtype=outputs.dtype, device=outputs.device)
    found = torch.autograd.grad(
        outputs, list(wrt), grad_outputs=grad_outputs, is_grads_batched=True, retain_graph=retain, allow_unused=True
    )
    return tuple(
        torch.zeros((outputs.shape[0], *tensor.shape), dtype=tensor.dtype, device=tensor.device) if g is None else g
        for g, tensor in zip(found, wrt, strict=True)
    )
