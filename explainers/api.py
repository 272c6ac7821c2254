"""Public entry points for sequence classifiers: :func:`explain` for a batch with one method, :func:`explain_batch` for
a served batch whose rows each ask for their own method, target and options (one shared forward for all of them).

:func:`explain_batch` validates each row's request, plans which rows share which pass (:mod:`explainers.plan`), runs
the plan (:mod:`explainers.execution`) and packages each row's answer.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from .architectures.attention import fused_implementation
from .architectures.description import Architecture, describe, model_config
from .architectures.heads import head_probabilities
from .architectures.support import TASKS, check_method, refusal, working_methods
from .capture import bind_rules, prepared_model, run_capture
from .confidence import RowSkipped, check_below
from .deadline import Deadline
from .defaults import DEFAULT_METHOD
from .errors import (
    ExplainError,
    InvalidInputError,
    InvalidOptionError,
    InvalidTargetError,
    NonFiniteScoresError,
    UnsupportedModelError,
)
from .execution import Execution, GroupScores, Readout, execute, finish
from .inputs import batch_size, full_precision, token_mask, validate_inputs
from .memory import ModelSize, check_budget
from .methods.registry import Method, MethodInputs, OptionValue, available_methods, get_method
from .plan import Ask, plan_batch
from .served_speed import PREDICT, BatchLedger, ServedSpeed, work_kind
from .timing import ModelSpeed, TimeBudgetError, check_time_budget, prediction_seconds


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
    options: Mapping[str, OptionValue]
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
    """What one row of a served batch asks for (see :func:`explain_batch`).

    Attributes:
        method: the registry name of the method; ``None`` means a prediction only.
        target: the class to explain; ``None``: the row's predicted class.
        options: the method's options (see :func:`explain`).
        below: a probability in (0, 1]: explain only when the prediction's confidence is below it
            (:mod:`explainers.confidence`); ``None``: always.
        deadline: when the row's answer is due (:mod:`explainers.deadline`); ``None``: no deadline.
    """

    method: str | None = None
    target: int | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    below: float | None = None
    deadline: Deadline | None = None


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
    options: Mapping[str, OptionValue]
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
    if refusal(arch.model_type, method.name) is not None:  # (the methods are listed for the refusal only)
        check_method(arch.model_type, method.name, available_methods())


def _budget_check(
    model: nn.Module, arch: Architecture, budget_mib: int | None
) -> Callable[[str, int, int, Mapping[str, OptionValue]], None]:
    """``check(method, rows, length, options)``: :func:`~explainers.memory.check_budget` for this model."""
    if budget_mib is None:
        return lambda method, rows, length, options: None
    if isinstance(budget_mib, bool) or not isinstance(budget_mib, int) or budget_mib <= 0:
        raise InvalidOptionError(f"memory_budget_mib must be a positive integer (MiB) or None, got {budget_mib!r}")
    size = ModelSize.of(model, arch)
    alternatives = _WorkingMethods(arch.model_type)

    def check(method: str, rows: int, length: int, options: Mapping[str, OptionValue]) -> None:
        check_budget(size, method, rows, length, options, budget_mib, alternatives)

    return check


@dataclass(frozen=True)
class _WorkingMethods:
    """The registered methods that work on ``model_type``, listed when iterated: only a refusal names them, so a
    batch whose rows are admitted never lists them."""

    model_type: str

    def __iter__(self) -> Iterator[str]:
        return iter(working_methods(self.model_type, available_methods()))


def _check_time_budget_s(budget_s: float | None) -> float | None:
    if budget_s is None:
        return None
    if isinstance(budget_s, bool) or not isinstance(budget_s, int | float) or not budget_s > 0:
        raise InvalidOptionError(f"time_budget_s must be a positive number of seconds or None, got {budget_s!r}")
    return float(budget_s)


def _speed_of(model: nn.Module, arch: Architecture, length: int, speed: ModelSpeed | None) -> ModelSpeed:
    """``speed``, or the model's measured at ``length`` (:meth:`~explainers.timing.ModelSpeed.measure`)."""
    return speed if speed is not None else ModelSpeed.measure(model, arch, length)


def explain(
    model: nn.Module,
    inputs: Mapping[str, Any],
    method: str = DEFAULT_METHOD,
    target: Any = None,
    *,
    memory_budget_mib: int | None = None,
    time_budget_s: float | None = None,
    deadline: Deadline | float | None = None,
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
        method: one of :func:`available_methods`; default :data:`~explainers.DEFAULT_METHOD` (``attnlrp``), which
            every supported family accepts.
        target: ``None`` (each row's predicted class), an ``int`` for every row, or a ``LongTensor (batch,)``.
        memory_budget_mib: refuse, before anything is allocated, a batch whose estimated peak memory
            (:mod:`explainers.memory`) exceeds this many MiB (``None``: no budget).
        time_budget_s: refuse, before any work, a batch whose estimated time (:mod:`explainers.timing`) exceeds this
            many seconds (``None``: no budget). The model's speed is measured for it on each call (a few forwards);
            :func:`explain_batch` takes a speed measured once (``speed=``).
        deadline: abandon the work once this :class:`~explainers.deadline.Deadline` (or this many seconds from now)
            has passed: refused at once if it already has, else checked between the chunks of a method that runs
            forwards of its own.
        **options: the method's options (``layer`` for ``attention``, ``start_layer`` for ``rollout``,
            ``relevance`` and ``gae``, ``n_steps``/``internal_batch_size`` for ``integrated_gradients``).

    Returns:
        An :class:`Attribution`.

    Raises:
        ExplainError: (a ``ValueError``) for an unknown method, bad target, bad option or wrong inputs;
            :class:`UnsupportedMethodError` for a method undefined on this architecture;
            :class:`~explainers.memory.MemoryBudgetError` for a batch over ``memory_budget_mib``;
            :class:`~explainers.timing.TimeBudgetError` for a batch over ``time_budget_s``;
            :class:`~explainers.deadline.DeadlineExceededError` once ``deadline`` has passed.
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
    chosen.admit(int(mask.sum(dim=-1).max()))
    _budget_check(model, arch, memory_budget_mib)(chosen.name, batch, int(mask.shape[-1]), resolved)
    budget_s = _check_time_budget_s(time_budget_s)
    if deadline is not None and not isinstance(deadline, Deadline):
        deadline = Deadline.within(deadline)
    if deadline is not None:
        deadline.check("any work")
    if budget_s is not None:
        length = int(mask.shape[-1])
        alternatives = _WorkingMethods(arch.model_type)
        measured = ModelSpeed.measure(model, arch, length)
        check_time_budget(measured, chosen, length, resolved, budget_s, alternatives, rows=batch)
    readout = Readout.of(arch, model, validated, mask)
    fused = fused_implementation(model)  # read before prepared_model switches the model
    with prepared_model(model):
        rules = bind_rules(chosen.rules, model, arch)
        capture = run_capture(model, arch, validated, chosen.needs, resolve, rules=rules, fused=fused)
        with full_precision(mask.device):
            scores = chosen.compute(
                MethodInputs(
                    capture,
                    arch,
                    model,
                    validated,
                    mask,
                    resolved,
                    readout.weights,
                    readout.tokens,
                    fused=fused,
                    deadline=deadline,
                )
            )
    text_mask = validated.get("attention_mask") if arch.modality == "text" else None
    return Attribution(
        method=chosen.name,
        target=capture.targets,
        logits=capture.logits,
        scores=finish(arch, scores, validated),
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
    time_budget_s: float | None = None,
    speed: ModelSpeed | ServedSpeed | None = None,
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

    A row whose request is invalid (unknown method, bad target or option, over ``memory_budget_mib`` or
    ``time_budget_s``, a deadline passed) gets its :class:`ExplainError` in its place, and so does a row whose scores
    came out NaN or infinite (:class:`NonFiniteScoresError`); the others are served.

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
        time_budget_s: the batch's time budget (:mod:`explainers.timing`): the prediction-only rows are estimated
            first, then each explained row in order; a row whose estimate (at the batch's padded length) is over the
            budget alone, or over what the rows admitted before it left, is refused with
            :class:`~explainers.timing.TimeBudgetError` before any work. ``None``: no budget.
        speed: the model's speed for the time estimate (``None``: measured on the model when a budget is given); a
            :class:`~explainers.served_speed.ServedSpeed` admits each kind of row (a method, a prediction) at its
            corrected speed and is handed the batch's actual seconds once it ran, so that a server's estimates follow
            the batches it serves.

    A row's :attr:`RowRequest.deadline` that has passed on arrival refuses the row without work; one that passes
    later abandons the row's group before it is scored or between the chunks of its forwards
    (:class:`~explainers.deadline.DeadlineExceededError` in its place); the other rows are answered.

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
    mask = token_mask(arch, validated, model)
    results: list[RowExplanation | RowSkipped | ExplainError | None] = [None] * batch
    asks: dict[int, Ask] = {}
    explicit = torch.full((batch,), -1, dtype=torch.long)
    lengths = mask.sum(dim=-1).tolist()
    within_budget = _budget_check(model, arch, memory_budget_mib)
    budget_s = _check_time_budget_s(time_budget_s)
    padded = int(mask.shape[-1])
    measured: list[ModelSpeed] = []
    alternatives: Iterable[str] = ()
    ledger = speed.ledger() if isinstance(speed, ServedSpeed) and budget_s is not None else None
    if ledger is None and budget_s is not None and any(row.method is not None for row in rows):
        assert not isinstance(speed, ServedSpeed)
        measured.append(_speed_of(model, arch, padded, speed))
    if budget_s is not None and (ledger is not None or measured):
        alternatives = _WorkingMethods(arch.model_type)

    def speed_of(kind: str) -> ModelSpeed:
        return ledger.speed(kind, padded) if ledger is not None else measured[0]

    admitted = 0.0
    if ledger is not None or measured:
        admitted = sum(prediction_seconds(speed_of(PREDICT), padded) for row in rows if row.method is None)
        if ledger is not None and any(row.method is None for row in rows):
            ledger.add(PREDICT, admitted, padded)
    num_labels = int(model_config(model).num_labels)
    for index, row in enumerate(rows):
        if row.method is None:
            continue
        try:
            ask, target = _ask(row, arch, num_labels)
            ask.method.admit(int(lengths[index]))
            within_budget(ask.method.name, 1, int(lengths[index]), ask.options)
            if ask.deadline is not None:
                ask.deadline.check("any work")
            if ledger is not None or measured:
                arguments = (ask.method, padded, ask.options, budget_s, alternatives, admitted)
                kind = work_kind(ask.method.name, ask.options)
                try:
                    seconds = check_time_budget(speed_of(kind), *arguments)
                except TimeBudgetError as error:  # over the budget alone: a probe no batch corrected may be stale
                    if error.beside or not isinstance(speed, ServedSpeed) or not speed.recheck(kind):
                        raise
                    seconds = check_time_budget(speed_of(kind), *arguments)
                admitted += seconds
                if ledger is not None:
                    ledger.add(kind, seconds, padded)
        except ExplainError as error:
            results[index] = error
            continue
        asks[index] = ask
        if target is not None:
            explicit[index] = target

    def resolve(logits: Tensor) -> Tensor:
        chosen = explicit.to(logits.device)
        return torch.where(chosen >= 0, chosen, logits.argmax(dim=-1))

    fused = fused_implementation(model)  # read before prepared_model switches the model
    plan = plan_batch(asks, fused, predictions=any(row.method is None for row in rows))
    done = _executed(ledger, lambda: execute(model, arch, validated, mask, plan, resolve))
    for index, skipped in done.skipped.items():
        results[index] = skipped
    if done.groups:  # each row's target and real tokens, read once for the batch
        targets, real = done.targets.tolist(), _real_tokens(mask) if arch.modality == "text" else []
        for scored in done.groups:
            _package(scored, targets, real, arch, results)
    return BatchExplanation(
        logits=done.logits, rows=results, seconds=done.seconds, pooled=arch.pooled, head_type=arch.head_type
    )


def _executed(ledger: BatchLedger | None, run: Callable[[], Execution]) -> Execution:
    """``run()``, its wall-clock seconds settled into ``ledger`` (when there is one)."""
    started = time.perf_counter()
    done = run()
    if ledger is not None:
        ledger.settle(time.perf_counter() - started)
    return done


def _ask(row: RowRequest, arch: Architecture, num_labels: int) -> tuple[Ask, int | None]:
    """``row``'s request checked against the model: the :class:`~explainers.plan.Ask` and its explicit target.

    Raises:
        ExplainError: for an unknown or refused method, a bad option, target or ``below``.
    """
    assert row.method is not None
    method = get_method(row.method)
    _check_method(arch, method)
    options = method.resolve_options(row.options, arch)
    target = _validate_target(row.target, 1, num_labels, arch.head_type)
    below = check_below(row.below)
    if below is not None and arch.head_type == "regression":
        raise InvalidOptionError("'below' needs class probabilities, and a regression head has none")
    return Ask(method, options, below, row.deadline), None if target is None else int(target[0])


def _package(
    scored: GroupScores,
    targets: Sequence[int],
    real: Sequence[slice | Tensor],
    arch: Architecture,
    results: list[RowExplanation | RowSkipped | ExplainError | None],
) -> None:
    """Put each row of a scored group in ``results``: its :class:`RowExplanation` (text trimmed to its real tokens,
    ``real``: :func:`_real_tokens`), or a :class:`NonFiniteScoresError` if its scores came out NaN or infinite, or the
    group's :class:`~explainers.deadline.DeadlineExceededError` if it was abandoned."""
    if scored.abandoned is not None:
        for row_index in scored.group.rows:
            results[row_index] = scored.abandoned
        return
    name = scored.group.method.name
    finite = torch.isfinite(scored.scores.flatten(1)).all(dim=1).tolist()
    for position, row_index in enumerate(scored.group.rows):
        if not finite[position]:
            results[row_index] = NonFiniteScoresError(
                f"method {name!r} gave NaN or infinite scores for this input (a numerical breakdown of the "
                "attribution; the other rows are unaffected); another method may still explain it"
            )
            continue
        row_scores = scored.scores[position]
        if arch.modality == "text":
            row_scores = row_scores[real[row_index]]
        results[row_index] = RowExplanation(
            name, targets[row_index], dict(scored.group.options), row_scores, scored.seconds, arch.pooled
        )


def _real_tokens(mask: Tensor) -> list[slice | Tensor]:
    """Each row's real tokens (``mask`` nonzero) as an index of its scores: a slice where they are one run (right or
    left padding, read from the mask once for the batch), else the row's boolean mask (the same elements either
    way)."""
    real: list[slice | Tensor] = []
    for index, row in enumerate(mask.bool().tolist()):
        count = row.count(True)
        start = row.index(True) if count else 0
        if all(row[start : start + count]):
            real.append(slice(start, start + count))
        else:
            real.append(mask[index].bool())
    return real
