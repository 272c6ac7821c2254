"""The registry of attribution methods, and what each method declares it needs.

A method is a name, its options with their ranges, a function from what was captured to token-aligned scores
``(batch, n)`` (for images ``n`` counts the class token first), and its *capabilities*, declared once at its
registration and read by everything else (nothing outside this module looks at a method's name):

* ``needs``: what the capture pass records for it (:data:`~explainers.capture.NEEDS`), so that a batch mixing methods
  still costs one forward. A method whose needs include attention maps (:data:`~explainers.capture.MAP_NEEDS`) runs on
  the architecture's eager attention; any other runs on the model's fused attention where it has one.
* ``rules``: the modified-gradient rules (AttnLRP's, CP-LRP's) its gradient pass runs under; ``None``: true gradients.
* ``forwards``: for a method that runs forwards of its own over copies of the inputs (integrated gradients' path
  points; a perturbation method's perturbed copies), how it runs them (:class:`Forwards`): its implementation serves the
  classifier path (:func:`explainers.explain`) and the many-target path (:func:`explainers.explain_targets`) alike.
* ``memory``: its memory shape (:class:`Memory`), which :mod:`explainers.memory` turns into bytes.
* ``cost``: its time per row in forward equivalents (:class:`Cost`), which :mod:`explainers.timing` turns into seconds.

Registering a method with :func:`register` (or :func:`register_forwards`) makes it available everywhere: request
validation, the serving layer, metrics labels, the memory budget and the generated tests.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from functools import partial
from importlib.util import find_spec
from typing import Any

import torch
from torch import Tensor, nn

from ..architectures.attention import AttentionObserver
from ..architectures.description import Architecture
from ..architectures.rule_hooks import attach_rules
from ..capture import (
    ACTIVATIONS,
    ATTENTION_GRADIENTS,
    ATTENTIONS,
    CHUNK_BYTES,
    EMBEDDING_GRADIENTS,
    GRADIENT_NEEDS,
    MAP_NEEDS,
    Capture,
    batched_gradients,
    forward_pass,
    rounds_per_call,
)
from ..deadline import Deadline
from ..errors import InvalidInputError, InvalidOptionError, UnknownMethodError, UnsupportedMethodError
from ..inputs import batch_size, full_precision, input_grid, model_device
from ..rules import maps
from ..rules.flow import attention_flow_scores
from ..rules.lrp import add_relprop as lrp_add_relprop
from .lrp_pass import lrp_relevances

Rules = Callable[[nn.Module, Architecture, ExitStack], AttentionObserver | None]
"""Modified-gradient rules: attach hooks to the model on the pass's hook stack, return the attention observer."""


OptionValue = int | float
"""The value of a method option: an ``int`` for an integer option, a ``float`` for a real one."""

#: The kinds of option values: what :meth:`Option.resolve` accepts and returns, and how the wires carry them.
OPTION_KINDS = ("int", "float")


@dataclass(frozen=True)
class Option:
    """An option of a method, with its default and inclusive range (both may depend on the model).

    ``kind`` is ``"int"`` (an integer: the value must be an ``int``) or ``"float"`` (a real number: an ``int`` or a
    finite ``float``, returned as ``float``). Every door carries both kinds (docs/SERVING.md, "Method options").
    """

    name: str
    description: str
    default: Callable[[Architecture], OptionValue]
    minimum: Callable[[Architecture], OptionValue]
    maximum: Callable[[Architecture], OptionValue]
    kind: str = "int"

    def __post_init__(self) -> None:
        if self.kind not in OPTION_KINDS:
            raise ValueError(f"option {self.name!r}: kind must be one of {', '.join(OPTION_KINDS)}, got {self.kind!r}")

    @classmethod
    def fixed(cls, name: str, description: str, default: int, minimum: int, maximum: int) -> Option:
        """An integer option whose default and range do not depend on the model."""
        return cls(name, description, lambda arch: default, lambda arch: minimum, lambda arch: maximum)

    @classmethod
    def fixed_float(cls, name: str, description: str, default: float, minimum: float, maximum: float) -> Option:
        """A real-valued option whose default and range do not depend on the model."""
        low, high, value = float(minimum), float(maximum), float(default)
        return cls(name, description, lambda arch: value, lambda arch: low, lambda arch: high, kind="float")

    def resolve(self, value: Any, arch: Architecture) -> OptionValue:
        """Validate ``value`` (``None`` means the default) and return the option's value (an ``int`` for an integer
        option, a ``float`` for a real one).

        Raises:
            InvalidOptionError: for a value of the wrong type, not finite, or out of range (naming the range).
        """
        if value is None:
            return self.default(arch)
        low, high = self.minimum(arch), self.maximum(arch)
        if self.kind == "float":
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise InvalidOptionError(f"option {self.name!r} must be a number in [{low}, {high}], got {value!r}")
            value = float(value)
        elif isinstance(value, bool) or not isinstance(value, int):
            raise InvalidOptionError(f"option {self.name!r} must be an integer in [{low}, {high}], got {value!r}")
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
    options: Mapping[str, OptionValue]
    readout: Tensor | None = None
    read_tokens: Tensor | None = None
    #: A token-level target's terms (``positions``, ``labels``, ``weights``, each ``(rows, J)``), for the methods that
    #: seed at the head's outputs (``relevance``); ``None`` on the classifier path.
    terms: tuple[Tensor, Tensor, Tensor] | None = None
    #: The model's fused attention (``None``: eager), for methods that run forwards of their own and need no maps.
    fused: str | None = None
    #: When the answer is due (``None``: no deadline), for methods that run forwards of their own.
    deadline: Deadline | None = None


@dataclass(frozen=True)
class Footprint:
    """A method's memory at its peak, in elements (the formula is in :mod:`explainers.memory`).

    Attributes:
        maps: ``heads × n × n`` maps per layer alive at the peak (kept for the backward or for the kernels).
        transient: ``heads × n × n`` maps alive at once in the layer being computed.
        activations: elements per token and layer, in units of ``hidden + intermediate``, kept for the backward.
        forward: elements per token, in the same units, alive at once in the layer being computed.
        head_means: ``n × n`` head-mean maps per layer kept for the kernels (``attention`` and ``rollout`` keep one).
    """

    maps: float
    transient: float
    activations: float
    forward: float = 6.0
    head_means: float = 0.0

    @property
    def quadratic(self) -> bool:
        """Whether the method keeps maps that grow with the square of the length."""
        return bool(self.maps or self.head_means)


@dataclass(frozen=True)
class Memory:
    """A method's memory shape: its :class:`Footprint` on eager attention, and on the model's fused attention for a
    method that reads no maps (``None`` for one that does: it always runs eager attention)."""

    eager: Footprint
    fused: Footprint | None = None


def _no_solver(length: int, layers: int) -> float:
    return 0.0


@dataclass(frozen=True)
class Cost:
    """A method's time for one row, beyond its share of the shared forward (the formula is in
    :mod:`explainers.timing`).

    Attributes:
        forwards: ``(options, n) -> forward equivalents`` of work for a row of ``n`` tokens: a forward of the row
            counts 1, a backward about 2; ``options`` may lack some options (their defaults apply).
        calls: ``(options, n) -> forward calls`` (in the same units) the row needs alone: fewer than ``forwards``
            for a method that batches copies of the row into one call (``internal_batch_size``); ``None``: as many
            as ``forwards``.
        solver: ``(n, layers) -> time`` spent outside the model (attention flow's maximum flows), in units of the
            machine's pure-Python reference job (:func:`explainers.timing.reference_job`).
        per_target: ``(options, n) -> forward equivalents`` that each further target of the same row adds (a token
            classifier's entities, a generation's steps: :func:`explainers.tasks.targets.explain_targets` explains
            them from one forward): the backward passes, which repeat per target, while forwards are shared.
            ``None``: everything but one forward, ``forwards - 1``.
    """

    forwards: Callable[[Mapping[str, OptionValue], int], float]
    calls: Callable[[Mapping[str, OptionValue], int], float] | None = None
    solver: Callable[[int, int], float] = _no_solver
    per_target: Callable[[Mapping[str, OptionValue], int], float] | None = None

    def target_forwards(self, options: Mapping[str, OptionValue], length: int) -> float:
        """Forward equivalents each further target of a row adds (:attr:`per_target`)."""
        if self.per_target is not None:
            return self.per_target(options, length)
        return max(self.forwards(options, length) - 1.0, 0.0)

    @classmethod
    def fixed(cls, forwards: float) -> Cost:
        """A cost of ``forwards`` forward equivalents per row (each its own call), whatever the options and length."""
        return cls(lambda options, length: forwards)

    @classmethod
    def copies(cls, per_copy: float, copies: Callable[[Mapping[str, OptionValue], int], int]) -> Cost:
        """The cost of a method that runs ``copies(options, n)`` copies of the row, ``per_copy`` forward equivalents
        each, ``internal_batch_size`` copies per call."""

        def calls(options: Mapping[str, OptionValue], length: int) -> float:
            per_call = int(options.get("internal_batch_size", COPIES_PER_PASS))
            return per_copy * -(-copies(options, length) // max(per_call, 1))

        def per_target(options: Mapping[str, OptionValue], length: int) -> float:
            # every copy's forward serves all targets; its backward (all but one forward equivalent) repeats
            return max(per_copy - 1.0, 0.0) * copies(options, length)

        return cls(lambda options, length: per_copy * copies(options, length), calls, per_target=per_target)


#: One grad-enabled forward and its backward (a backward costs about two forwards), the cost of a gradient method.
GRADIENT_PASS = 3.0
#: The same for one copy of a row among many in one call (integrated gradients' path points, SmoothGrad's samples):
#: measured with ``bench/timing.py``, a large batch of copies costs more per token than the measured forwards.
COPY_GRADIENT_PASS = 4.0


def _default_cost(needs: frozenset[str]) -> Cost:
    """The cost of a method computed from the capture pass that declares none: a gradient pass (with room for its
    kernels) if it needs gradients, else a forward on eager attention."""
    return Cost.fixed(GRADIENT_PASS + 1.0 if needs & GRADIENT_NEEDS else 2.0)


@dataclass(frozen=True)
class Objective:
    """What a method with forwards of its own explains: ``rounds`` scalar objectives per row, read from the logits.

    Attributes:
        rounds: ``K``.
        values: logits of ``s·B`` rows (the batch of ``B`` rows repeated ``s`` times, copy-major) → ``(K, s·B)`` each
            copy's objective in each round (0 where a row has no target in a round).
    """

    rounds: int
    values: Callable[[Tensor], Tensor]

    @classmethod
    def target_logits(cls, targets: Tensor) -> Objective:
        """A classifier's objective: one round, each row's logit of its class ``targets (B,)``."""

        def values(logits: Tensor) -> Tensor:
            copies = logits.shape[0] // targets.shape[0]
            return logits.gather(1, targets.repeat(copies).view(-1, 1)).view(1, -1)

        return cls(1, values)


@dataclass(frozen=True)
class ForwardInputs:
    """Everything a method that runs its own forwards may read.

    Attributes:
        model: the model, inside :func:`~explainers.capture.prepared_model`.
        arch: its description.
        inputs: the validated inputs of the ``B`` rows explained.
        objective: what to explain (:class:`Objective`).
        options: the method's options, resolved.
        dtype: the dtype of the scores (float32 at least).
        fused: the model's fused attention (``None``: eager), which the forwards run on (they read no maps).
        chunk_bytes: bound on the gradients of one batched vector-Jacobian call.
        deadline: when the answer is due (``None``: no deadline): checked before each chunk of copies.
    """

    model: nn.Module
    arch: Architecture
    inputs: Mapping[str, Tensor]
    objective: Objective
    options: Mapping[str, OptionValue]
    dtype: torch.dtype
    fused: str | None = None
    chunk_bytes: int = CHUNK_BYTES
    deadline: Deadline | None = None

    def check_deadline(self, where: str) -> None:
        """Abandon the work if the deadline has passed (:meth:`~explainers.deadline.Deadline.check`)."""
        if self.deadline is not None:
            self.deadline.check(where)


@dataclass(frozen=True)
class ForwardScores:
    """What a method with forwards of its own returns: ``scores (K, B, n)`` per round, row and input embedding (an
    image's patches, without its prefix tokens), and the seconds its gradient calls took (``backward``)."""

    scores: Tensor
    backward: float = 0.0


@dataclass(frozen=True)
class Forwards:
    """How a method runs forwards of its own, over copies of the inputs, besides the shared forward.

    Attributes:
        run: the implementation, for every round of an :class:`Objective` (one round on the classifier path).
        gradients: whether those forwards are differentiated (integrated gradients) or only read (a perturbation).
        rows_per_pass: ``(rows, options) → rows`` of one of its forwards for ``rows`` input rows (its memory is that
            of a pass over those rows); ``options`` may lack some options (their defaults apply).
    """

    run: Callable[[ForwardInputs], ForwardScores]
    gradients: bool
    rows_per_pass: Callable[[int, Mapping[str, OptionValue]], int]


@dataclass(frozen=True)
class LengthLimit:
    """The longest input a method explains (``tokens``), and why (``reason``, with what to use instead)."""

    tokens: int
    reason: str


@dataclass(frozen=True)
class Method:
    """A registered attribution method and its capabilities (see the module docstring).

    Attributes:
        name: the registry name (``attnlrp``, ``gae``...), the one requests, metrics labels and docs use.
        summary: one line saying what the method computes.
        class_specific: whether the scores depend on the explained target (``attention``, ``rollout`` and
            ``attention_flow`` do not).
        needs: what the capture pass records for it (attention maps, their gradients, embedding gradients...).
        options: the options it accepts, with their defaults and ranges (:class:`Option`).
        compute: the function from what was captured (:class:`MethodInputs`) to token-aligned scores ``(batch, n)``.
        memory: its memory shape (:class:`Memory`), turned into bytes by :mod:`explainers.memory`.
        rules: modified-gradient rules attached to the model for the pass that computes this method's gradients
            (``None``: true gradients). Rows of methods with different rules never share a gradient pass.
        forwards: forwards of its own over copies of the inputs (``None``: the method reads only what the capture
            pass recorded).
        length_limit: the longest input (tokens, or an image's patches and prefix tokens) it explains, and why
            (``None``: any).
        packages: Python packages it imports beyond the library's own (torch, transformers): module name ->
            requirement.
        cost: its time shape (:class:`Cost`: forward equivalents, forward calls and solver time as functions of the
            options and the length), turned into seconds by :mod:`explainers.timing` against a time budget.
    """

    name: str
    summary: str
    class_specific: bool
    needs: frozenset[str]
    options: tuple[Option, ...]
    compute: Callable[[MethodInputs], Tensor]
    memory: Memory
    rules: Rules | None = None
    forwards: Forwards | None = None
    length_limit: LengthLimit | None = None
    packages: Mapping[str, str] = field(default_factory=dict)
    #: Its time per row (:class:`Cost`), which :mod:`explainers.timing` turns into seconds.
    cost: Cost = field(default_factory=lambda: Cost.fixed(GRADIENT_PASS + 1.0))

    def admit(self, length: int) -> None:
        """Refuse, before any work, what the method cannot do here: an input longer than its :attr:`length_limit`,
        or any input when a package of :attr:`packages` is not installed.

        Raises:
            InvalidInputError: naming the limit, the reason and what to use instead.
            UnsupportedMethodError: naming the missing package and how to install it.
        """
        missing = [requirement for module, requirement in self.packages.items() if find_spec(module) is None]
        if missing:
            raise UnsupportedMethodError(
                f"method {self.name!r} needs {', '.join(missing)}, which is not installed here: "
                f"pip install {' '.join(repr(requirement) for requirement in missing)} (the serve extra has it)"
            )
        if self.length_limit is not None and length > self.length_limit.tokens:
            raise InvalidInputError(
                f"method {self.name!r} explains at most {self.length_limit.tokens} tokens, this input has {length}: "
                f"{self.length_limit.reason}"
            )

    @property
    def reads_maps(self) -> bool:
        """Whether the method reads attention maps (so its pass runs the architecture's eager attention)."""
        return bool(self.needs & MAP_NEEDS)

    @property
    def needs_gradients(self) -> bool:
        """Whether the method differentiates the target logit (in the capture pass, or in forwards of its own)."""
        return bool(self.needs & GRADIENT_NEEDS) or (self.forwards is not None and self.forwards.gradients)

    def resolve_options(self, options: Mapping[str, Any], arch: Architecture) -> dict[str, OptionValue]:
        """Validate ``options`` against this method and the model; fill in defaults.

        Args:
            options: the caller's options by name.
            arch: the model's :class:`~explainers.Architecture` (a range may depend on it, e.g. a layer index).

        Returns:
            Every option of the method with its value, defaults filled in.

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


def _add(method: Method) -> None:
    if method.name in _REGISTRY:
        raise ValueError(f"method {method.name!r} is already registered")
    if (method.memory.fused is None) != method.reads_maps:
        raise ValueError(
            f"method {method.name!r}: a method that reads attention maps runs eager attention and declares no fused "
            "footprint; any other declares one"
        )
    _REGISTRY[method.name] = method


def register(
    name: str,
    *,
    summary: str,
    class_specific: bool,
    needs: frozenset[str],
    memory: Memory,
    options: tuple[Option, ...] = (),
    rules: Rules | None = None,
    length_limit: LengthLimit | None = None,
    packages: Mapping[str, str] | None = None,
    cost: Cost | None = None,
) -> Callable[[Callable[[MethodInputs], Tensor]], Callable[[MethodInputs], Tensor]]:
    """Register a method computed from the capture pass under ``name`` (a decorator of its compute function).

    Args:
        name: the registry name.
        summary: one line for the docs.
        class_specific: whether the scores depend on the explained class.
        needs: what the capture pass records for it (a subset of :data:`~explainers.capture.NEEDS`).
        memory: its memory shape.
        options: its options.
        rules: modified-gradient rules for its gradient pass (``None``: true gradients).
        length_limit: the longest input it explains (``None``: any).
        packages: Python packages it imports beyond torch and transformers (module name -> requirement).
        cost: its time per row (``None``: a gradient pass if it needs gradients, else an eager forward).

    Raises:
        ValueError: for a name already registered, or a memory shape that does not fit ``needs``.
    """

    def decorate(compute: Callable[[MethodInputs], Tensor]) -> Callable[[MethodInputs], Tensor]:
        method = Method(name, summary, class_specific, needs, options, compute, memory, rules, None, length_limit)
        _add(replace(method, packages=packages or {}, cost=cost or _default_cost(needs)))
        return compute

    return decorate


def register_forwards(
    name: str,
    *,
    summary: str,
    class_specific: bool,
    memory: Memory,
    gradients: bool,
    rows_per_pass: Callable[[int, Mapping[str, OptionValue]], int],
    cost: Cost,
    options: tuple[Option, ...] = (),
) -> Callable[[Callable[[ForwardInputs], ForwardScores]], Callable[[ForwardInputs], ForwardScores]]:
    """Register a method that runs forwards of its own under ``name`` (a decorator of its :attr:`Forwards.run`).

    It needs nothing of the shared forward but the logits (its rows' targets); on the classifier path its scores are
    ``run``'s one round, aligned with the model's tokens (an image's prefix tokens get 0).

    Args:
        name: the registry name.
        summary: one line for the docs.
        class_specific: whether the scores depend on the explained class.
        memory: its memory shape (of one of its passes).
        gradients: whether its forwards are differentiated.
        rows_per_pass: see :class:`Forwards`.
        cost: its time per row, its forwards included (:class:`Cost`).
        options: its options.
    """

    def decorate(run: Callable[[ForwardInputs], ForwardScores]) -> Callable[[ForwardInputs], ForwardScores]:
        forwards = Forwards(run, gradients, rows_per_pass)
        compute = _on_classifier(run)
        _add(Method(name, summary, class_specific, frozenset(), options, compute, memory, None, forwards, cost=cost))
        return run

    return decorate


def _on_classifier(run: Callable[[ForwardInputs], ForwardScores]) -> Callable[[MethodInputs], Tensor]:
    """The classifier path's compute of a method with forwards of its own: one round, each row's target logit."""

    def compute(ctx: MethodInputs) -> Tensor:
        objective = Objective.target_logits(ctx.capture.targets)
        inputs = ForwardInputs(
            ctx.model, ctx.arch, ctx.inputs, objective, ctx.options, ctx.capture.logits.dtype, ctx.fused,
            deadline=ctx.deadline,
        )  # fmt: skip
        return _align(run(inputs).scores[0], ctx)

    return compute


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


# The memory shapes are fitted to peaks measured with ``bench/explainers.py --memory`` on an 8-layer Llama-shaped
# classifier (hidden 1024, 16 heads, 4 key/value heads, intermediate 2816) at 512 and 2048 tokens, where each is at or
# above the measured peak, and checked on BERT-base shapes (the closing note of issue 19 has both tables).
# ``rollout`` and ``attention`` keep one head mean per layer; ``gae`` keeps the probabilities and their gradients
# (part of the activations are freed by then); ``relevance`` also their relevances and what its rules read; a
# gradient method keeps on eager attention the probabilities its backward needs, and on fused attention no maps.
_HEAD_MEAN = Memory(Footprint(maps=0.0, transient=2.0, activations=0.0, head_means=1.0))
_LRP = Memory(Footprint(maps=4.0, transient=3.0, activations=8.0))


def _gradient_memory(activations: float) -> Memory:
    """The memory shape of a gradient method that reads no maps and keeps ``activations`` for its backward."""
    return Memory(
        eager=Footprint(maps=1.0, transient=2.0, activations=activations),
        fused=Footprint(maps=0.0, transient=0.0, activations=activations),
    )


#: The costs (forward equivalents per row, :class:`Cost`) of the methods computed from a gradient pass: on eager
#: attention, with the maps' gradients (``gae``, ``gradcam``); under modified-gradient rules (``attnlrp``, ``cp_lrp``,
#: whose hooks add to the backward); with Chefer et al.'s LRP rules and their kernels (``relevance``, ``lrp``,
#: ``partial_lrp``). Checked against measured times with ``bench/timing.py``.
MAPS_GRADIENT_PASS = 4.0
RULES_PASS = 4.0
LRP_PASS = 6.0

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
    memory=_HEAD_MEAN,
    cost=Cost.fixed(1.0),
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
    return maps.raw_attention(ctx.capture.attentions[int(ctx.options["layer"])], ctx.readout) * ctx.mask


@register(
    "rollout",
    summary="attention rollout (Abnar & Zuidema 2020), class-agnostic",
    class_specific=False,
    needs=frozenset({ATTENTIONS}),
    memory=_HEAD_MEAN,
    cost=Cost.fixed(1.0),
    options=(START_LAYER,),
)
def _rollout(ctx: MethodInputs) -> Tensor:
    assert ctx.capture.attentions is not None
    return maps.rollout_scores(ctx.capture.attentions, int(ctx.options["start_layer"]), ctx.readout) * ctx.mask


@register(
    "relevance",
    summary="LRP relevance x attention gradients, rolled out (Chefer, Gur & Wolf, CVPR 2021)",
    class_specific=True,
    needs=frozenset({ATTENTIONS, ATTENTION_GRADIENTS, ACTIVATIONS}),
    memory=_LRP,
    cost=Cost.fixed(LRP_PASS),
    options=(START_LAYER,),
)
def _relevance(ctx: MethodInputs) -> Tensor:
    assert ctx.capture.attention_gradients is not None
    start_layer = int(ctx.options["start_layer"])
    relevances = lrp_relevances(ctx.capture, ctx.arch, ctx.terms, start_layer).attention
    return maps.relevance_scores(
        relevances, ctx.capture.attention_gradients, ctx.mask, start_layer, ctx.readout, ctx.read_tokens
    )


@register(
    "gae",
    summary="gradient-weighted attention rollout (Chefer, Gur & Wolf, ICCV 2021)",
    class_specific=True,
    needs=frozenset({ATTENTIONS, ATTENTION_GRADIENTS}),
    memory=Memory(Footprint(maps=1.35, transient=2.0, activations=5.7)),
    cost=Cost.fixed(MAPS_GRADIENT_PASS),
    options=(START_LAYER,),
)
def _gae(ctx: MethodInputs) -> Tensor:
    assert ctx.capture.attentions is not None and ctx.capture.attention_gradients is not None
    return maps.gae_scores(
        ctx.capture.attentions,
        ctx.capture.attention_gradients,
        ctx.mask,
        int(ctx.options["start_layer"]),
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
    memory=_gradient_memory(activations=5.7),
    cost=Cost.fixed(GRADIENT_PASS),
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
    memory=_gradient_memory(activations=5.2),
    cost=Cost.fixed(RULES_PASS),
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
    memory=_gradient_memory(activations=3.7),
    cost=Cost.fixed(RULES_PASS),
    rules=partial(attach_rules, variant="cp_lrp"),
)
def _cp_lrp(ctx: MethodInputs) -> Tensor:
    """Relevance of each input token (patch): input embedding × CP-LRP's modified gradient, summed over hidden."""
    return _grad_x_input(ctx)


#: Integrated gradients' defaults: points on the path, and rows per forward while integrating.
IG_STEPS = 50
IG_INTERNAL_BATCH = 64


def _path_rows(rows: int, options: Mapping[str, OptionValue]) -> int:
    """Rows of one integrated-gradients forward: ``rows`` times the path points one forward holds."""
    steps = max(1, int(options.get("internal_batch_size", IG_INTERNAL_BATCH)) // rows)
    return rows * min(steps, int(options.get("n_steps", IG_STEPS)))


def _scaled(scale: Tensor) -> Callable[[Tensor], Tensor]:
    """Each row's input embeddings multiplied by its ``scale`` (a point on the straight path from zero)."""
    return lambda embeddings: embeddings * scale.view(-1, 1, 1)


def _gradient_times_input(
    run: ForwardInputs, chunks: list[tuple[int, Callable[[Tensor], Tensor]]], times_changed: bool
) -> tuple[Tensor, float]:
    """``Σ`` over copies of the inputs of ``Σ_hidden input · ∂ objective / ∂ changed input``, for every round and row:
    the shared loop of the methods that differentiate copies of the input embeddings.

    Args:
        run: the method's forward inputs.
        chunks: per forward, ``(copies, change)``: the batch repeated ``copies`` times (copy-major), its input
            embeddings changed by ``change`` (integrated gradients' path scaling, SmoothGrad's noise).
        times_changed: multiply each copy's gradient by its changed embeddings (SmoothGrad), or by the unchanged ones
            (integrated gradients, whose gradients are summed over the copies first).

    Returns:
        ``(K, B, n)`` the sums, and the seconds the gradient calls took. One batched vector-Jacobian product per chunk
        of rounds follows each forward (on the model's fused attention where it has one); the score is linear in the
        gradient, so each chunk adds its share directly (the per-round gradients are never all kept).
    """
    rounds = run.objective.rounds
    batch = batch_size(run.arch, run.inputs)
    device = model_device(run.model)
    scores: Tensor | None = None
    backward = 0.0
    for number, (steps, change) in enumerate(chunks):
        run.check_deadline(f"forward {number + 1} of {len(chunks)} over copies of the input")
        repeated = {key: value.repeat(steps, *([1] * (value.dim() - 1))) for key, value in run.inputs.items()}
        forward = forward_pass(
            run.model, run.arch, repeated, frozenset({EMBEDDING_GRADIENTS}), embeddings=change, fused=run.fused
        )
        assert forward.leaf is not None and forward.leaf.original is not None and forward.leaf.leaf is not None
        original = forward.leaf.original[:batch]  # (B, n, hidden): the same for every copy
        changed = forward.leaf.leaf.detach()  # (steps·B, n, hidden)
        if scores is None:
            scores = torch.zeros((rounds, batch, original.shape[1]), dtype=run.dtype, device=device)
        sums = run.objective.values(forward.logits).sum(dim=1)  # (K,): rows do not interact
        wrt = forward.gradient_inputs
        chunk = rounds_per_call(wrt, rounds, run.chunk_bytes, maps=False)
        for first in range(0, rounds, chunk):
            last = min(first + chunk, rounds)
            began = time.perf_counter()
            (gradient,) = batched_gradients(sums[first:last], wrt, retain=last < rounds)
            backward += time.perf_counter() - began
            with full_precision(device):
                if times_changed:
                    products = (gradient * changed.unsqueeze(0)).sum(dim=-1)  # (rounds, steps·B, n)
                    contribution = products.view(last - first, steps, batch, -1).sum(dim=1)
                else:
                    per_step = gradient.view(last - first, steps, batch, *gradient.shape[2:])
                    contribution = (per_step.sum(dim=1) * original.unsqueeze(0)).sum(dim=-1)
            scores[first:last] += contribution.to(scores.dtype)
    assert scores is not None
    return scores, backward


@register_forwards(
    "integrated_gradients",
    summary="integrated gradients on the input embeddings from a zero baseline, midpoint rule (saliency baseline)",
    class_specific=True,
    memory=_gradient_memory(activations=5.7),
    gradients=True,
    rows_per_pass=_path_rows,
    cost=Cost.copies(COPY_GRADIENT_PASS, lambda options, length: int(options.get("n_steps", IG_STEPS))),
    options=(
        Option(
            "n_steps",
            "points on the path",
            default=lambda arch: IG_STEPS,
            minimum=lambda arch: 1,
            maximum=lambda arch: 1024,
        ),
        Option(
            "internal_batch_size",
            "rows per forward pass while integrating (bounds memory)",
            default=lambda arch: IG_INTERNAL_BATCH,
            minimum=lambda arch: 1,
            maximum=lambda arch: 4096,
        ),
    ),
)
def _integrated_gradients(run: ForwardInputs) -> ForwardScores:
    """Integrated gradients (Sundararajan et al. 2017) along ``t·x``, ``t`` at the midpoints of ``n_steps`` bins, for
    every round of the objective.

    The baseline is the zero input embedding (word embedding for text, with position and segment embeddings still
    added by the model; patch embedding for images). Each chunk of path points is one forward of the repeated batch
    (``internal_batch_size`` rows at a time, so memory stays bounded whatever ``n_steps`` is), on the model's fused
    attention when it has one, followed by one batched vector-Jacobian product per chunk of rounds. The score is
    linear in the gradient, so each chunk adds its share to the scores directly (the per-round gradients are never
    all kept).
    """
    n_steps = int(run.options["n_steps"])
    batch = batch_size(run.arch, run.inputs)
    device = model_device(run.model)
    steps_per_pass = max(1, int(run.options["internal_batch_size"]) // batch)
    chunks: list[tuple[int, Callable[[Tensor], Tensor]]] = []
    for start in range(0, n_steps, steps_per_pass):
        points = torch.arange(start, min(start + steps_per_pass, n_steps), dtype=run.dtype, device=device) + 0.5
        chunks.append((points.shape[0], _scaled((points / n_steps).repeat_interleave(batch))))
    scores, backward = _gradient_times_input(run, chunks, times_changed=False)
    return ForwardScores(scores / n_steps, backward)


# ---- the baselines of the founding papers (issue 28) ----------------------------------------------------------


@register(
    "gradient",
    summary="L2 norm over the hidden dimension of the gradient w.r.t. each input embedding (Li et al. 2016)",
    class_specific=True,
    needs=frozenset({EMBEDDING_GRADIENTS}),
    memory=_gradient_memory(activations=5.7),
    cost=Cost.fixed(GRADIENT_PASS),
)
def _gradient(ctx: MethodInputs) -> Tensor:
    """Plain gradient saliency: ``‖∂ target / ∂ e_i‖₂`` of each token's word (patch) embedding ``e_i``."""
    assert ctx.capture.embedding_gradients is not None
    return _align(torch.linalg.vector_norm(ctx.capture.embedding_gradients, dim=-1), ctx)


def _scored_tokens(ctx: MethodInputs) -> Tensor:
    """``ctx.mask`` with an image's prefix tokens (class, distillation) left out: the tokens a method scores."""
    if ctx.arch.modality == "text":
        return ctx.mask
    scored = ctx.mask.clone()
    scored[..., : ctx.arch.prefix_tokens] = 0
    return scored


@register(
    "gradcam",
    summary="GradCAM on the last layer's attention, as Chefer et al.'s baseline (their generate_attn_gradcam)",
    class_specific=True,
    needs=frozenset({ATTENTIONS, ATTENTION_GRADIENTS}),
    memory=Memory(Footprint(maps=1.35, transient=2.0, activations=5.7)),
    cost=Cost.fixed(MAPS_GRADIENT_PASS),
)
def _gradcam(ctx: MethodInputs) -> Tensor:
    """Each head's last-layer map times the mean of its gradient, averaged over heads, negative part dropped, rescaled
    to [0, 1]: over the whole map for text (the authors' BERT code), over the explained row's patches for images
    (their ViT code)."""
    capture = ctx.capture
    assert capture.attentions is not None and capture.attention_gradients is not None
    text = ctx.arch.modality == "text"
    return maps.gradcam_scores(
        capture.attentions[-1],
        capture.attention_gradients[-1],
        _scored_tokens(ctx),
        ctx.readout,
        ctx.read_tokens,
        whole_map=text,
    )


@register(
    "partial_lrp",
    summary="partial LRP: last layer's attention relevance, mean over heads (Voita et al. 2019; Chefer et al.'s "
    "generate_LRP_last_layer)",
    class_specific=True,
    needs=frozenset({ATTENTIONS, ACTIVATIONS}),
    memory=_LRP,
    cost=Cost.fixed(LRP_PASS),
)
def _partial_lrp(ctx: MethodInputs) -> Tensor:
    """Chefer et al.'s LRP down to the last block's attention probabilities only; their positive part, averaged over
    heads, the explained row with the tokens the head reads set to 0."""
    last = ctx.arch.num_layers - 1
    relevance = lrp_relevances(ctx.capture, ctx.arch, ctx.terms, last).attention[last]
    assert relevance is not None
    return maps.partial_lrp_scores(relevance, _scored_tokens(ctx), ctx.readout, ctx.read_tokens)


@register(
    "lrp",
    summary="full LRP to the input of the first block, summed over hidden (Chefer et al.'s generate_full_lrp)",
    class_specific=True,
    needs=frozenset({ATTENTIONS, ACTIVATIONS}),
    memory=_LRP,
    cost=Cost.fixed(LRP_PASS),
)
def _lrp(ctx: MethodInputs) -> Tensor:
    """Chefer et al.'s LRP rules through every block to the first block's input, summed over the hidden dimension; for
    images the input's relevance is split between the patch (and prefix) embeddings and the position embeddings
    with the skip-connection rule first, as the authors' ViT code does. The tokens the head reads get 0."""
    below = lrp_relevances(ctx.capture, ctx.arch, ctx.terms, 0, to_input=True).below
    assert below is not None and ctx.capture.activations is not None
    if ctx.arch.input_positions is not None:
        hidden = ctx.capture.activations[0].hidden
        positions = ctx.arch.input_positions.detach().to(hidden.dtype).expand_as(hidden)
        below, _ = lrp_add_relprop(hidden - positions, positions, below)
    return maps.zero_read_tokens(below.sum(dim=-1), ctx.read_tokens) * _scored_tokens(ctx)


#: Attention flow's longest input, chosen from ``python -m bench.attention_flow`` (docs/SERVING.md, "The founding
#: papers' baselines"): a full batch of 8 rows of 128 tokens takes ~21 s on one core, inside the archives' 60 s
#: responseTimeout; 256 tokens take ~13.5 s a row, 8 rows ~108 s.
FLOW_MAX_TOKENS = 128


#: Attention flow's solver time for a row of 128 tokens through one layer, in reference jobs (fitted with
#: ``python -m bench.timing``, which compares it with the measured time).
FLOW_JOBS_PER_LAYER = 40.0


def _flow_seconds(length: int, layers: int) -> float:
    """Attention flow's maximum flows for a row of ``length`` tokens through ``layers`` blocks, in reference jobs:
    one flow per token over a graph of ``layers × n²`` edges (~2.6 s at 128 tokens, 13.5 s at 256 on one core for the
    sentiment model: the time grows as ``n^2.4``)."""
    relative = length / 128
    return FLOW_JOBS_PER_LAYER * layers * max(relative**2.4, relative)  # short rows: one flow per token dominates


@register(
    "attention_flow",
    summary="attention flow (Abnar & Zuidema 2020): exact max-flow through rollout's layer graph, sums to 1",
    class_specific=False,
    needs=frozenset({ATTENTIONS}),
    memory=_HEAD_MEAN,
    cost=Cost(lambda options, length: 1.0, solver=_flow_seconds),
    length_limit=LengthLimit(
        FLOW_MAX_TOKENS,
        "attention flow solves one exact maximum flow per token over a graph of layers x n^2 edges (about 2.6 s a "
        "row at 128 tokens, 13.5 s at 256 on one core: docs/SERVING.md, 'The founding papers' baselines'); use "
        "rollout, which it refines, or a shorter input",
    ),
    packages={"scipy": "scipy>=1.11"},
)
def _attention_flow(ctx: MethodInputs) -> Tensor:
    assert ctx.capture.attentions is not None
    return attention_flow_scores(ctx.capture.attentions, ctx.mask, ctx.readout) * ctx.mask


#: SmoothGrad's and occlusion's defaults: noisy copies, noise as a fraction of the embeddings' deviation (Smilkov et
#: al.'s 10-20%), its largest accepted value, and rows per forward.
SMOOTHGRAD_SAMPLES = 16
SMOOTHGRAD_STDEV = 0.15
SMOOTHGRAD_MAX_STDEV = 10.0
COPIES_PER_PASS = 64

INTERNAL_BATCH = Option.fixed(
    "internal_batch_size", "rows per forward pass over the copies (bounds memory)", COPIES_PER_PASS, 1, 4096
)


def _copies_per_pass(rows: int, options: Mapping[str, OptionValue]) -> int:
    """Copies of the batch one forward holds: ``internal_batch_size // rows``, at least one."""
    return max(1, int(options.get("internal_batch_size", COPIES_PER_PASS)) // rows)


def _embedding_mask(run: ForwardInputs, like: Tensor) -> Tensor:
    """``(B, n)`` bool: the input embeddings of real tokens (every patch of an image)."""
    if run.arch.modality == "image":
        return torch.ones(like.shape[:2], dtype=torch.bool, device=like.device)
    return run.inputs["attention_mask"].to(like.device).bool()


class _RowNoise:
    """SmoothGrad's noise: each row's own generator (seeded with ``seed``) draws ``(samples, real tokens, hidden)``
    standard normals at once, scaled by ``stdev`` times the standard deviation of the row's real input embeddings, so
    a row gets the same noise batched or alone (padding gets none)."""

    def __init__(self, samples: int, stdev: float, seed: int) -> None:
        self.samples, self.stdev, self.seed = samples, stdev, seed
        self.noise: Tensor | None = None  # (samples, B, n, hidden), drawn at the first forward

    def draw(self, embeddings: Tensor, mask: Tensor) -> Tensor:
        if self.noise is None:
            noise = torch.zeros((self.samples, *embeddings.shape), dtype=embeddings.dtype, device=embeddings.device)
            for row in range(embeddings.shape[0]):
                real = embeddings[row][mask[row]]
                generator = torch.Generator().manual_seed(self.seed)
                draws = torch.randn((self.samples, *real.shape), generator=generator, dtype=embeddings.dtype)
                scale = real.std() * self.stdev
                noise[:, row, mask[row]] = draws.to(embeddings.device) * scale
            self.noise = noise
        return self.noise


@register_forwards(
    "smoothgrad",
    summary="SmoothGrad (Smilkov et al. 2017) of gradient x input: mean over noisy copies of the input embeddings",
    class_specific=True,
    memory=_gradient_memory(activations=5.7),
    gradients=True,
    rows_per_pass=lambda rows, options: (
        rows * min(_copies_per_pass(rows, options), int(options.get("n_samples", SMOOTHGRAD_SAMPLES)))
    ),
    cost=Cost.copies(COPY_GRADIENT_PASS, lambda options, length: int(options.get("n_samples", SMOOTHGRAD_SAMPLES))),
    options=(
        Option.fixed("n_samples", "noisy copies of each row", SMOOTHGRAD_SAMPLES, 1, 256),
        Option.fixed_float(
            "stdev",
            "noise standard deviation, as a fraction of the row's input-embedding standard deviation (0: grad_x_input)",
            SMOOTHGRAD_STDEV,
            0.0,
            SMOOTHGRAD_MAX_STDEV,
        ),
        Option.fixed("seed", "seed of each row's noise", 0, 0, 2**31 - 1),
        INTERNAL_BATCH,
    ),
)
def _smoothgrad(run: ForwardInputs) -> ForwardScores:
    """SmoothGrad of gradient × input, as Captum's ``NoiseTunnel(InputXGradient)`` computes it: the mean over
    ``n_samples`` noisy copies ``x + ε`` of ``Σ_hidden (x + ε) · ∂ objective / ∂(x + ε)``, for every round.

    The copies run ``internal_batch_size`` rows per forward (copy-major, on the model's fused attention where it
    has one), each followed by one batched vector-Jacobian product per chunk of rounds, as integrated gradients'
    path points do.
    """
    samples = int(run.options["n_samples"])
    batch = batch_size(run.arch, run.inputs)
    per_pass = _copies_per_pass(batch, run.options)
    noise = _RowNoise(samples, float(run.options["stdev"]), int(run.options["seed"]))
    chunks: list[tuple[int, Callable[[Tensor], Tensor]]] = []
    for start in range(0, samples, per_pass):
        stop = min(start + per_pass, samples)

        def noisy(embeddings: Tensor, start: int = start, stop: int = stop) -> Tensor:
            original = embeddings[:batch]
            drawn = noise.draw(original, _embedding_mask(run, original))[start:stop]
            return embeddings + drawn.reshape(embeddings.shape)

        chunks.append((stop - start, noisy))
    scores, backward = _gradient_times_input(run, chunks, times_changed=True)
    return ForwardScores(scores / samples, backward)


def _vocabulary(arch: Architecture) -> int:
    """Rows of a text model's word-embedding table (0 for an image model: no token replaces a patch)."""
    return int(getattr(arch.input_embeddings, "num_embeddings", 0)) if arch.modality == "text" else 0


@register_forwards(
    "occlusion",
    summary="leave-one-out occlusion (Li et al. 2017): the target's drop when one input embedding is erased",
    class_specific=True,
    memory=Memory(eager=Footprint(maps=0.0, transient=2.0, activations=0.0), fused=Footprint(0.0, 0.0, 0.0)),
    gradients=False,
    rows_per_pass=lambda rows, options: rows * _copies_per_pass(rows, options),
    cost=Cost.copies(1.0, lambda options, length: length + 1),
    options=(
        Option(
            "baseline_token_id",
            "token whose word embedding replaces the erased one (-1: zeros; text only)",
            default=lambda arch: -1,
            minimum=lambda arch: -1,
            maximum=lambda arch: _vocabulary(arch) - 1,
        ),
        INTERNAL_BATCH,
    ),
)
def _occlusion(run: ForwardInputs) -> ForwardScores:
    """Leave-one-out erasure: for each input embedding (token or patch), the objective minus the objective with that
    embedding replaced by zeros (or by the word embedding of ``baseline_token_id``), for every round.

    Forwards only, without gradients: the batch repeated once per erased position plus once unchanged, copy-major,
    ``internal_batch_size`` rows per forward, on the model's fused attention where it has one.

    A causal LM's copies that erase position ``i`` see the unchanged positions ``< i`` exactly as the unchanged copy
    does, so for inputs of at least :data:`OCCLUSION_CACHE_MIN_TOKENS` columns the copies reuse its key/value cache
    (:func:`occluded_objectives` with ``prefix_cache=True``): one clean forward fills the cache, then each chunk of
    consecutive erased positions ``[i₀, i₁)`` (``internal_batch_size`` rows) recomputes only the columns ``≥ i₀`` on
    the first ``i₀`` cached ones (their logits are the unchanged copy's). The threshold is where
    ``python -m bench.occlusion`` measured the cache faster (docs/SERVING.md, "The founding papers' baselines"); the
    cache is also left out when one chunk holds every copy (nothing to reuse: only an extra forward). Otherwise, and
    for every other model, each copy runs the whole input. Both give the same scores (tests/test_occlusion_cache.py).
    No pass holds more than an uncached one: a chunk's cache holds its copies' first ``i₀`` positions, where the
    uncached forward holds all of them.
    """
    columns = int(run.inputs["input_ids"].shape[1]) if run.arch.modality == "text" else 0
    copies = _copies_per_pass(batch_size(run.arch, run.inputs), run.options)
    cached = run.arch.task == "causal_lm" and columns >= OCCLUSION_CACHE_MIN_TOKENS and columns > copies
    every = occluded_objectives(run, prefix_cache=cached)  # (K, 1 + positions, B)
    return ForwardScores((every[:, :1] - every[:, 1:]).permute(0, 2, 1))


#: The shortest causal-LM input (columns of the padded batch) whose occlusion reuses the unchanged prefix's key/value
#: cache (when its copies take more than one forward), from ``python -m bench.occlusion`` (docs/SERVING.md, "The
#: founding papers' baselines"): on one CPU thread a random 4-layer Llama-shaped LM took 1.17x-1.39x less time with
#: the cache wherever the copies took two forwards or more (16 to 256 tokens, 1 to 8 rows), the same (0.97x, 0.98x)
#: where one forward held nearly all of them; nothing shorter than 16 tokens was measured.
OCCLUSION_CACHE_MIN_TOKENS = 16


def occluded_objectives(run: ForwardInputs, prefix_cache: bool) -> Tensor:
    """``(K, 1 + positions, B)``: each round's objective of each row unchanged (index 0), then with each input
    embedding erased in turn (occlusion's forwards, see :func:`_occlusion`).

    Args:
        run: the method's forward inputs.
        prefix_cache: reuse the unchanged copy's key/value cache for the positions before each chunk's first erased
            one (causal LMs only: their position ``t`` depends on positions ``≤ t`` alone).

    Raises:
        ValueError: ``prefix_cache`` for a model that is not a causal LM.
    """
    batch = batch_size(run.arch, run.inputs)
    device = model_device(run.model)
    if run.arch.modality == "text":
        positions = int(run.inputs["input_ids"].shape[1])
    else:
        grid_h, grid_w = input_grid(run.arch, run.inputs)
        positions = grid_h * grid_w
    token = int(run.options["baseline_token_id"])
    baseline = torch.zeros((), device=device)
    if token >= 0:
        with torch.no_grad():
            baseline = run.arch.input_embeddings(torch.tensor([token], device=device))[0]
    per_pass = _copies_per_pass(batch, run.options)
    rounds = run.objective.rounds

    def erasing(chosen: Tensor, first: int) -> Callable[[Tensor], Tensor]:
        """Erase, in copy ``c`` of the batch, the embedding at column ``chosen[c]`` (the embeddings given start at
        column ``first``; ``-1``: erase nothing)."""

        def erase(embeddings: Tensor) -> Tensor:
            where = torch.arange(first, first + embeddings.shape[1], device=embeddings.device)
            hit = (where.view(1, -1) == chosen.view(-1, 1)).repeat_interleave(batch, dim=0).unsqueeze(-1)
            return torch.where(hit, baseline.to(embeddings.dtype), embeddings)

        return erase

    def repeated(inputs: Mapping[str, Tensor], copies: int) -> dict[str, Tensor]:
        return {key: value.repeat(copies, *([1] * (value.dim() - 1))) for key, value in inputs.items()}

    values: list[Tensor] = []
    if not prefix_cache:
        erased = list(range(-1, positions))  # -1: the unchanged copy
        for start in range(0, len(erased), per_pass):
            run.check_deadline(f"the occluded copies {start + 1}-{min(start + per_pass, len(erased))} of {len(erased)}")
            chosen = torch.tensor(erased[start : start + per_pass], device=device)
            steps = chosen.shape[0]
            forward = forward_pass(
                run.model, run.arch, repeated(run.inputs, steps), frozenset(), embeddings=erasing(chosen, 0),
                fused=run.fused,
            )  # fmt: skip
            values.append(run.objective.values(forward.logits).view(rounds, steps, batch))
        return torch.cat(values, dim=1).to(run.dtype)
    if run.arch.task != "causal_lm":
        raise ValueError(f"occlusion reuses a prefix cache for causal LMs only, not a {run.arch.task} model")
    from transformers import DynamicCache

    # Every layer keeps every position (no config: no sliding-window trimming), so any prefix can be cut from it.
    cache = DynamicCache()
    clean = forward_pass(run.model, run.arch, run.inputs, frozenset(), fused=run.fused, cache=cache)
    states: list[tuple[Tensor, Tensor]] = []
    for layer in cache.layers:
        keys, kept = getattr(layer, "keys", None), getattr(layer, "values", None)
        if not (isinstance(keys, Tensor) and isinstance(kept, Tensor) and keys.shape[-2] == positions):
            # a layer that keeps no per-position keys and values (linear attention, shared or trimmed caches)
            return occluded_objectives(run, prefix_cache=False)
        states.append((keys, kept))
    values.append(run.objective.values(clean.logits).view(rounds, 1, batch))
    for start in range(0, positions, per_pass):
        run.check_deadline(f"the occluded positions {start + 1}-{min(start + per_pass, positions)} of {positions}")
        chosen = torch.arange(start, min(start + per_pass, positions), device=device)
        steps = chosen.shape[0]
        suffix = {key: value if key == "attention_mask" else value[:, start:] for key, value in run.inputs.items()}
        prefix = None
        if start > 0:
            prefix = DynamicCache(
                [(keys[:, :, :start].repeat(steps, 1, 1, 1), kept[:, :, :start].repeat(steps, 1, 1, 1))
                 for keys, kept in states]
            )  # fmt: skip
        forward = forward_pass(
            run.model, run.arch, repeated(suffix, steps), frozenset(), embeddings=erasing(chosen, start),
            fused=run.fused, cache=prefix,
        )  # fmt: skip
        logits = forward.logits
        if start > 0:  # the columns before the chunk are the unchanged copy's
            logits = torch.cat([clean.logits[:, :start].repeat(steps, 1, 1), logits], dim=1)
        values.append(run.objective.values(logits).view(rounds, steps, batch))
        del prefix, forward, logits
    return torch.cat(values, dim=1).to(run.dtype)
