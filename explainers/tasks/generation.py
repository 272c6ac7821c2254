"""Explain what a causal LM wrote: :func:`explain_generation`, an attribution for every token it generates.

A causal model's logits at position ``i`` depend only on positions ``<= i``, so **one forward over prompt +
continuation serves every step**: step ``t`` (the ``t``-th token after the prompt, at sequence position ``P + t``) is
read from the logits at position ``P + t - 1``. Each explained step is one target of the multi-target core
(:func:`explainers.tasks.targets.explain_targets`): the map methods (``attention``, ``rollout``) read every step's row
from that forward, the gradient methods take one vector-Jacobian product per step, batched.

What a step explains is the classifier path's question for that step's context alone: the LM head read as a
classifier over the vocabulary, the step's token the target class. So a step's scores equal
:func:`explainers.explain` of the context ``sequence[:P + t]`` (padding removed) through a
``*ForSequenceClassification`` model with the same weights and the LM head as its ``score`` layer, target the token;
the tests check exactly that. Its objective is the token's logit (``contrast``: the token's logit minus the foil's).
``steps="sum"`` (or :class:`StepSum`) explains one objective instead: the summed log-probability of the continuation
(or of a span of steps) in one backward.

Scores are ``(batch, T, P + T)`` over the whole sequence: exactly 0 at padding, at the positions a step cannot see
(its own and later ones), for steps after a row ended and for steps not asked for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from ..deadline import Deadline
from ..defaults import DEFAULT_METHOD
from ..errors import InvalidTargetError, UnsupportedModelError
from .continuation import (
    Continuation,
    GenerationSettings,
    generate_continuation,
    given_continuation,
    vocabulary_size,
)
from .targets import Targets, explain_targets

if TYPE_CHECKING:
    from ..methods.registry import OptionValue


@dataclass(frozen=True)
class StepSum:
    """The summed log-probability of the generated tokens of steps ``[start, stop)`` (``stop=None``: to the end),
    explained as one objective in one backward. ``steps="sum"`` is ``StepSum()``.

    Attributes:
        start: the first step summed.
        stop: one past the last step summed; ``None``: to the end of the continuation.
    """

    start: int = 0
    stop: int | None = None

    def span(self, steps: int) -> tuple[int, int]:
        """``(start, stop)`` resolved for a continuation of ``steps`` columns.

        Raises:
            InvalidTargetError: if the span is empty or outside ``[0, steps)``.
        """
        stop = steps if self.stop is None else self.stop
        if not (0 <= self.start < stop <= steps):
            raise InvalidTargetError(
                f"a summed span must satisfy 0 <= start < stop <= {steps} (the continuation has {steps} steps), got "
                f"start={self.start}, stop={self.stop}"
            )
        return self.start, stop


Steps = str | Sequence[int] | StepSum | None
"""Which steps to explain: ``None`` (every step), a list of step indices (negative ones count from the end),
``"sum"`` or a :class:`StepSum` (one summed objective)."""


@dataclass(frozen=True)
class GenerationExplanation:
    """The result of :func:`explain_generation`.

    Attributes:
        method: the registry name of the method.
        options: the method options used, defaults filled in.
        steps: the steps explained, as step indices (``(t0, t1, ...)``), or the :class:`StepSum` explained.
        contrast: ``(batch, T)`` the foil token of each step (``-1`` where none), or ``None`` without contrast.
        sequences: ``(batch, P + T)`` the left-padded prompts followed by the continuation (the pad token after a
            row ended).
        attention_mask: ``(batch, P + T)`` 1 at real tokens: each prompt's and each row's steps.
        generated: ``(batch, T)`` the continuation (``sequences[:, P:]``).
        generated_mask: ``(batch, T)`` bool, the steps each row has (up to and including its EOS).
        prompt_length: ``P``.
        probabilities: ``(batch, T)`` each generated token's probability at its step (the model's softmax,
            whatever sampling chose it); 0 after a row ended.
        scores: ``(batch, T, P + T)`` per step its attribution over the sequence (``StepSum``: ``(batch, 1, P + T)``),
            exactly 0 at padding, at positions the step cannot see, for steps after a row ended and steps not asked.
        values: ``(batch, T)`` each explained step's objective (its token's logit, or logit minus the foil's), 0
            elsewhere (``StepSum``: ``(batch, 1)``, the summed log-probability, or its contrast).
        seconds: wall time of the stages: ``generate`` (0 for a given continuation), ``forward``, ``backward``...
    """

    method: str
    options: Mapping[str, OptionValue]
    steps: tuple[int, ...] | StepSum
    contrast: Tensor | None
    sequences: Tensor
    attention_mask: Tensor
    generated: Tensor
    generated_mask: Tensor
    prompt_length: int
    probabilities: Tensor
    scores: Tensor
    values: Tensor
    seconds: Mapping[str, float]

    @property
    def summed(self) -> bool:
        """Whether one summed objective was explained (``steps="sum"``)."""
        return isinstance(self.steps, StepSum)

    def context_scores(self, row: int, step: int) -> Tensor:
        """Step ``step``'s scores over the real tokens of its context (prompt and earlier steps), padding removed:
        the scores the classifier path gives for that context alone (a summed explanation: ``step`` 0, context up to
        its span's last step).

        Args:
            row: the batch row.
            step: the step (an index into :attr:`scores`' second dimension).
        """
        mask = self.attention_mask[row].bool().clone()
        last = self.prompt_length + (self._last_step(row) if self.summed else step)
        mask[last:] = False
        return self.scores[row, step][mask]

    def _last_step(self, row: int) -> int:
        assert isinstance(self.steps, StepSum)
        start, stop = self.steps.span(self.generated.shape[1])
        steps = int(self.generated_mask[row, :stop].sum())
        return max(min(steps, stop) - 1, start)


def resolve_steps(steps: Steps, total: int) -> tuple[int, ...] | StepSum:
    """``steps`` checked against a continuation of ``total`` columns: step indices (sorted, distinct, negative ones
    counted from the end) or the :class:`StepSum`.

    Args:
        steps: which steps to explain (:data:`Steps`).
        total: the continuation's columns.

    Raises:
        InvalidTargetError: for an index outside ``[-total, total)``, an empty list, or anything else.
    """
    if steps is None:
        return tuple(range(total))
    if isinstance(steps, str):
        if steps != "sum":
            raise InvalidTargetError(f"steps must be None, a list of step indices or 'sum', got {steps!r}")
        steps = StepSum()
    if isinstance(steps, StepSum):
        steps.span(total)
        return steps
    if isinstance(steps, Tensor):
        steps = steps.tolist()
    if not isinstance(steps, Sequence) or not steps:
        raise InvalidTargetError(f"steps must be None, a non-empty list of step indices or 'sum', got {steps!r}")
    resolved: set[int] = set()
    for step in steps:
        if isinstance(step, bool) or not isinstance(step, int):
            raise InvalidTargetError(f"steps must be integers, got {step!r}")
        if not -total <= step < total:
            raise InvalidTargetError(
                f"step {step} is out of range: the continuation has {total} steps (valid: 0 to {total - 1}, or "
                f"-{total} to -1 from the end)"
            )
        resolved.add(step % total)
    return tuple(sorted(resolved))


def resolve_contrast(contrast: Any, batch: int, total: int, vocabulary: int, allow_none: bool = False) -> Tensor | None:
    """``contrast`` as a ``(batch, T)`` LongTensor of foil tokens (``None`` without contrast).

    Accepts one token id for every step, one per step (a list or tensor of ``T`` ids), or ``(batch, T)``.

    Raises:
        InvalidTargetError: for a foil outside the vocabulary or a shape that fits none of these.
    """
    if contrast is None:
        return None
    if isinstance(contrast, bool):
        raise InvalidTargetError("contrast must be a token id, one per step, or (batch, T) token ids; got a bool")
    if isinstance(contrast, int):
        foils = torch.full((batch, total), contrast, dtype=torch.long)
    else:
        try:
            tensor = contrast if isinstance(contrast, Tensor) else torch.tensor(contrast)
        except (TypeError, ValueError):
            raise InvalidTargetError(f"contrast must be token ids, got {contrast!r}") from None
        if tensor.is_floating_point() or tensor.dtype == torch.bool:
            raise InvalidTargetError(f"contrast must be integer token ids, got {tensor.dtype}")
        if tensor.dim() == 0:
            foils = torch.full((batch, total), int(tensor), dtype=torch.long)
        elif tensor.shape == (total,):
            foils = tensor.long().view(1, -1).expand(batch, total).clone()
        elif tensor.shape == (batch, total):
            foils = tensor.long().clone()
        else:
            raise InvalidTargetError(
                f"contrast of shape {tuple(tensor.shape)}: give one token id, one per step ({total},) or "
                f"({batch}, {total})"
            )
    if bool(((foils < (-1 if allow_none else 0)) | (foils >= vocabulary)).any()):
        raise InvalidTargetError(f"a contrast (foil) token must be in the vocabulary [0, {vocabulary - 1}]")
    return foils


def explain_generation(
    model: nn.Module,
    inputs: Mapping[str, Any],
    *,
    method: str = DEFAULT_METHOD,
    max_new_tokens: int | Sequence[int] | None = None,
    continuation: Any = None,
    steps: Steps = None,
    contrast: Any = None,
    generation: Mapping[str, Any] | GenerationSettings | None = None,
    deadline: Deadline | float | None = None,
    **options: Any,
) -> GenerationExplanation:
    """Generate after each prompt (or take a given continuation) and explain every generated token.

    Args:
        model: a Hugging Face causal LM of a supported decoder family (``LlamaForCausalLM``, ``Qwen2ForCausalLM``,
            ``Qwen3ForCausalLM``, ``MistralForCausalLM``, ``Gemma2ForCausalLM``, ``GPT2LMHeadModel``); left exactly as
            it was found.
        inputs: a tokenizer batch of prompts (``input_ids``, ``attention_mask``; left padding as decoder tokenizers
            pad, or right padding).
        method: one of :func:`explainers.available_methods` that the family supports; default
            :data:`~explainers.DEFAULT_METHOD` (``attnlrp``).
        max_new_tokens: the most tokens each row generates (one for all rows, or one per row; default
            :data:`~explainers.tasks.continuation.DEFAULT_MAX_NEW_TOKENS`); ignored with ``continuation``.
        continuation: ``(batch, T)`` token ids produced elsewhere (or a mapping with ``input_ids`` and a right-padded
            ``attention_mask``): explained without generating (see
            :func:`~explainers.tasks.continuation.given_continuation` for where rows end).
        steps: ``None`` (every step), a list of step indices, or ``"sum"`` / :class:`StepSum` (one summed objective).
        contrast: a foil token for every step, one per step, or ``(batch, T)``: each step explains its token's logit
            minus the foil's (with ``"sum"``: the summed log-probability difference).
        generation: sampling settings (keys of :data:`~explainers.tasks.continuation.GENERATION_KEYS`: ``do_sample``,
            ``temperature``, ``top_k``, ``top_p``, ``seed``, ``eos_token_id``); greedy by default.
        deadline: abandon the work once this :class:`~explainers.deadline.Deadline` (or this many seconds from now)
            has passed: checked before each generation step and between chunks of the explanation.
        **options: the method's options, as :func:`explainers.explain` takes them.

    Returns:
        A :class:`GenerationExplanation`.

    Raises:
        ExplainError: (a ``ValueError``) for an unknown or refused method, bad options, prompts, continuation,
            steps (:class:`InvalidTargetError`) or foils; :class:`~explainers.deadline.DeadlineExceededError` once
            ``deadline`` has passed.
    """
    import time

    check_generation_call(model, method, options)
    due = Deadline.of(deadline)
    started = time.perf_counter()
    if continuation is not None:
        made = given_continuation(model, inputs, continuation)
        generate_seconds = 0.0
    else:
        made = generate_continuation(model, inputs, max_new_tokens, generation, deadline=due)
        generate_seconds = time.perf_counter() - started
    return explain_continuation(model, made, method=method, steps=steps, contrast=contrast, options=options,
                                generate_seconds=generate_seconds, deadline=due)  # fmt: skip


def check_generation_call(model: nn.Module, method: str, options: Mapping[str, Any]) -> None:
    """Refuse, before any token is generated, a model that is not a supported causal LM, an unknown method, a method
    the family refuses and bad method options.

    Args:
        model: the model to explain.
        method: the method's name.
        options: its options, as asked.

    Raises:
        UnsupportedModelError, UnknownMethodError, UnsupportedMethodError, InvalidOptionError.
    """
    from ..architectures.description import describe
    from ..architectures.support import TASKS, check_method
    from ..methods.registry import available_methods, get_method

    arch = describe(model)
    if arch.task != "causal_lm":
        raise UnsupportedModelError(
            f"explain_generation explains causal language models (*ForCausalLM, GPT2LMHeadModel); "
            f"{type(model).__name__} is a {TASKS[arch.task].title}: explain it with {TASKS[arch.task].entry_point}"
        )
    chosen = get_method(method)
    check_method(arch.model_type, chosen.name, available_methods(), arch.task)
    chosen.resolve_options(options, arch)


def explain_continuation(
    model: nn.Module,
    made: Continuation,
    *,
    method: str,
    steps: Steps = None,
    contrast: Any = None,
    options: Mapping[str, Any] | None = None,
    generate_seconds: float = 0.0,
    wanted: Tensor | None = None,
    deadline: Deadline | None = None,
) -> GenerationExplanation:
    """Explain a :class:`~explainers.tasks.continuation.Continuation` (the second half of :func:`explain_generation`).

    Args:
        model: the causal LM.
        made: the prompts and their continuation.
        method: the method (see :func:`explain_generation`).
        steps: the steps to explain (see :func:`explain_generation`).
        contrast: the foils (see :func:`explain_generation`).
        options: the method's options.
        generate_seconds: the generation's wall time, reported in ``seconds["generate"]``.
        wanted: optional ``(batch, T)`` bool, the steps each row asks for among ``steps`` (a served batch whose rows
            ask for different steps shares one forward); the others are not explained (scores 0). ``contrast`` may
            then hold ``-1`` for the steps without a foil.
        deadline: when the answer is due (``None``: none; :func:`~explainers.tasks.targets.explain_targets`).
    """
    total = made.steps
    resolved = resolve_steps(steps, total)
    foils = resolve_contrast(contrast, made.tokens.shape[0], total, vocabulary_size(model), wanted is not None)
    if foils is not None:
        foils = foils.to(made.tokens.device)
    explained = explain_targets(
        model,
        {"input_ids": made.sequences, "attention_mask": made.forward_mask},
        step_targets(made, resolved, foils, wanted),
        method=method,
        deadline=deadline,
        **dict(options or {}),
    )
    probabilities = step_probabilities(explained.logits, made)
    batch, width = made.sequences.shape
    if isinstance(resolved, StepSum):
        scores = explained.scores.permute(1, 0, 2)
        values = explained.values.permute(1, 0)
    else:
        scores = explained.scores.new_zeros((batch, total, width))
        values = explained.values.new_zeros((batch, total))
        index = torch.tensor(resolved, device=scores.device)
        scores[:, index] = explained.scores.permute(1, 0, 2)
        values[:, index] = explained.values.permute(1, 0)
    return GenerationExplanation(
        method=explained.method,
        options=dict(explained.options),
        steps=resolved,
        contrast=None if foils is None else torch.where(made.token_mask, foils, torch.full_like(foils, -1)),
        sequences=made.sequences,
        attention_mask=made.sequence_mask,
        generated=made.tokens,
        generated_mask=made.token_mask,
        prompt_length=made.prompt_width,
        probabilities=probabilities,
        scores=scores,
        values=values,
        seconds={"generate": generate_seconds, **dict(explained.seconds)},
    )


def step_probabilities(logits: Tensor, made: Continuation) -> Tensor:
    """``(batch, T)`` each step's token probability from the forward's ``(batch, P + T, vocab)`` logits (0 after a
    row ended).

    Args:
        logits: the forward's logits over prompt and continuation.
        made: the continuation the forward read.
    """
    width = made.prompt_width
    reading = logits[:, width - 1 : width - 1 + made.steps].float() if logits.dtype != torch.float64 else None
    reading = logits[:, width - 1 : width - 1 + made.steps] if reading is None else reading
    chosen = reading.log_softmax(dim=-1).gather(-1, made.tokens.unsqueeze(-1)).squeeze(-1).exp()
    return chosen * made.token_mask.to(chosen.dtype)


def step_targets(
    made: Continuation, steps: tuple[int, ...] | StepSum, foils: Tensor | None, wanted: Tensor | None = None
) -> Targets:
    """The core's :class:`~explainers.tasks.targets.Targets` of the explained steps of ``made``.

    Per step ``t`` (a round): the objective of row ``b`` is the logit of ``tokens[b, t]`` at position ``P + t - 1``
    (minus the foil's logit with contrast), read out at that position, seeing positions ``<= P + t - 1``; a row
    whose step ``t`` does not exist (it ended earlier) is inactive. A :class:`StepSum` is one round: the sum over
    the span's steps of the token's log-probability (minus the foil's).
    """
    batch, total = made.tokens.shape
    width = made.prompt_width
    length = width + total
    device = made.tokens.device
    mask = made.forward_mask.bool()
    columns = torch.arange(length, device=device)
    if isinstance(steps, StepSum):
        start, stop = steps.span(total)
        chosen = list(range(start, stop))
    else:
        chosen = list(steps)
    step_index = torch.tensor(chosen, device=device, dtype=torch.long)
    positions = (width - 1 + step_index).view(-1, 1).expand(len(chosen), batch)  # (K, B)
    labels = made.tokens[:, step_index].T  # (K, B)
    asked = made.token_mask if wanted is None else made.token_mask & wanted.to(device)
    live = asked[:, step_index].T  # (K, B)
    entries_positions = [positions]
    entries_labels = [labels]
    entries_weights = [live.double()]
    if foils is not None:
        foil = foils[:, step_index].T
        entries_positions.append(positions)
        entries_labels.append(foil.clamp(min=0))
        entries_weights.append(-(live & (foil >= 0)).double())
    stacked_positions = torch.stack(entries_positions, dim=-1)  # (K, B, J)
    stacked_labels = torch.stack(entries_labels, dim=-1)
    stacked_weights = torch.stack(entries_weights, dim=-1)
    if isinstance(steps, StepSum):
        # one round: every step of the span as entries of the same objective
        K = len(chosen)
        stacked_positions = stacked_positions.permute(1, 0, 2).reshape(1, batch, -1)
        stacked_labels = stacked_labels.permute(1, 0, 2).reshape(1, batch, -1)
        stacked_weights = stacked_weights.permute(1, 0, 2).reshape(1, batch, -1)
        active = live.any(dim=0).view(1, batch)
        counts = live.sum(dim=0).clamp(min=1).double()  # (B,)
        readout = torch.zeros(1, batch, length, dtype=torch.float64, device=device)
        for k in range(K):
            readout[0, torch.arange(batch, device=device), positions[k]] += live[k].double() / counts
        last = torch.where(live, positions, torch.full_like(positions, -1)).max(dim=0).values  # (B,)
        visible = (columns.view(1, -1) <= last.view(-1, 1)) & mask
        return Targets(
            positions=stacked_positions,
            labels=stacked_labels,
            weights=stacked_weights,
            readout=readout,
            visible=visible.unsqueeze(0) & active.view(1, batch, 1),
            active=active,
            log_probabilities=True,
        )
    readout = torch.nn.functional.one_hot(positions, length).double() * live.unsqueeze(-1).double()
    visible = (columns.view(1, 1, -1) <= positions.unsqueeze(-1)) & mask.unsqueeze(0) & live.unsqueeze(-1)
    return Targets(
        positions=stacked_positions,
        labels=stacked_labels,
        weights=stacked_weights,
        readout=readout,
        visible=visible,
        active=live,
        log_probabilities=False,
    )
