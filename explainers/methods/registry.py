"""The registry of attribution methods, and what each method declares it needs.

A method is a name, its options with their ranges, a function from what was captured to token-aligned scores
``(batch, n)`` (for images ``n`` counts the class token first), and its *capabilities*, declared once at its
registration and read by everything else (nothing outside :mod:`explainers.methods` looks at a method's name):

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
validation, the serving layer, metrics labels, the memory budget and the generated tests. The methods themselves are
registered by the other modules of :mod:`explainers.methods`, which importing the package runs; this module also
holds the pieces of their declarations they share (:func:`gradient_memory`, :data:`INTERNAL_BATCH`) and the helpers
that place their scores on the model's tokens (:func:`align_to_tokens`, :func:`scored_tokens`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from importlib.util import find_spec
from typing import Any

import torch
from torch import Tensor, nn

from ..architectures.attention import AttentionObserver
from ..architectures.description import Architecture
from ..capture import CHUNK_BYTES, GRADIENT_NEEDS, MAP_NEEDS, Capture
from ..deadline import Deadline
from ..errors import InvalidInputError, InvalidOptionError, UnknownMethodError, UnsupportedMethodError

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
        return align_to_tokens(run(inputs).scores[0], ctx)

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


# The memory shapes the methods declare are fitted to peaks measured with ``bench/explainers.py --memory`` on an
# 8-layer Llama-shaped classifier (hidden 1024, 16 heads, 4 key/value heads, intermediate 2816) at 512 and 2048 tokens,
# where each is at or above the measured peak, and checked on BERT-base shapes (the closing note of issue 19 has both
# tables). A gradient method keeps on eager attention the probabilities its backward needs, and on fused attention no
# maps.


def gradient_memory(activations: float) -> Memory:
    """The memory shape of a gradient method that reads no maps and keeps ``activations`` for its backward.

    Args:
        activations: elements per token and layer kept for the backward (:attr:`Footprint.activations`).
    """
    return Memory(
        eager=Footprint(maps=1.0, transient=2.0, activations=activations),
        fused=Footprint(maps=0.0, transient=0.0, activations=activations),
    )


#: Rows per forward of the methods that run copies of the inputs (SmoothGrad's noisy copies, occlusion's erased ones)
#: unless their ``internal_batch_size`` says otherwise.
COPIES_PER_PASS = 64

INTERNAL_BATCH = Option.fixed(
    "internal_batch_size", "rows per forward pass over the copies (bounds memory)", COPIES_PER_PASS, 1, 4096
)


def copies_per_pass(rows: int, options: Mapping[str, OptionValue]) -> int:
    """Copies of the batch one forward holds: ``internal_batch_size // rows``, at least one.

    Args:
        rows: the rows of the batch explained.
        options: the method's options (``internal_batch_size`` may be missing: :data:`COPIES_PER_PASS` applies).
    """
    return max(1, int(options.get("internal_batch_size", COPIES_PER_PASS)) // rows)


def align_to_tokens(per_embedding: Tensor, ctx: MethodInputs) -> Tensor:
    """Align embedding-level scores with the model's token sequence (the prefix tokens of an image model, class and
    distillation, have no input: 0).

    Args:
        per_embedding: ``(batch, embeddings)`` scores of the input embeddings (an image's patches).
        ctx: what the method reads (the model's description and the token mask).

    Returns:
        ``(batch, n)`` the scores on the model's tokens, 0 on padding.
    """
    if ctx.arch.modality == "image":
        per_embedding = torch.nn.functional.pad(per_embedding, (ctx.arch.prefix_tokens, 0))
    return per_embedding * ctx.mask


def scored_tokens(ctx: MethodInputs) -> Tensor:
    """``ctx.mask`` with an image's prefix tokens (class, distillation) left out: the tokens a method scores.

    Args:
        ctx: what the method reads.
    """
    if ctx.arch.modality == "text":
        return ctx.mask
    scored = ctx.mask.clone()
    scored[..., : ctx.arch.prefix_tokens] = 0
    return scored
