"""Public entry points: :func:`explain` for a batch with one method, :func:`explain_batch` for a served batch
whose rows each ask for their own method, target and options (one forward for all of them)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor, nn

from .architectures.attention import AttentionObserver, fused_implementation
from .architectures.description import Architecture, describe, model_config
from .architectures.heads import head_probabilities, last_positions, readout_tokens, readout_weights
from .architectures.support import TASKS, check_method, supported_methods
from .capture import (
    GRADIENT_NEEDS,
    Capture,
    bind_rules,
    prepared_model,
    run_capture,
)
from .confidence import RowSkipped, check_below, prediction_confidence
from .errors import (
    ExplainError,
    InvalidInputError,
    InvalidOptionError,
    InvalidTargetError,
    NonFiniteScoresError,
    UnsupportedModelError,
)
from .inputs import batch_size, full_precision, input_grid, token_mask, validate_inputs
from .memory import ModelSize, check_budget
from .methods import Method, MethodInputs, available_methods, get_method


@dataclass(frozen=True)
class Attribution:
    """The result of :func:`explain`.

    Attributes:
        method: the registry name of the method.
        target: ``(batch,)`` the class each row was explained for.
        logits: ``(batch, num_labels)``, equal to a plain forward's logits.
        scores: text ``(batch, seq_len)`` aligned with ``input_ids``, exactly 0 at padding;
            images ``(batch, grid_h, grid_w)`` over the patch grid, class token excluded.
        options: the options used, defaults filled in.
        modality: ``text`` or ``image``.
        attention_mask: text ``(batch, seq_len)`` mask of the real tokens; ``None`` for images.
        pooled: the position the head reads and the methods explain (:func:`explainers.pooled_position`):
            ``first``, ``last``, ``mean``, ``class_distillation`` or ``class_patch_mean``.
        head_type: ``single_label``, ``multi_label`` or ``regression`` (:func:`explainers.head_type`).
    """

    method: str
    target: Tensor
    logits: Tensor
    scores: Tensor
    options: Mapping[str, int]
    modality: str
    attention_mask: Tensor | None = None
    pooled: str = "first"
    head_type: str = "single_label"

    @property
    def probabilities(self) -> Tensor:
        """The outputs as the head means them, ``(batch, num_labels)``: softmax for a single-label head, a sigmoid
        per label for a multi-label head, the raw predicted values for a regression head."""
        return head_probabilities(self.logits, self.head_type)


@dataclass(frozen=True)
class RowRequest:
    """What one row of a served batch asks for: ``method=None`` means a prediction only; ``below`` (a probability
    in (0, 1]) asks for the explanation only when the prediction's confidence is below it
    (:mod:`explainers.confidence`), ``None`` always."""

    method: str | None = None
    target: int | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    below: float | None = None


@dataclass(frozen=True)
class RowExplanation:
    """The explanation of one row of :func:`explain_batch`.

    Attributes:
        method: registry name.
        target: class explained.
        options: options used, defaults filled in.
        scores: text ``(length,)`` trimmed to the row's real tokens (special tokens included; the padding
            removed on whichever side it was); images ``(grid_h, grid_w)``.
        seconds: wall time of the attribution kernels for the group of rows this row was computed with (a gradient
            pass of its own counts in :attr:`BatchExplanation.seconds`, ``backward``).
        pooled: the position explained (see :class:`Attribution`).
    """

    method: str
    target: int
    options: Mapping[str, int]
    scores: Tensor
    seconds: float
    pooled: str = "first"


@dataclass(frozen=True)
class BatchExplanation:
    """The result of :func:`explain_batch`.

    Attributes:
        logits: ``(batch, num_labels)`` from the one shared forward.
        rows: per row a :class:`RowExplanation`, ``None`` (prediction only), a :class:`RowSkipped` (asked to be
            explained only when unsure, and confident) or the :class:`ExplainError` that row's request raised (the
            other rows are unaffected).
        seconds: wall time of the shared stages: ``forward`` (the shared forward) and, if any row needed gradients,
            ``backward``: every gradient pass of the batch (the shared forward's backward, and the grad-enabled
            forward and backward of the rows that had a pass of their own), which every row of the batch waits for.
        pooled: the position explained (see :class:`Attribution`).
        head_type: see :class:`Attribution`.
    """

    logits: Tensor
    rows: list[RowExplanation | RowSkipped | ExplainError | None]
    seconds: Mapping[str, float]
    pooled: str = "first"
    head_type: str = "single_label"

    @property
    def probabilities(self) -> Tensor:
        """The outputs as the head means them (see :attr:`Attribution.probabilities`)."""
        return head_probabilities(self.logits, self.head_type)


def _validate_target(target: Any, batch: int, num_labels: int, head: str = "single_label") -> Tensor | None:
    if target is None:
        return None
    if isinstance(target, bool):
        raise InvalidTargetError(f"target must be None, an int or a LongTensor of shape ({batch},), got a bool")
    if isinstance(target, int):
        targets = torch.full((batch,), target, dtype=torch.long)
    elif isinstance(target, Tensor):
        if target.is_floating_point() or target.dtype == torch.bool or target.shape != (batch,):
            raise InvalidTargetError(
                f"a target tensor must be a LongTensor of shape ({batch},), got {target.dtype} {tuple(target.shape)}"
            )
        targets = target.long().cpu()
    else:
        raise InvalidTargetError(f"target must be None, an int or a LongTensor of shape ({batch},), got {target!r}")
    if bool(((targets < 0) | (targets >= num_labels)).any()):
        if head == "regression" and num_labels == 1:
            raise InvalidTargetError("this is a regression head with one output: its target is 0 (or None)")
        raise InvalidTargetError(f"target must be in [0, {num_labels - 1}] (the model has {num_labels} labels)")
    return targets


def _finish(arch: Architecture, scores: Tensor, inputs: Mapping[str, Tensor]) -> Tensor:
    """Token-aligned scores → the public shape: text as is, images on the patch grid without the prefix tokens."""
    if arch.modality == "text":
        return scores
    return scores[:, arch.prefix_tokens :].reshape(scores.shape[0], *input_grid(arch, inputs))


@dataclass(frozen=True)
class _Readout:
    """The rows the head reads: ``weights (batch, n)`` and the single tokens read (``tokens``, bool)."""

    weights: Tensor
    tokens: Tensor

    def rows(self, index: Tensor) -> _Readout:
        return _Readout(self.weights[index], self.tokens[index])


def _readout(arch: Architecture, model: nn.Module, inputs: Mapping[str, Tensor], mask: Tensor) -> _Readout:
    last = None
    if arch.pooled == "last":
        config = model_config(model)
        text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
        last = last_positions(inputs["input_ids"], mask, getattr(text_config, "pad_token_id", None))
    weights = readout_weights(arch.pooled, mask, arch.prefix_tokens, last)
    return _Readout(weights, readout_tokens(arch.pooled, weights))


def _describe_classifier(model: nn.Module) -> Architecture:
    """:func:`describe` for the entry points of this module, which explain sequence classifiers only.

    Raises:
        UnsupportedModelError: for a token classifier or a causal language model, naming the entry point to use.
    """
    arch = describe(model)
    if arch.task != "sequence_classification":
        task = TASKS[arch.task]
        raise UnsupportedModelError(
            f"{type(model).__name__} is a {task.title}, which explain/explain_batch do not explain (they explain "
            f"one label per input): use {task.entry_point}"
        )
    return arch


def _check_method(arch: Architecture, method: Method) -> None:
    check_method(arch.model_type, method.name, available_methods())


Rules = Callable[[nn.Module, Architecture, ExitStack], AttentionObserver | None]
RulesKey = Rules | None
#: Rows share a gradient pass only if their gradients come from the same rules on the same attention: (rules,
#: the fused attention implementation or ``None`` for eager).
PassKind = tuple[RulesKey, str | None]


def _pass_kind(method: Method, fused: str | None) -> PassKind:
    """The gradient pass ``method``'s rows need: its rules, on the fused attention unless it reads the maps."""
    return method.rules, None if method.reads_maps else fused


def _budget_check(
    model: nn.Module, arch: Architecture, budget_mib: int | None
) -> Callable[[str, int, int, Mapping[str, int]], None]:
    """``check(method, rows, length, options)``: :func:`~explainers.memory.check_budget` for this model."""
    if budget_mib is None:
        return lambda method, rows, length, options: None
    if isinstance(budget_mib, bool) or not isinstance(budget_mib, int) or budget_mib <= 0:
        raise InvalidOptionError(f"memory_budget_mib must be a positive integer (MiB) or None, got {budget_mib!r}")
    size = ModelSize.of(model, arch)
    alternatives = supported_methods(arch.model_type, available_methods())

    def check(method: str, rows: int, length: int, options: Mapping[str, int]) -> None:
        check_budget(size, method, rows, length, options, budget_mib, alternatives)

    return check


def _stage_seconds(shared: Capture, own: Sequence[Capture]) -> dict[str, float]:
    """The batch's ``forward`` (the shared forward) and ``backward`` (all its gradient work) seconds."""
    seconds = dict(shared.seconds)
    passes = {id(capture): capture for capture in own}.values()
    gradient = seconds.get("backward", 0.0) + sum(sum(capture.seconds.values()) for capture in passes)
    if gradient:
        seconds["backward"] = gradient
    return seconds


def _fixed_targets(targets: Tensor) -> Callable[[Tensor], Tensor]:
    """A target resolver that ignores the logits (a row's target was resolved by the shared forward)."""
    return lambda logits: targets


def explain(
    model: nn.Module,
    inputs: Mapping[str, Any],
    method: str = "relevance",
    target: Any = None,
    *,
    memory_budget_mib: int | None = None,
    **options: Any,
) -> Attribution:
    """Explain a batch of predictions of a Hugging Face classifier with one method.

    Args:
        model: a Hugging Face classifier of one of :func:`supported_model_types` (text encoders, decoder
            classifiers, vision Transformers; :mod:`explainers.architectures.support`). It is used in eval mode for
            the call and left exactly as it was found. The methods that read attention maps run the architecture's eager
            attention; ``grad_x_input``, ``integrated_gradients``, ``attnlrp`` and ``cp_lrp`` run on the attention
            the model was loaded with (``sdpa``; a model loaded with ``eager`` stays eager), so that their memory
            grows with the length, not its square.
        inputs: a tokenizer's output (``input_ids``, optional ``attention_mask``, optional ``token_type_ids`` for
            sentence pairs where the model has them) or an image processor's (``pixel_values``). Encoders take
            right padding; decoder classifiers take left or right padding.
        method: one of :func:`available_methods`.
        target: ``None`` (each row's predicted class), an ``int`` for every row, or a ``LongTensor (batch,)``.
        memory_budget_mib: refuse, before anything is allocated, a batch whose estimated peak memory
            (:mod:`explainers.memory`) exceeds this many MiB (``None``: no budget).
        **options: the method's options (``layer`` for ``attention``, ``start_layer`` for ``rollout``,
            ``relevance`` and ``gae``, ``n_steps``/``internal_batch_size`` for ``integrated_gradients``).

    Returns:
        An :class:`Attribution`.

    Raises:
        ExplainError: (a ``ValueError``) for an unknown method, bad target, bad option or wrong inputs;
            :class:`UnsupportedMethodError` for a method undefined on this architecture;
            :class:`~explainers.memory.MemoryBudgetError` for a batch over ``memory_budget_mib``.
    """
    arch = _describe_classifier(model)
    chosen = get_method(method)
    _check_method(arch, chosen)
    resolved = chosen.resolve_options(options, arch)
    validated = validate_inputs(arch, model, inputs)
    num_labels = int(model_config(model).num_labels)
    batch = batch_size(arch, validated)
    explicit = _validate_target(target, batch, num_labels, arch.head_type)

    def resolve(logits: Tensor) -> Tensor:
        return logits.argmax(dim=-1) if explicit is None else explicit.to(logits.device)

    mask = token_mask(arch, validated, model)
    _budget_check(model, arch, memory_budget_mib)(chosen.name, batch, int(mask.shape[-1]), resolved)
    readout = _readout(arch, model, validated, mask)
    fused = fused_implementation(model)  # read before prepared_model switches the model
    with prepared_model(model):
        rules = bind_rules(chosen.rules, model, arch)
        capture = run_capture(model, arch, validated, chosen.needs, resolve, rules=rules, fused=fused)
        with full_precision(mask.device):
            scores = chosen.compute(
                MethodInputs(
                    capture, arch, model, validated, mask, resolved, readout.weights, readout.tokens, fused=fused
                )
            )
    text_mask = validated.get("attention_mask") if arch.modality == "text" else None
    return Attribution(
        method=chosen.name,
        target=capture.targets,
        logits=capture.logits,
        scores=_finish(arch, scores, validated),
        options=resolved,
        modality=arch.modality,
        attention_mask=text_mask,
        pooled=arch.pooled,
        head_type=arch.head_type,
    )


def explain_batch(
    model: nn.Module,
    inputs: Mapping[str, Any],
    rows: Sequence[RowRequest],
    *,
    memory_budget_mib: int | None = None,
) -> BatchExplanation:
    """Predict a batch and explain each row as it asks; every row's prediction comes from one shared forward.

    Rows are grouped by method and options. Each row costs what its method costs, whatever it is batched with:

    * a batch whose rows all need gradients of one kind (the same rules on the same attention: true gradients on
      eager attention for ``gae`` and ``relevance``, true gradients on the model's fused attention for
      ``grad_x_input``, AttnLRP's or CP-LRP's rules on it) costs one grad-enabled forward and one backward;
    * otherwise the shared forward runs without gradients (on eager attention if a row reads maps — ``attention``,
      ``rollout`` — else on the model's fused attention), and each kind of gradient rows gets a grad-enabled pass
      of its own over its rows only; so prediction-only rows never wait in a backward, and a row on fused attention
      never holds attention maps because another row needed them.

    A row whose request is invalid (unknown method, bad target or option, over ``memory_budget_mib``) gets its
    :class:`ExplainError` in its place, and so does a row whose scores came out NaN or infinite
    (:class:`NonFiniteScoresError`); the others are served.

    A row with ``below`` is decided from the shared forward's logits: a confident one gets a :class:`RowSkipped`
    and costs no backward (nor a grad-enabled forward, unless another row needs one); an unsure one whose method
    needs gradients gets a gradient pass of its own over the unsure rows (as rows of another gradient kind do).

    Args:
        model: see :func:`explain`.
        inputs: the batched inputs of all rows (right-padded for text).
        rows: one :class:`RowRequest` per row.
        memory_budget_mib: refuse a row whose explanation alone (its own length, batch 1) is estimated to need more
            than this many MiB (:class:`~explainers.memory.MemoryBudgetError`, before anything is allocated); a
            batch's peak is at most the sum of its rows' estimates. ``None``: no budget.

    Returns:
        A :class:`BatchExplanation`.

    Raises:
        ExplainError: if ``inputs`` are invalid or ``rows`` does not match the batch size (the batch as a whole
            cannot be served).
    """
    arch = _describe_classifier(model)
    validated = validate_inputs(arch, model, inputs)
    batch = batch_size(arch, validated)
    if len(rows) != batch:
        raise InvalidInputError(f"got {len(rows)} row requests for a batch of {batch}")
    num_labels = int(model_config(model).num_labels)
    mask = token_mask(arch, validated, model)
    lengths = mask.sum(dim=-1).tolist()
    within_budget = _budget_check(model, arch, memory_budget_mib)
    fused = fused_implementation(model)  # read before prepared_model switches the model
    results: list[RowExplanation | RowSkipped | ExplainError | None] = [None] * batch
    # (method, options, whether the rows are explained only when unsure) -> rows
    groups: dict[tuple[str, tuple[tuple[str, int], ...], bool], list[int]] = {}
    conditional: dict[int, float] = {}  # row -> its ``below``
    methods: dict[str, Method] = {}
    explicit = torch.full((batch,), -1, dtype=torch.long)
    for index, row in enumerate(rows):
        if row.method is None:
            continue
        try:
            method = get_method(row.method)
            _check_method(arch, method)
            options = method.resolve_options(row.options, arch)
            target = _validate_target(row.target, 1, num_labels, arch.head_type)
            below = check_below(row.below)
            if below is not None and arch.head_type == "regression":
                raise InvalidOptionError("'below' needs class probabilities, and a regression head has none")
            within_budget(method.name, 1, int(lengths[index]), options)
        except ExplainError as error:
            results[index] = error
            continue
        if target is not None:
            explicit[index] = target[0]
        if below is not None:
            conditional[index] = below
        methods[method.name] = method
        groups.setdefault((method.name, tuple(sorted(options.items())), below is not None), []).append(index)

    def deferred(name: str, when_unsure: bool) -> bool:  # decided after the shared forward, gradients on their own
        return when_unsure and bool(methods[name].needs & GRADIENT_NEEDS)

    # Gradient rows by the pass they need. If they all need one kind and no other row is in the batch, the shared
    # forward is that kind's pass (one forward, one backward). Otherwise the shared forward needs no gradients: it
    # gives every row's logits and the maps of the rows that read maps without gradients, and each kind of gradient
    # rows gets a pass of its own over its rows.
    kinds: dict[PassKind, list[int]] = {}
    others = any(row.method is None for row in rows)  # prediction-only rows
    for (name, _, when_unsure), indices in groups.items():
        if methods[name].needs & GRADIENT_NEEDS and not when_unsure:
            kinds.setdefault(_pass_kind(methods[name], fused), []).extend(indices)
        else:
            others = True
    shared_kind: PassKind | None = next(iter(kinds)) if len(kinds) == 1 and not others else None
    needs: frozenset[str] = frozenset().union(
        *(
            methods[name].needs
            for name, _, when_unsure in groups
            if not deferred(name, when_unsure) and (shared_kind is not None or not methods[name].needs & GRADIENT_NEEDS)
        )
    )
    gradient_rows = torch.zeros(batch, dtype=torch.bool)
    if shared_kind is not None:
        gradient_rows[kinds[shared_kind]] = True

    def resolve(logits: Tensor) -> Tensor:
        chosen = explicit.to(logits.device)
        return torch.where(chosen >= 0, chosen, logits.argmax(dim=-1))

    readout = _readout(arch, model, validated, mask)
    with prepared_model(model):
        shared_rules, shared_fused = (None, fused) if shared_kind is None else shared_kind
        capture = run_capture(
            model,
            arch,
            validated,
            needs,
            resolve,
            gradient_rows.to(mask.device),
            bind_rules(shared_rules, model, arch),
            fused=shared_fused,
        )
        own: dict[int, tuple[Capture, int]] = {}  # row -> (its kind's own capture, its position in it)
        passes = {kind: kind_rows for kind, kind_rows in kinds.items() if kind != shared_kind}
        if conditional:  # the decision, from the shared forward: skip the confident rows, pass the unsure ones on
            confidence = prediction_confidence(capture.logits, arch.head_type).tolist()
            for key in [key for key in groups if key[2]]:
                unsure = [index for index in groups[key] if confidence[index] < conditional[index]]
                for index in set(groups[key]) - set(unsure):
                    results[index] = RowSkipped(key[0], float(confidence[index]), conditional[index])
                if unsure:
                    groups[key] = unsure
                else:
                    del groups[key]
                if unsure and deferred(key[0], True):
                    passes.setdefault(_pass_kind(methods[key[0]], fused), []).extend(unsure)
        for kind, kind_rows in passes.items():
            ordered = sorted(kind_rows)
            picked = torch.tensor(ordered, device=mask.device)
            kind_needs = frozenset().union(
                *(methods[name].needs for (name, _, _), indices in groups.items() if set(indices) & set(ordered))
            )
            kind_capture = run_capture(
                model,
                arch,
                {key: value[picked] for key, value in validated.items()},
                kind_needs,
                _fixed_targets(capture.targets[picked]),
                rules=bind_rules(kind[0], model, arch),
                fused=kind[1],
            )
            kind_capture = replace(kind_capture, logits=capture.logits[picked])
            own.update({row: (kind_capture, position) for position, row in enumerate(ordered)})
        for (name, options_key, _), indices in groups.items():
            started = time.perf_counter()
            selected = torch.tensor(indices, device=mask.device)
            whole = len(indices) == batch
            if indices[0] in own:  # rows with their own gradient pass (its time counts in the batch's backward)
                kind_capture = own[indices[0]][0]
                positions = torch.tensor([own[index][1] for index in indices], device=mask.device)
                sub_capture = kind_capture.rows(positions)
            else:
                sub_capture = capture if whole else capture.rows(selected)
            sub_inputs = validated if whole else {key: value[selected] for key, value in validated.items()}
            sub_readout = readout if whole else readout.rows(selected)
            with full_precision(mask.device):
                scores = methods[name].compute(
                    MethodInputs(
                        sub_capture,
                        arch,
                        model,
                        sub_inputs,
                        mask[selected],
                        dict(options_key),
                        sub_readout.weights,
                        sub_readout.tokens,
                        fused=fused,
                    )
                )
            scores = _finish(arch, scores, validated).detach()
            seconds = time.perf_counter() - started
            finite = torch.isfinite(scores.flatten(1)).all(dim=1).tolist()
            for position, row_index in enumerate(indices):
                if not finite[position]:
                    results[row_index] = NonFiniteScoresError(
                        f"method {name!r} gave NaN or infinite scores for this input (a numerical breakdown of the "
                        "attribution; the other rows are unaffected); another method may still explain it"
                    )
                    continue
                row_scores = scores[position]
                if arch.modality == "text":
                    row_scores = row_scores[mask[row_index].bool()]
                results[row_index] = RowExplanation(
                    name, int(capture.targets[row_index]), dict(options_key), row_scores, seconds, arch.pooled
                )
    return BatchExplanation(
        logits=capture.logits,
        rows=results,
        seconds=_stage_seconds(capture, [kind_capture for kind_capture, _ in own.values()]),
        pooled=arch.pooled,
        head_type=arch.head_type,
    )
