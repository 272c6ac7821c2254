"""Run a :class:`~explainers.plan.BatchPlan` on a classifier: the shared forward, the decision on the rows explained
only when unsure, the gradient passes of their own, and each group's scores.

:func:`execute` is the model-facing half of :func:`explainers.explain_batch` (the plan is the other): it returns every
group's scores in the public shape (:func:`finish`) with the shared forward's logits and targets, and leaves checking
and packaging the rows to the caller. :class:`Readout` and :func:`finish` serve :func:`explainers.explain` as well.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import torch
from torch import Tensor, nn

from .architectures.description import Architecture, model_config
from .architectures.heads import last_positions, readout_tokens, readout_weights
from .capture import Capture, bind_rules, prepared_model, run_capture
from .confidence import RowSkipped, prediction_confidence
from .deadline import DeadlineExceededError
from .inputs import full_precision, input_grid
from .methods.registry import MethodInputs
from .plan import BatchPlan, Group


@dataclass(frozen=True)
class Readout:
    """The rows the head reads: ``weights (batch, n)`` and the single tokens read (``tokens``, bool)."""

    weights: Tensor
    tokens: Tensor

    @classmethod
    def of(cls, arch: Architecture, model: nn.Module, inputs: Mapping[str, Tensor], mask: Tensor) -> Readout:
        """What ``model``'s head reads in the validated ``inputs`` whose real tokens are ``mask``."""
        last = None
        if arch.pooled == "last":
            config = model_config(model)
            text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
            last = last_positions(inputs["input_ids"], mask, getattr(text_config, "pad_token_id", None))
        weights = readout_weights(arch.pooled, mask, arch.prefix_tokens, last)
        return cls(weights, readout_tokens(arch.pooled, weights))

    def rows(self, index: Tensor) -> Readout:
        """The readout of the rows ``index``."""
        return Readout(self.weights[index], self.tokens[index])


def finish(arch: Architecture, scores: Tensor, inputs: Mapping[str, Tensor]) -> Tensor:
    """Token-aligned scores → the public shape: text as is, images on the patch grid without the prefix tokens."""
    if arch.modality == "text":
        return scores
    return scores[:, arch.prefix_tokens :].reshape(scores.shape[0], *input_grid(arch, inputs))


@dataclass(frozen=True)
class GroupScores:
    """One group's scores.

    Attributes:
        group: the group (after the decision: its unsure rows only).
        scores: ``(rows, ...)`` in the public shape (:func:`finish`), detached, padding not removed (empty when
            ``abandoned``).
        seconds: wall time of the attribution kernels for the group.
        abandoned: the group's deadline passed before its scores were done (its rows answer this error).
    """

    group: Group
    scores: Tensor
    seconds: float
    abandoned: DeadlineExceededError | None = None


@dataclass(frozen=True)
class Execution:
    """What running a plan gave.

    Attributes:
        logits: ``(batch, num_labels)`` from the shared forward.
        targets: ``(batch,)`` the class each row is explained for.
        groups: each scored group, in the plan's order.
        skipped: the rows explained only when unsure that were confident.
        seconds: ``forward`` (the shared forward) and, if any row needed gradients, ``backward`` (all the batch's
            gradient work: the shared forward's backward and the passes of their own).
    """

    logits: Tensor
    targets: Tensor
    groups: list[GroupScores]
    skipped: dict[int, RowSkipped]
    seconds: dict[str, float]


def execute(
    model: nn.Module,
    arch: Architecture,
    inputs: Mapping[str, Tensor],
    mask: Tensor,
    plan: BatchPlan,
    resolve_targets: Callable[[Tensor], Tensor],
) -> Execution:
    """Run ``plan`` on ``model`` (the module docstring).

    Args:
        model: the classifier (left exactly as it was found).
        arch: its description.
        inputs: the validated inputs of the whole batch.
        mask: ``(batch, n)`` 1 for the real tokens (:func:`~explainers.inputs.token_mask`).
        plan: the batch's plan.
        resolve_targets: maps the shared forward's logits to the ``(batch,)`` targets.

    Returns:
        An :class:`Execution`.
    """
    batch = mask.shape[0]
    readout = Readout.of(arch, model, inputs, mask)
    with prepared_model(model):
        shared = plan.shared
        gradient_rows = torch.zeros(batch, dtype=torch.bool)
        gradient_rows[list(shared.rows)] = True
        capture = run_capture(
            model,
            arch,
            inputs,
            shared.needs,
            resolve_targets,
            gradient_rows.to(mask.device),
            bind_rules(shared.rules, model, arch),
            fused=shared.fused,
        )
        skipped: dict[int, RowSkipped] = {}
        if plan.below:  # the decision, from the shared forward: skip the confident rows, pass the unsure ones on
            plan, skipped = plan.decided(prediction_confidence(capture.logits, arch.head_type).tolist())
        own: dict[int, tuple[Capture, int]] = {}  # row -> (its pass's capture, its position in it)
        for kind in plan.own:
            picked = torch.tensor(kind.rows, device=mask.device)
            kind_capture = run_capture(
                model,
                arch,
                {key: value[picked] for key, value in inputs.items()},
                kind.needs,
                _fixed_targets(capture.targets[picked]),
                rules=bind_rules(kind.rules, model, arch),
                fused=kind.fused,
            )
            kind_capture = replace(kind_capture, logits=capture.logits[picked])
            own.update({row: (kind_capture, position) for position, row in enumerate(kind.rows)})
        scored = [_score(group, capture, own, model, arch, inputs, mask, readout, plan.fused) for group in plan.groups]
    return Execution(
        logits=capture.logits,
        targets=capture.targets,
        groups=scored,
        skipped=skipped,
        seconds=_stage_seconds(capture, [kind_capture for kind_capture, _ in own.values()]),
    )


def _score(
    group: Group,
    capture: Capture,
    own: Mapping[int, tuple[Capture, int]],
    model: nn.Module,
    arch: Architecture,
    inputs: Mapping[str, Tensor],
    mask: Tensor,
    readout: Readout,
    fused: str | None,
) -> GroupScores:
    """Score ``group`` from its rows' capture: their pass of their own (whose time counts in the batch's
    ``backward``), or the shared one; abandoned (no scores) once the group's deadline has passed, before or between
    the chunks of a method that runs forwards of its own."""
    started = time.perf_counter()
    try:
        if group.deadline is not None:
            group.deadline.check(f"scoring the {group.method.name} rows")
        return _scored(group, capture, own, model, arch, inputs, mask, readout, fused, started)
    except DeadlineExceededError as error:
        return GroupScores(group, torch.empty(0), time.perf_counter() - started, error)


def _scored(
    group: Group,
    capture: Capture,
    own: Mapping[int, tuple[Capture, int]],
    model: nn.Module,
    arch: Architecture,
    inputs: Mapping[str, Tensor],
    mask: Tensor,
    readout: Readout,
    fused: str | None,
    started: float,
) -> GroupScores:
    indices = list(group.rows)
    selected = torch.tensor(indices, device=mask.device)
    whole = len(indices) == mask.shape[0]
    if indices[0] in own:
        positions = torch.tensor([own[index][1] for index in indices], device=mask.device)
        sub_capture = own[indices[0]][0].rows(positions)
    else:
        sub_capture = capture if whole else capture.rows(selected)
    sub_inputs = inputs if whole else {key: value[selected] for key, value in inputs.items()}
    sub_readout = readout if whole else readout.rows(selected)
    with full_precision(mask.device):
        scores = group.method.compute(
            MethodInputs(
                sub_capture,
                arch,
                model,
                sub_inputs,
                mask[selected],
                dict(group.options),
                sub_readout.weights,
                sub_readout.tokens,
                fused=fused,
                deadline=group.deadline,
            )
        )
    scores = finish(arch, scores, inputs).detach()
    return GroupScores(group, scores, time.perf_counter() - started)


def _fixed_targets(targets: Tensor) -> Callable[[Tensor], Tensor]:
    """A target resolver that ignores the logits (a row's target was resolved by the shared forward)."""
    return lambda logits: targets


def _stage_seconds(shared: Capture, own: Sequence[Capture]) -> dict[str, float]:
    """The batch's ``forward`` (the shared forward) and ``backward`` (all its gradient work) seconds."""
    seconds = dict(shared.seconds)
    passes = {id(capture): capture for capture in own}.values()
    gradient = seconds.get("backward", 0.0) + sum(sum(capture.seconds.values()) for capture in passes)
    if gradient:
        seconds["backward"] = gradient
    return seconds
