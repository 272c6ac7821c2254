"""The registry of attribution methods.

A method is a name, the capture it needs (so that a batch mixing methods still costs one forward), its options
with their ranges, and a function from the capture to token-aligned scores ``(batch, n)``, where for images
``n`` counts the class token first. Registering a method with :func:`register` makes it available everywhere:
request validation, the serving layer, metrics labels and the generated tests.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn

from .architectures.attention import AttentionObserver
from .architectures.description import Architecture
from .architectures.rule_hooks import attach_rules
from .capture import (
    ACTIVATIONS,
    ATTENTION_GRADIENTS,
    ATTENTIONS,
    EMBEDDING_GRADIENTS,
    Capture,
    scaled_embedding_gradients,
)
from .errors import InvalidOptionError, UnknownMethodError
from .rules import maps
from .rules.lrp import Affine, BlockWeights, attention_relevances
from .rules.lrp import safe_divide as lrp_safe_divide
from .tasks.token_relevance import token_relevance_scores


@dataclass(frozen=True)
class Option:
    """An integer option of a method, with its default and inclusive range (both may depend on the model)."""

    name: str
    description: str
    default: Callable[[Architecture], int]
    minimum: Callable[[Architecture], int]
    maximum: Callable[[Architecture], int]

    def resolve(self, value: Any, arch: Architecture) -> int:
        """Validate ``value`` (``None`` means the default) and return the option's value."""
        if value is None:
            return self.default(arch)
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidOptionError(f"option {self.name!r} must be an integer, got {value!r}")
        low, high = self.minimum(arch), self.maximum(arch)
        if not low <= value <= high:
            raise InvalidOptionError(f"option {self.name!r} must be in [{low}, {high}] for this model, got {value}")
        return value


@dataclass(frozen=True)
class MethodInputs:
    """Everything a method's compute function may read."""

    capture: Capture
    arch: Architecture
    model: nn.Module
    inputs: Mapping[str, Tensor]
    mask: Tensor
    options: Mapping[str, int]
    readout: Tensor | None = None
    read_tokens: Tensor | None = None
    #: A token-level target's terms (``positions``, ``labels``, ``weights``, each ``(rows, J)``), for the methods that
    #: seed at the head's outputs (``relevance``); ``None`` on the classifier path.
    terms: tuple[Tensor, Tensor, Tensor] | None = None
    #: The model's fused attention (``None``: eager), for methods that run forwards of their own and need no maps.
    fused: str | None = None


@dataclass(frozen=True)
class Method:
    """A registered attribution method."""

    name: str
    summary: str
    class_specific: bool
    needs: frozenset[str]
    options: tuple[Option, ...]
    compute: Callable[[MethodInputs], Tensor]
    #: Modified-gradient rules attached to the model for the pass that computes this method's gradients
    #: (``None``: true gradients). Rows of methods with different rules never share a gradient pass.
    rules: Callable[[nn.Module, Architecture, ExitStack], AttentionObserver | None] | None = None

    @property
    def needs_gradients(self) -> bool:
        """Whether the method differentiates the target logit (and so needs a grad-enabled forward)."""
        return bool(self.needs & {ATTENTION_GRADIENTS, EMBEDDING_GRADIENTS}) or self.name == "integrated_gradients"

    def resolve_options(self, options: Mapping[str, Any], arch: Architecture) -> dict[str, int]:
        """Validate ``options`` against this method and the model; fill in defaults.

        Raises:
            InvalidOptionError: for an unknown option or a value out of range.
        """
        known = {option.name: option for option in self.options}
        unknown = sorted(set(options) - set(known))
        if unknown:
            valid = ", ".join(sorted(known)) or "none"
            raise InvalidOptionError(f"method {self.name!r} has no option {', '.join(unknown)}; valid options: {valid}")
        return {name: option.resolve(options.get(name), arch) for name, option in known.items()}


_REGISTRY: dict[str, Method] = {}


def register(
    name: str,
    *,
    summary: str,
    class_specific: bool,
    needs: frozenset[str],
    options: tuple[Option, ...] = (),
    rules: Callable[[nn.Module, Architecture, ExitStack], AttentionObserver | None] | None = None,
) -> Callable[[Callable[[MethodInputs], Tensor]], Callable[[MethodInputs], Tensor]]:
    """Register a compute function under ``name`` (a decorator)."""

    def decorate(compute: Callable[[MethodInputs], Tensor]) -> Callable[[MethodInputs], Tensor]:
        if name in _REGISTRY:
            raise ValueError(f"method {name!r} is already registered")
        _REGISTRY[name] = Method(name, summary, class_specific, needs, options, compute, rules)
        return compute

    return decorate


def available_methods() -> list[str]:
    """Names of the registered methods, sorted."""
    return sorted(_REGISTRY)


def get_method(name: str) -> Method:
    """The method registered as ``name``.

    Raises:
        UnknownMethodError: naming the valid methods.
    """
    if not isinstance(name, str) or name not in _REGISTRY:
        raise UnknownMethodError(f"unknown method {name!r}; valid methods: {', '.join(available_methods())}")
    return _REGISTRY[name]


def _num_layers(arch: Architecture) -> int:
    return arch.num_layers


START_LAYER = Option(
    "start_layer",
    "first block included in the rollout (0 = all blocks)",
    default=lambda arch: 0,
    minimum=lambda arch: 0,
    maximum=lambda arch: arch.num_layers - 1,
)


@register(
    "attention",
    summary="attention of the explained row in one layer, mean over heads (cheap, class-agnostic, not faithful)",
    class_specific=False,
    needs=frozenset({ATTENTIONS}),
    options=(
        Option(
            "layer",
            "block whose attention is shown; negative counts from the last (-1 = last)",
            default=lambda arch: -1,
            minimum=lambda arch: -arch.num_layers,
            maximum=lambda arch: arch.num_layers - 1,
        ),
    ),
)
def _attention(ctx: MethodInputs) -> Tensor:
    assert ctx.capture.attentions is not None
    return maps.raw_attention(ctx.capture.attentions[ctx.options["layer"]], ctx.readout) * ctx.mask


@register(
    "rollout",
    summary="attention rollout (Abnar & Zuidema 2020), class-agnostic",
    class_specific=False,
    needs=frozenset({ATTENTIONS}),
    options=(START_LAYER,),
)
def _rollout(ctx: MethodInputs) -> Tensor:
    assert ctx.capture.attentions is not None
    return maps.rollout_scores(ctx.capture.attentions, ctx.options["start_layer"], ctx.readout) * ctx.mask


def _block_weights(arch: Architecture, dtype: torch.dtype) -> list[BlockWeights]:
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


@register(
    "relevance",
    summary="LRP relevance x attention gradients, rolled out (Chefer, Gur & Wolf, CVPR 2021)",
    class_specific=True,
    needs=frozenset({ATTENTIONS, ATTENTION_GRADIENTS, ACTIVATIONS}),
    options=(START_LAYER,),
)
def _relevance(ctx: MethodInputs) -> Tensor:
    capture = ctx.capture
    assert capture.activations is not None and capture.head_inputs is not None
    assert capture.attention_gradients is not None
    start_layer = ctx.options["start_layer"]
    dtype = capture.activations[0].hidden.dtype
    if ctx.terms is not None:  # a token classifier's target: LRP seeded at its tokens (tasks.token_relevance)
        assert ctx.readout is not None and ctx.read_tokens is not None
        weights = _block_weights(ctx.arch, dtype)
        return token_relevance_scores(
            capture, ctx.arch, weights, ctx.terms, ctx.mask, start_layer, ctx.readout, ctx.read_tokens
        )
    one_hot = torch.nn.functional.one_hot(capture.targets, capture.logits.shape[-1]).to(dtype)
    relevances = attention_relevances(
        capture.activations,
        _block_weights(ctx.arch, dtype),
        capture.head_inputs,
        [linear.weight.detach().to(dtype) for linear in ctx.arch.head],
        one_hot,
        ctx.arch.num_heads,
        ctx.arch.norm_first,
        start_layer,
        masked=ctx.arch.modality == "text",
        head_paths=ctx.arch.head_paths,
        head_shares=_head_shares(ctx, dtype),
    )
    return maps.relevance_scores(
        relevances, capture.attention_gradients, ctx.mask, start_layer, ctx.readout, ctx.read_tokens
    )


def _head_shares(ctx: MethodInputs, dtype: torch.dtype) -> list[Tensor] | None:
    """Per head, its magnitude share ``|z_h| / Σ|z|`` of the target logit, when the model averages several heads."""
    paths = ctx.arch.head_paths
    if len(paths) < 2:
        return None
    assert ctx.capture.head_inputs is not None
    targets = ctx.capture.targets.view(-1, 1)
    magnitudes = []
    first = 0
    for _, count in paths:
        last = ctx.arch.head[first + count - 1]
        inputs = ctx.capture.head_inputs[first + count - 1].to(dtype)
        bias = None if last.bias is None else last.bias.detach().to(dtype)
        logits = torch.nn.functional.linear(inputs, last.weight.detach().to(dtype), bias)
        magnitudes.append(logits.gather(1, targets).abs())
        first += count
    total = torch.stack(magnitudes).sum(dim=0)
    return [lrp_safe_divide(magnitude, total) for magnitude in magnitudes]


@register(
    "gae",
    summary="gradient-weighted attention rollout (Chefer, Gur & Wolf, ICCV 2021)",
    class_specific=True,
    needs=frozenset({ATTENTIONS, ATTENTION_GRADIENTS}),
    options=(START_LAYER,),
)
def _gae(ctx: MethodInputs) -> Tensor:
    assert ctx.capture.attentions is not None and ctx.capture.attention_gradients is not None
    return maps.gae_scores(
        ctx.capture.attentions,
        ctx.capture.attention_gradients,
        ctx.mask,
        ctx.options["start_layer"],
        ctx.readout,
        ctx.read_tokens,
    )


def _align(per_embedding: Tensor, ctx: MethodInputs) -> Tensor:
    """Align embedding-level scores with the model's token sequence (the prefix tokens of an image model, class and
    distillation, have no input: 0)."""
    if ctx.arch.modality == "image":
        per_embedding = torch.nn.functional.pad(per_embedding, (ctx.arch.prefix_tokens, 0))
    return per_embedding * ctx.mask


@register(
    "grad_x_input",
    summary="gradient x input embedding, summed over the hidden dimension (saliency baseline)",
    class_specific=True,
    needs=frozenset({EMBEDDING_GRADIENTS}),
)
def _grad_x_input(ctx: MethodInputs) -> Tensor:
    capture = ctx.capture
    assert capture.embeddings is not None and capture.embedding_gradients is not None
    return _align((capture.embeddings * capture.embedding_gradients).sum(dim=-1), ctx)


@register(
    "attnlrp",
    summary="AttnLRP (Achtibat et al., ICML 2024): LRP for attention as a modified gradient x input embedding",
    class_specific=True,
    needs=frozenset({EMBEDDING_GRADIENTS}),
    rules=partial(attach_rules, variant="attnlrp"),
)
def _attnlrp(ctx: MethodInputs) -> Tensor:
    """Relevance of each input token (patch): input embedding × AttnLRP's modified gradient, summed over hidden."""
    return _grad_x_input(ctx)


@register(
    "cp_lrp",
    summary="CP-LRP (Ali et al. 2022): AttnLRP's rules with no relevance through the attention weights (conserves)",
    class_specific=True,
    needs=frozenset({EMBEDDING_GRADIENTS}),
    rules=partial(attach_rules, variant="cp_lrp"),
)
def _cp_lrp(ctx: MethodInputs) -> Tensor:
    """Relevance of each input token (patch): input embedding × CP-LRP's modified gradient, summed over hidden."""
    return _grad_x_input(ctx)


@register(
    "integrated_gradients",
    summary="integrated gradients on the input embeddings from a zero baseline, midpoint rule (saliency baseline)",
    class_specific=True,
    needs=frozenset(),
    options=(
        Option(
            "n_steps", "points on the path", default=lambda arch: 50, minimum=lambda arch: 1, maximum=lambda arch: 1024
        ),
        Option(
            "internal_batch_size",
            "rows per forward pass while integrating (bounds memory)",
            default=lambda arch: 64,
            minimum=lambda arch: 1,
            maximum=lambda arch: 4096,
        ),
    ),
)
def _integrated_gradients(ctx: MethodInputs) -> Tensor:
    """Integrated gradients (Sundararajan et al. 2017) along ``t·x``, ``t`` at the midpoints of ``n_steps`` bins.

    The baseline is the zero input embedding (word embedding for text, with position and segment embeddings
    still added by the model; patch embedding for images). Steps are batched ``internal_batch_size`` rows at a
    time, so memory stays bounded whatever ``n_steps`` is.
    """
    n_steps = ctx.options["n_steps"]
    batch = ctx.capture.targets.shape[0]
    steps_per_pass = max(1, ctx.options["internal_batch_size"] // batch)
    dtype = ctx.capture.logits.dtype
    points = (torch.arange(n_steps, dtype=dtype, device=ctx.capture.logits.device) + 0.5) / n_steps
    embeddings: Tensor | None = None
    summed: Tensor | None = None
    for start in range(0, n_steps, steps_per_pass):
        chunk = points[start : start + steps_per_pass]
        steps = chunk.shape[0]
        repeated = {key: value.repeat(steps, *([1] * (value.dim() - 1))) for key, value in ctx.inputs.items()}
        original, gradient = scaled_embedding_gradients(
            ctx.model, ctx.arch, repeated, chunk.repeat_interleave(batch), ctx.capture.targets.repeat(steps), ctx.fused
        )
        gradient = gradient.view(steps, batch, *gradient.shape[1:]).sum(dim=0)
        summed = gradient if summed is None else summed + gradient
        embeddings = original[:batch]
    assert embeddings is not None and summed is not None
    return _align((embeddings * summed / n_steps).sum(dim=-1), ctx)
