"""Many targets from one forward: token-level heads explained for every target a batch asks.

A token-level head has an output at every position: a token classifier a label distribution per token, a causal
language model a next-token distribution per position. What is worth explaining are *targets* over those outputs:
an entity's summed logit of its label over its tokens, a generated token's logit at the step that produced it, the
log-probability of a whole continuation, the difference between a token and a foil. :class:`Targets` describes
``K`` *rounds* of targets over a batch — in round ``k`` each row has at most one scalar objective — and
:func:`explain_targets` explains every (round, row) with **one forward for the batch**:

* map methods (``attention``, ``rollout``) read each target's row of the maps of that forward: the kernels take
  ``k`` explained rows per example (:mod:`explainers.rules.maps`), so the maps are read once, never copied per target;
* gradient methods (``grad_x_input``, ``attnlrp``, ``cp_lrp``, ``gae``) need one vector-Jacobian product per
  target. The rows of a batch do not interact, so one backward of ``Σ_b objective[k, b]`` gives every row its
  gradient for round ``k``; the ``K`` rounds are batched into one ``torch.autograd.grad(..., is_grads_batched=True)``
  call (a vmap over the backward), in chunks of rounds whose gradients fit :data:`CHUNK_BYTES`. A class-specific
  method without gradients (``partial_lrp``, ``lrp``) seeds its own LRP pass at each target instead;
* a method that runs forwards of its own (``integrated_gradients``:
  :attr:`explainers.methods.registry.Method.forwards`) gets every round as its objective: its one implementation, the
  classifier path's, runs its path forwards once for all targets, each followed by the same batched products.

Each explained (round, row) is then scored by the registered method's own compute function as a *virtual row*: the
row's captured tensors, the round's gradients, the target's readout row (:attr:`Targets.readout`) and the positions
it may depend on (:attr:`Targets.visible`). A virtual row is a classifier whose single output is the target's
objective; so, by construction, a target's scores are what the classifier path (:func:`explainers.explain`) gives
for that objective, and the tests check exactly that (for a causal LM: the context up to the target's position
alone, its LM head read as a classifier over the vocabulary, the token as target).

Attention: as in :func:`explainers.explain`, the map methods (and ``gae``, which differentiates the maps) run the
architecture's eager attention; ``grad_x_input``, ``integrated_gradients``, ``attnlrp`` and ``cp_lrp`` run on the
model's own fused attention where it has one (:func:`~explainers.architectures.attention.fused_implementation`), so that
their memory grows with the length and a step's scores match the classifier path's on the same model.

Memory: the gradients of a chunk of ``c`` rounds take ``c ×`` the size of what is differentiated (the input
embeddings, and for ``gae`` every layer's per-head maps). When all rounds fit in one chunk there is one backward
call and the graph is freed by it; otherwise the graph is kept (``retain_graph``) until the last chunk's call.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor, nn

from ..architectures.attention import fused_implementation
from ..architectures.description import Architecture, describe
from ..architectures.support import TASKS, check_method
from ..capture import (
    ATTENTION_GRADIENTS,
    ATTENTIONS,
    CHUNK_BYTES,
    EMBEDDING_GRADIENTS,
    GRADIENT_NEEDS,
    Capture,
    Forward,
    batched_gradients,
    bind_rules,
    forward_pass,
    prepared_model,
    rounds_per_call,
)
from ..deadline import Deadline
from ..errors import InvalidTargetError, UnsupportedModelError
from ..inputs import full_precision, validate_inputs
from ..methods.registry import (
    ForwardInputs,
    Method,
    MethodInputs,
    Objective,
    OptionValue,
    available_methods,
    get_method,
)

TOKEN_LEVEL_TASKS = frozenset({"token_classification", "causal_lm"})


@dataclass(frozen=True)
class Targets:
    """``K`` rounds of targets over a batch of ``B`` rows of ``n`` positions, on outputs of ``C`` classes.

    In round ``k`` row ``b``'s objective is ``Σ_j weights[k, b, j] · out[b, positions[k, b, j], labels[k, b, j]]``,
    where ``out`` is the logits ``(B, n, C)`` or, with ``log_probabilities``, their log-softmax over the classes.
    Unused terms have weight 0.

    Attributes:
        positions: ``(K, B, J)`` long, the positions of each objective's terms.
        labels: ``(K, B, J)`` long, the class of each term (a label, or a vocabulary id).
        weights: ``(K, B, J)`` float, each term's weight (``1`` and ``-1`` for a contrast with a foil).
        readout: ``(K, B, n)`` float, the rows of the attention maps the target reads (one-hot at a generation
            step's position; uniform over an entity's tokens); used by the map methods and by the rollouts of
            ``gae``, whose self-relevance is suppressed at the tokens read (``readout > 0``).
        visible: ``(K, B, n)`` bool, the positions the target may depend on (a causal model's step: its position
            and before; an encoder: every real token); scores are exactly 0 elsewhere, and at padding.
        active: ``(K, B)`` bool, whether row ``b`` has a target in round ``k`` (scores and value are 0 if not).
        log_probabilities: objectives on log-probabilities instead of logits.
    """

    positions: Tensor
    labels: Tensor
    weights: Tensor
    readout: Tensor
    visible: Tensor
    active: Tensor
    log_probabilities: bool = False

    def __post_init__(self) -> None:
        if self.positions.dim() != 3 or self.labels.shape != self.positions.shape:
            raise InvalidTargetError(
                f"positions and labels must both be (rounds, batch, terms), got {tuple(self.positions.shape)} and "
                f"{tuple(self.labels.shape)}"
            )
        if self.weights.shape != self.positions.shape:
            raise InvalidTargetError(f"weights must be {tuple(self.positions.shape)}, got {tuple(self.weights.shape)}")
        rounds, batch = self.positions.shape[:2]
        if self.readout.dim() != 3 or self.readout.shape[:2] != (rounds, batch):
            raise InvalidTargetError(f"readout must be ({rounds}, {batch}, n), got {tuple(self.readout.shape)}")
        if self.visible.shape != self.readout.shape:
            raise InvalidTargetError(f"visible must be {tuple(self.readout.shape)}, got {tuple(self.visible.shape)}")
        if self.active.shape != (rounds, batch):
            raise InvalidTargetError(f"active must be ({rounds}, {batch}), got {tuple(self.active.shape)}")

    @property
    def rounds(self) -> int:
        """``K``."""
        return int(self.positions.shape[0])

    def objective(self, logits: Tensor) -> Tensor:
        """Every round's objective for every row: ``(K, B)`` from logits ``(B, n, C)``.

        Logits of ``s·B`` rows (the batch repeated ``s`` times, as integrated gradients' path is) give ``(K, s·B)``:
        each copy of a row gets that row's objective. Inactive (round, row) pairs are 0.
        """
        rounds, batch, _ = self.positions.shape
        copies = logits.shape[0] // batch
        if copies * batch != logits.shape[0] or copies == 0:
            raise InvalidTargetError(f"targets of a batch of {batch} rows cannot read logits of {logits.shape[0]} rows")
        rows = torch.arange(logits.shape[0], device=logits.device).view(copies, 1, batch, 1)
        positions = self.positions.to(logits.device).unsqueeze(0)  # (1, K, B, J)
        labels = self.labels.to(logits.device).unsqueeze(0)
        picked = logits[rows, positions, labels]  # (copies, K, B, J)
        if self.log_probabilities:
            normaliser = torch.logsumexp(logits, dim=-1)  # (copies·B, n)
            picked = picked - normaliser[rows, positions]
        weights = (self.weights.to(logits.device) * self.active.to(logits.device).unsqueeze(-1)).to(picked.dtype)
        values = (picked * weights.unsqueeze(0)).sum(dim=-1)  # (copies, K, B)
        return values.permute(1, 0, 2).reshape(rounds, copies * batch)

    @classmethod
    def at_positions(
        cls,
        positions: Tensor,
        labels: Tensor,
        active: Tensor,
        attention_mask: Tensor,
        *,
        causal: bool,
        foils: Tensor | None = None,
        log_probabilities: bool = False,
    ) -> Targets:
        """One output per target: the logit of ``labels[k, b]`` at ``positions[k, b]`` (minus the logit of
        ``foils[k, b]`` there, when foils are given: a contrastive target).

        Args:
            positions: ``(K, B)`` long.
            labels: ``(K, B)`` long.
            active: ``(K, B)`` bool.
            attention_mask: ``(B, n)`` 1 for real tokens.
            causal: whether the model is causal (a target sees its position and the real tokens before it).
            foils: optional ``(K, B)`` long foil classes.
            log_probabilities: explain log-probabilities instead of logits (equal for a contrast).
        """
        if positions.dim() != 2 or labels.shape != positions.shape or active.shape != positions.shape:
            raise InvalidTargetError(
                "positions, labels and active must all be (rounds, batch), got "
                f"{tuple(positions.shape)}, {tuple(labels.shape)} and {tuple(active.shape)}"
            )
        if foils is not None and foils.shape != positions.shape:
            raise InvalidTargetError(f"foils must be {tuple(positions.shape)}, got {tuple(foils.shape)}")
        length = attention_mask.shape[-1]
        readout = torch.zeros((*positions.shape, length), dtype=torch.float64, device=positions.device)
        readout.scatter_(2, positions.clamp(0, length - 1).unsqueeze(-1), 1.0)
        real = attention_mask.to(positions.device).bool().unsqueeze(0)
        visible = real.expand(*positions.shape, length)
        if causal:
            before = torch.arange(length, device=positions.device).view(1, 1, -1) <= positions.unsqueeze(-1)
            visible = visible & before
        if foils is None:
            terms, classes, weights = positions.unsqueeze(-1), labels.unsqueeze(-1), torch.ones_like(readout[..., :1])
        else:
            terms = torch.stack([positions, positions], dim=-1)
            classes = torch.stack([labels, foils], dim=-1)
            weights = torch.tensor([1.0, -1.0], dtype=torch.float64, device=positions.device).expand(*terms.shape)
        return cls(terms, classes, weights, readout, visible.clone(), active.bool(), log_probabilities)

    @classmethod
    def over_spans(cls, spans: Sequence[Sequence[tuple[int, int, int]]], attention_mask: Tensor) -> Targets:
        """Round ``k`` = each row's ``k``-th span ``(start, end, label)`` (token positions, ``end`` exclusive): the
        summed logit of ``label`` over the span's tokens, read (for the map methods) as the mean of their rows;
        every real token is visible. Rows with fewer spans are inactive in the later rounds.

        Args:
            spans: per row, its spans ``(start, end, label)``.
            attention_mask: ``(B, n)`` the batch's attention mask (1 at real tokens).

        Raises:
            InvalidTargetError: for an empty span, or one outside the row's real tokens.
        """
        batch, length = attention_mask.shape
        if len(spans) != batch:
            raise InvalidTargetError(f"got spans for {len(spans)} rows, expected one list per row ({batch})")
        real = attention_mask.bool()
        rounds = max((len(row) for row in spans), default=0)
        width = max((end - start for row in spans for start, end, _ in row), default=1)
        positions = torch.zeros((rounds, batch, width), dtype=torch.long)
        labels = torch.zeros((rounds, batch, width), dtype=torch.long)
        weights = torch.zeros((rounds, batch, width), dtype=torch.float64)
        readout = torch.zeros((rounds, batch, length), dtype=torch.float64)
        active = torch.zeros((rounds, batch), dtype=torch.bool)
        for row, row_spans in enumerate(spans):
            for index, (start, end, label) in enumerate(row_spans):
                if not 0 <= start < end <= length or not bool(real[row, start:end].all()):
                    raise InvalidTargetError(
                        f"span ({start}, {end}) of row {row} must be a non-empty range of real tokens (end exclusive)"
                    )
                size = end - start
                positions[index, row, :size] = torch.arange(start, end)
                labels[index, row, :size] = int(label)
                weights[index, row, :size] = 1.0
                readout[index, row, start:end] = 1.0 / size
                active[index, row] = True
        device = attention_mask.device
        visible = real.unsqueeze(0).expand(rounds, batch, length).clone()
        return cls(
            positions.to(device), labels.to(device), weights.to(device), readout.to(device), visible, active.to(device)
        )


@dataclass(frozen=True)
class TargetExplanation:
    """The result of :func:`explain_targets`.

    Attributes:
        method: the registry name of the method.
        options: the options used, defaults filled in.
        targets: the targets explained (resolved, if a callable was given).
        logits: ``(B, n, C)`` the forward's logits, detached.
        values: ``(K, B)`` each target's objective value (0 where inactive).
        scores: ``(K, B, n)`` each target's attribution over the positions, exactly 0 outside its visible positions,
            at padding and for inactive (round, row) pairs.
        seconds: wall time of the stages: ``forward``, ``backward`` (every gradient call), ``attribution``.
    """

    method: str
    options: Mapping[str, OptionValue]
    targets: Targets
    logits: Tensor
    values: Tensor
    scores: Tensor
    seconds: Mapping[str, float]


TargetsOrResolver = Targets | Callable[[Tensor], Targets]


def explain_targets(
    model: nn.Module,
    inputs: Mapping[str, Any],
    targets: TargetsOrResolver,
    *,
    method: str,
    chunk_bytes: int = CHUNK_BYTES,
    deadline: Deadline | None = None,
    **options: Any,
) -> TargetExplanation:
    """Explain every target of a batch of a token-level model, with one forward for the batch.

    Args:
        model: a token classifier or causal language model of the support registry (:data:`explainers.TASKS`). It
            is used in eval mode with the capture attention for the call and left exactly as it was found.
        inputs: a tokenizer's batch (``input_ids``, ``attention_mask``; decoders take left or right padding).
        targets: a :class:`Targets`, or a function from the forward's detached logits ``(B, n, C)`` to one (for
            targets that depend on the predictions, such as the entities a token classifier found).
        method: one of :func:`explainers.available_methods` that the model's family and task accept.
        chunk_bytes: bound on the gradients of one batched vector-Jacobian call.
        deadline: when the answer is due (``None``: none): checked before the forward, before each chunk of rounds'
            gradients and between the chunks of a method's own forwards (:mod:`explainers.deadline`).
        **options: the method's options, as :func:`explainers.explain` takes them.

    Returns:
        A :class:`TargetExplanation`.

    Raises:
        ExplainError: for an unknown or refused method, a bad option, bad inputs or targets that do not fit them;
            :class:`UnsupportedModelError` for a sequence classifier (use :func:`explainers.explain`);
            :class:`~explainers.deadline.DeadlineExceededError` once ``deadline`` has passed.
    """
    arch = describe(model)
    if arch.task not in TOKEN_LEVEL_TASKS:
        raise UnsupportedModelError(
            f"{type(model).__name__} is a {TASKS[arch.task].title}: explain it with {TASKS[arch.task].entry_point}"
        )
    chosen = get_method(method)
    check_method(arch.model_type, chosen.name, available_methods(), arch.task)
    resolved = chosen.resolve_options(options, arch)
    validated = validate_inputs(arch, model, inputs)
    mask = validated["attention_mask"]
    chosen.admit(int(mask.sum(dim=-1).max()))
    needs = chosen.needs
    if deadline is not None:
        deadline.check("any work")
    fused = fused_implementation(model)  # read before prepared_model switches the model
    with prepared_model(model):
        forward = forward_pass(model, arch, validated, needs, bind_rules(chosen.rules, model, arch), fused=fused)
        logits = forward.logits
        explained = targets(logits.detach()) if callable(targets) else targets
        _check_targets(explained, logits, mask)
        explained = _prepared(explained, logits.device)
        values = explained.objective(logits)
        seconds = dict(forward.seconds)
        started = time.perf_counter()
        call = _Call(chosen, resolved, model, arch, validated, explained, _score_dtype(logits), chunk_bytes, deadline)
        if chosen.forwards is not None:
            timed = _own_forward_scores(call, fused)
            scores = timed.scores
            if chosen.forwards.gradients and bool(explained.active.any()):
                seconds["backward"] = timed.seconds
        elif not needs & GRADIENT_NEEDS and not chosen.class_specific:
            scores = _map_scores(call, forward)
        else:
            timed = _target_scores(call, forward, values)
            scores = timed.scores
            if needs & GRADIENT_NEEDS:
                seconds["backward"] = timed.seconds
        seconds["attribution"] = time.perf_counter() - started - seconds.get("backward", 0.0)
    visible = explained.visible & mask.bool().unsqueeze(0) & explained.active.unsqueeze(-1)
    return TargetExplanation(
        method=chosen.name,
        options=resolved,
        targets=explained,
        logits=logits.detach(),
        values=values.detach(),
        scores=torch.where(visible, scores, torch.zeros((), dtype=scores.dtype, device=scores.device)),
        seconds=seconds,
    )


def _check_targets(targets: Targets, logits: Tensor, mask: Tensor) -> None:
    batch, length, classes = logits.shape
    if targets.positions.shape[1] != batch or targets.readout.shape[-1] != length:
        raise InvalidTargetError(
            f"targets are for a batch of {targets.positions.shape[1]} rows of {targets.readout.shape[-1]} positions, "
            f"the inputs have {batch} rows of {length}"
        )
    used = (targets.weights != 0) & targets.active.unsqueeze(-1)
    if bool(((targets.positions < 0) | (targets.positions >= length))[used].any()):
        raise InvalidTargetError(f"target positions must be in [0, {length - 1}]")
    if bool(((targets.labels < 0) | (targets.labels >= classes))[used].any()):
        raise InvalidTargetError(f"target classes must be in [0, {classes - 1}] (the model has {classes} outputs)")
    rows = torch.arange(batch, device=targets.positions.device).view(1, batch, 1).expand_as(targets.positions)
    at_padding = mask.to(targets.positions.device)[rows, targets.positions] == 0
    if bool((at_padding & used).any()):
        raise InvalidTargetError("a target reads the output at a padding position; targets must be on real tokens")


def _prepared(targets: Targets, device: torch.device) -> Targets:
    """``targets`` on ``device``, the terms of inactive targets zeroed (any position or class they held is unread)."""
    used = ((targets.weights != 0) & targets.active.unsqueeze(-1)).to(device)
    return Targets(
        torch.where(used, targets.positions.to(device), 0),
        torch.where(used, targets.labels.to(device), 0),
        torch.where(used, targets.weights.to(device), 0),
        targets.readout.to(device),
        targets.visible.to(device).bool(),
        targets.active.to(device).bool(),
        targets.log_probabilities,
    )


def _score_dtype(logits: Tensor) -> torch.dtype:
    """Scores accumulate in float32 at least, whatever precision the forward ran in."""
    return torch.promote_types(logits.dtype, torch.float32)


@dataclass(frozen=True)
class _Call:
    """What the scores of one :func:`explain_targets` call are computed from (every scorer below reads it)."""

    method: Method
    options: Mapping[str, OptionValue]
    model: nn.Module
    arch: Architecture
    inputs: Mapping[str, Tensor]
    targets: Targets
    dtype: torch.dtype
    chunk_bytes: int
    deadline: Deadline | None = None

    def check_deadline(self, where: str) -> None:
        """Abandon the work if the call's deadline has passed."""
        if self.deadline is not None:
            self.deadline.check(where)

    def method_inputs(
        self,
        capture: Capture,
        rows: Tensor | None,
        mask: Tensor,
        readout: Tensor,
        terms: tuple[Tensor, Tensor, Tensor] | None = None,
    ) -> MethodInputs:
        """The inputs of the method's compute for the ``rows`` (``None``: all) whose capture, readout and target terms
        are given; the tokens a target reads (``readout > 0``) have their self-relevance suppressed by the rollouts of
        ``gae``."""
        inputs = self.inputs if rows is None else {key: value[rows] for key, value in self.inputs.items()}
        options = dict(self.options)
        return MethodInputs(capture, self.arch, self.model, inputs, mask, options, readout, readout > 0, terms)


def _map_scores(call: _Call, forward: Forward) -> Tensor:
    """Scores of a method that reads only the maps: every target's row at once, ``(K, B, n)``."""
    targets = call.targets
    call.check_deadline(f"reading the maps of {targets.rounds} targets")
    capture = forward.capture(call.arch, torch.zeros(targets.active.shape[1], dtype=torch.long)).upcast()
    readout = targets.readout.transpose(0, 1)  # (B, K, n)
    mask = (targets.visible & call.inputs["attention_mask"].bool().unsqueeze(0)).transpose(0, 1)
    with full_precision(readout.device):
        scores = call.method.compute(call.method_inputs(capture, None, mask, readout))
    return scores.transpose(0, 1)


@dataclass(frozen=True)
class _Timed:
    scores: Tensor
    seconds: float


def _virtual_rows(
    base: Capture,
    gradients: tuple[Tensor, ...],
    arch: Architecture,
    needs: frozenset[str],
    rounds: Tensor,
    rows: Tensor,
) -> Capture:
    """The capture of the virtual rows ``(rounds[i], rows[i])``: row ``rows[i]``'s tensors with round
    ``rounds[i]``'s gradients (``rounds`` index into the chunk's gradients)."""
    virtual = base.rows(rows)
    if ATTENTION_GRADIENTS in needs:
        virtual.attention_gradients = [gradient[rounds, rows] for gradient in gradients[: arch.num_layers]]
    if EMBEDDING_GRADIENTS in needs:
        virtual.embedding_gradients = gradients[-1][rounds, rows]
    return virtual


def _target_scores(call: _Call, forward: Forward, values: Tensor) -> _Timed:
    """Scores of a class-specific method read from the forward: for a gradient method one batched vector-Jacobian call
    per chunk of rounds (none for a method that seeds its own pass at the target, as ``partial_lrp`` does), each
    (round, row) then scored by the method as a virtual row."""
    method, arch, targets = call.method, call.arch, call.targets
    rounds, batch = targets.active.shape
    mask = call.inputs["attention_mask"].bool()
    scores = torch.zeros((rounds, batch, mask.shape[-1]), dtype=call.dtype, device=mask.device)
    wrt = forward.gradient_inputs
    # The virtual rows copy their row's captured tensors; the logits (a vocabulary per position for a causal LM) are
    # replaced by each target's objective value, the one output a virtual row has.
    base = replace(
        forward.capture(arch, torch.zeros(batch, dtype=torch.long, device=mask.device)),
        logits=torch.zeros((batch, 1), dtype=forward.logits.dtype, device=mask.device),
    )
    if forward.leaf is not None and forward.leaf.leaf is not None:
        base.embeddings = forward.leaf.leaf.detach()
    sums = values.sum(dim=1)  # rows do not interact: one backward of the sum gives every row its own gradient
    last_round = int(targets.active.any(dim=1).nonzero().max()) if bool(targets.active.any()) else -1
    chunk = rounds_per_call(wrt, rounds, call.chunk_bytes, bool(method.needs & {ATTENTIONS, ATTENTION_GRADIENTS}))
    backward = 0.0
    for start in range(0, last_round + 1, chunk):
        stop = min(start + chunk, last_round + 1)
        picked, rows = targets.active[start:stop].nonzero(as_tuple=True)
        if picked.numel() == 0:
            continue
        call.check_deadline(f"the targets {start + 1}-{stop} of {last_round + 1}")
        gradients: tuple[Tensor, ...] = ()
        if wrt:
            began = time.perf_counter()
            gradients = batched_gradients(sums[start:stop], wrt, retain=stop <= last_round)
            backward += time.perf_counter() - began
        virtual = _virtual_rows(base, gradients, arch, method.needs, picked, rows)
        virtual = replace(
            virtual, logits=values[start + picked, rows].detach().view(-1, 1), targets=torch.zeros_like(rows)
        ).upcast()
        readout = targets.readout[start + picked, rows]
        visible = targets.visible[start + picked, rows] & mask[rows]
        terms = (
            targets.positions[start + picked, rows],
            targets.labels[start + picked, rows],
            targets.weights[start + picked, rows],
        )
        with full_precision(mask.device):
            computed = method.compute(call.method_inputs(virtual, rows, visible.to(readout.dtype), readout, terms))
        scores[start + picked, rows] = computed.detach().to(scores.dtype)
    return _Timed(scores, backward)


def _own_forward_scores(call: _Call, fused: str | None) -> _Timed:
    """Scores of a method that runs forwards of its own (:class:`~explainers.methods.registry.Forwards`) on ``fused``
    attention: its implementation, the classifier path's, given every round of the targets as its objective; none
    when no target is active."""
    assert call.method.forwards is not None
    mask, targets = call.inputs["attention_mask"], call.targets
    rounds, batch = targets.active.shape
    if not bool(targets.active.any()):
        return _Timed(torch.zeros((rounds, batch, mask.shape[-1]), dtype=call.dtype, device=mask.device), 0.0)
    objective = Objective(rounds, targets.objective)
    scored = call.method.forwards.run(
        ForwardInputs(
            call.model,
            call.arch,
            call.inputs,
            objective,
            call.options,
            call.dtype,
            fused,
            call.chunk_bytes,
            call.deadline,
        )
    )
    return _Timed(scored.scores, scored.backward)
