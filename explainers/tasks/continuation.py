"""What a causal LM wrote after each prompt of a batch: generated here (greedy or sampled, stopping per row at EOS
like ``generate``) or given (a continuation produced elsewhere, for instance by a vLLM server), as one
:class:`Continuation`.

The batch layout every caller sees: the prompts **left-padded** to a common width ``P`` (a right-padded batch is
re-padded on the left, so that the generated tokens follow each prompt directly), then ``T`` continuation columns.
A row ends at its first EOS token (included: it is a token the model chose); the columns after it hold the pad
token and are not steps of that row (:attr:`Continuation.token_mask`). Positions count real tokens only
(``position_ids = cumsum(mask) - 1``), so a row means the same batched or alone.

The loop runs the model as it is loaded (its own attention implementation, a key/value cache, ``logits_to_keep=1``) in
eval mode, and restores every module's ``training`` flag afterwards. A row that has ended (its EOS, its budget, a
``stop``) leaves the loop: its rows of the cache are dropped and the model computes the other rows only. Sampling uses
one ``torch.Generator`` per row, seeded from the row's seed, so a row's sample does not depend on the rows it is batched
with, and no process-wide random state is touched.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..architectures.attention import attention_implementation
from ..architectures.description import model_config
from ..deadline import Deadline
from ..errors import InvalidInputError, InvalidOptionError

#: New tokens generated when the caller names no ``max_new_tokens``.
DEFAULT_MAX_NEW_TOKENS = 20
#: The keys of a ``generation`` settings mapping.
GENERATION_KEYS = ("do_sample", "temperature", "top_k", "top_p", "seed", "eos_token_id")


@dataclass(frozen=True)
class GenerationSettings:
    """How to choose each next token.

    Attributes:
        do_sample: ``False``: the most probable token (greedy); ``True``: sampled from the filtered distribution.
        temperature: sampling only: logits are divided by it (> 0).
        top_k: sampling only: keep the ``top_k`` most probable tokens (``0``: all).
        top_p: sampling only: keep the smallest set of most probable tokens whose probability reaches ``top_p``
            (nucleus sampling; ``1.0``: all).
        seed: sampling only: the seed of each row's generator (one for every row, or one per row); ``None``: a fresh
            random seed per call.
        eos_token_id: the tokens that end a row (``()``: none; a row then runs to ``max_new_tokens``).
    """

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | tuple[int, ...] | None = None
    eos_token_id: tuple[int, ...] = ()

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any] | None, model: nn.Module) -> GenerationSettings:
        """Settings from a ``generation`` mapping (keys of :data:`GENERATION_KEYS`); the EOS tokens default to the
        model's generation config, else its config.

        Args:
            values: the ``generation`` mapping (``None``: the defaults).
            model: the causal LM (its EOS tokens and vocabulary).

        Raises:
            InvalidOptionError: for an unknown key or a value of the wrong type or range.
        """
        values = dict(values or {})
        unknown = sorted(set(values) - set(GENERATION_KEYS))
        if unknown:
            raise InvalidOptionError(
                f"unknown generation setting(s) {', '.join(unknown)}; valid: {', '.join(GENERATION_KEYS)}"
            )
        do_sample = values.get("do_sample", False)
        if not isinstance(do_sample, bool):
            raise InvalidOptionError(f"generation 'do_sample' must be true or false, got {do_sample!r}")
        temperature = _number(values.get("temperature", 1.0), "temperature")
        if not temperature > 0:
            raise InvalidOptionError(f"generation 'temperature' must be > 0, got {temperature}")
        top_k = values.get("top_k", 0)
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
            raise InvalidOptionError(f"generation 'top_k' must be an integer >= 0 (0 = off), got {top_k!r}")
        top_p = _number(values.get("top_p", 1.0), "top_p")
        if not 0 < top_p <= 1:
            raise InvalidOptionError(f"generation 'top_p' must be in (0, 1], got {top_p}")
        raw_seed = values.get("seed")
        seed: int | tuple[int, ...] | None = None
        if raw_seed is not None:
            listed = isinstance(raw_seed, Sequence) and not isinstance(raw_seed, str)
            seeds = list(raw_seed) if listed else [raw_seed]
            if not seeds or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in seeds):
                raise InvalidOptionError(
                    f"generation 'seed' must be an integer >= 0 (or one per row), got {raw_seed!r}"
                )
            seed = tuple(seeds) if listed else seeds[0]
        eos = values["eos_token_id"] if "eos_token_id" in values else model_eos_tokens(model)
        eos_tokens = _token_ids(eos, "eos_token_id", vocabulary_size(model))
        return cls(do_sample, temperature, top_k, top_p, seed, eos_tokens)


def _number(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidOptionError(f"generation {name!r} must be a number, got {value!r}")
    return float(value)


def _token_ids(value: Any, name: str, vocabulary: int) -> tuple[int, ...]:
    if value is None:
        return ()
    items = [value] if isinstance(value, int) else list(value) if isinstance(value, Sequence) else None
    if items is None or any(isinstance(item, bool) or not isinstance(item, int) for item in items):
        raise InvalidOptionError(f"generation {name!r} must be a token id or a list of them, got {value!r}")
    if any(not 0 <= item < vocabulary for item in items):
        raise InvalidOptionError(f"generation {name!r}: token ids must be in [0, {vocabulary - 1}], got {value!r}")
    return tuple(dict.fromkeys(items))


def vocabulary_size(model: nn.Module) -> int:
    """The number of logits the LM head writes."""
    output_embeddings = getattr(model, "get_output_embeddings", None)
    head = output_embeddings() if callable(output_embeddings) else None
    weight = getattr(head, "weight", None)
    if isinstance(weight, Tensor):
        return int(weight.shape[0])
    config = model_config(model)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return int(text.vocab_size)


def model_eos_tokens(model: nn.Module) -> tuple[int, ...]:
    """The model's EOS token ids: its generation config's, else its config's (``()`` when it has none)."""
    for source in (getattr(model, "generation_config", None), model_config(model)):
        value = getattr(source, "eos_token_id", None)
        if value is not None:
            return tuple([value] if isinstance(value, int) else [int(item) for item in value])
    return ()


def pad_token(model: nn.Module) -> int:
    """The id written into the columns after a row ended: the config's pad token, else the first EOS, else 0."""
    config = model_config(model)
    pad = getattr(config, "pad_token_id", None)
    if pad is None:
        pad = getattr(getattr(model, "generation_config", None), "pad_token_id", None)
    if isinstance(pad, int):
        return pad
    eos = model_eos_tokens(model)
    return eos[0] if eos else 0


def position_limit(model: nn.Module) -> int | None:
    """The most positions the model takes (``max_position_embeddings`` or ``n_positions``; ``None``: unbounded)."""
    config = model_config(model)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    for name in ("max_position_embeddings", "n_positions"):
        value = getattr(text, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


@dataclass(frozen=True)
class StepLogprobs:
    """Each step's log-probabilities under the model (its raw distribution: before temperature, top-k or top-p), as
    an OpenAI-style ``logprobs`` answer needs them.

    Attributes:
        chosen: ``(batch, T)`` the log-probability of the token each step wrote (0 after a row ended).
        top_ids: ``(batch, T, k)`` the ``k`` most probable tokens at each step, most probable first.
        top_values: ``(batch, T, k)`` their log-probabilities.
    """

    chosen: Tensor
    top_ids: Tensor
    top_values: Tensor

    def rows(self, picked: Tensor, steps: int) -> StepLogprobs:
        """The rows ``picked``, their first ``steps`` columns.

        Args:
            picked: the rows' indices (or a mask).
            steps: how many columns to keep.
        """
        return StepLogprobs(
            self.chosen[picked][:, :steps], self.top_ids[picked][:, :steps], self.top_values[picked][:, :steps]
        )


def step_logprobs(logits: Tensor, tokens: Tensor, token_mask: Tensor, top: int) -> StepLogprobs:
    """The :class:`StepLogprobs` of ``tokens`` read from the logits that chose them.

    Args:
        logits: ``(batch, T, vocab)`` the logits at the position before each step.
        tokens: ``(batch, T)`` the token of each step.
        token_mask: ``(batch, T)`` bool, the steps each row has (the others get 0).
        top: how many of the most probable tokens to keep per step (``0``: none).
    """
    scores = logits if logits.dtype == torch.float64 else logits.float()
    log_probabilities = scores.log_softmax(dim=-1)
    chosen = log_probabilities.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) * token_mask.to(scores.dtype)
    values, ids = log_probabilities.topk(min(top, log_probabilities.shape[-1]), dim=-1)
    return StepLogprobs(chosen, ids, values)


@dataclass(frozen=True)
class Continuation:
    """Left-padded prompts and the tokens that followed them.

    Attributes:
        prompt_ids: ``(batch, P)`` the prompts, left-padded with the pad token.
        prompt_mask: ``(batch, P)`` 1 at the prompts' real tokens.
        tokens: ``(batch, T)`` the continuation; after a row ended, the pad token.
        token_mask: ``(batch, T)`` bool, the steps each row has (up to and including its EOS).
        probabilities: ``(batch, T)`` each token's probability under the model at its step (0 after a row ended),
            when the tokens were generated here; ``None`` for a given continuation.
        logprobs: each step's log-probabilities (the chosen token's and the most probable tokens'), when they were
            asked for (``generate_continuation(..., top_logprobs=k)``); ``None`` otherwise.
    """

    prompt_ids: Tensor
    prompt_mask: Tensor
    tokens: Tensor
    token_mask: Tensor
    probabilities: Tensor | None = None
    logprobs: StepLogprobs | None = None

    def rows(self, index: Sequence[int]) -> Continuation:
        """The continuation of the rows ``index`` only, trimmed to their own widths."""
        picked = torch.tensor(list(index), device=self.tokens.device, dtype=torch.long)
        prompt_mask = self.prompt_mask[picked]
        token_mask = self.token_mask[picked]
        start = int((prompt_mask.sum(dim=0) == 0).sum())  # prompt columns that are padding in every row
        steps = max(int(token_mask.sum(dim=1).max()), 1)
        probabilities = None if self.probabilities is None else self.probabilities[picked][:, :steps]
        return Continuation(
            self.prompt_ids[picked][:, start:],
            prompt_mask[:, start:],
            self.tokens[picked][:, :steps],
            token_mask[:, :steps],
            probabilities,
            None if self.logprobs is None else self.logprobs.rows(picked, steps),
        )

    @property
    def prompt_width(self) -> int:
        """``P``, the prompts' padded width."""
        return int(self.prompt_ids.shape[1])

    @property
    def steps(self) -> int:
        """``T``, the continuation columns."""
        return int(self.tokens.shape[1])

    @property
    def sequences(self) -> Tensor:
        """``(batch, P + T)`` prompts followed by their continuations."""
        return torch.cat([self.prompt_ids, self.tokens], dim=1)

    @property
    def sequence_mask(self) -> Tensor:
        """``(batch, P + T)`` 1 at the real tokens: the prompt's, and each row's steps."""
        return torch.cat([self.prompt_mask, self.token_mask.to(self.prompt_mask.dtype)], dim=1)

    @property
    def forward_mask(self) -> Tensor:
        """``(batch, P + T)`` the attention mask of the one forward over every step: the prompt's, then 1 in every
        continuation column (a column after a row ended is only ever seen by later columns of that row, which are
        not steps; so the batch is left-padded only)."""
        return torch.cat([self.prompt_mask, torch.ones_like(self.tokens, dtype=self.prompt_mask.dtype)], dim=1)

    def model_inputs(self) -> dict[str, Tensor]:
        """``input_ids``, ``attention_mask`` (:attr:`forward_mask`) and ``position_ids`` of the one forward."""
        mask = self.forward_mask
        return {
            "input_ids": self.sequences,
            "attention_mask": mask,
            "position_ids": (mask.cumsum(dim=-1) - 1).clamp(min=0),
        }


@dataclass(frozen=True)
class GeneratedStep:
    """One step of the decoding loop, as :func:`generate_continuation`'s ``on_step`` sees it (a stream's tokens).

    Attributes:
        index: the step (0: the first new token).
        tokens: ``(batch,)`` the token each row wrote at this step (the pad token for a row that had ended).
        written: ``(batch,)`` bool, the rows that wrote a token at this step.
        ended: ``(batch,)`` bool, the rows that end at this step (their EOS, their budget, or ``stop``).
        probabilities: ``(batch,)`` each written token's probability under the model (0 for the other rows).
        logprobs: the step's :class:`StepLogprobs` (one column) when they are recorded (``top_logprobs``), else
            ``None``.
    """

    index: int
    tokens: Tensor
    written: Tensor
    ended: Tensor
    probabilities: Tensor
    logprobs: StepLogprobs | None = None


def _device(model: nn.Module) -> torch.device:
    for parameter in model.parameters():
        return parameter.device
    return torch.device("cpu")


def left_padded_prompts(model: nn.Module, inputs: Mapping[str, Any]) -> tuple[Tensor, Tensor]:
    """The prompts of a tokenizer batch as ``(input_ids, attention_mask)``, left-padded, on the model's device.

    Accepts left or right padding (the same side for every row) and at least one real token per row.

    Raises:
        InvalidInputError: for a missing/unexpected key, a malformed tensor, token ids outside the vocabulary or a
            mask that is neither left- nor right-padding.
    """
    if not isinstance(inputs, Mapping):
        raise InvalidInputError(f"inputs must be a mapping such as a tokenizer's output, got {type(inputs).__name__}")
    unexpected = sorted(set(inputs) - {"input_ids", "attention_mask"})
    if "input_ids" not in inputs or unexpected:
        raise InvalidInputError(
            "inputs of a causal LM take input_ids and an optional attention_mask"
            + (f" (unexpected: {', '.join(unexpected)})" if unexpected else " (missing input_ids)")
        )
    ids = inputs["input_ids"]
    if not isinstance(ids, Tensor) or ids.dim() != 2 or ids.shape[0] == 0 or ids.shape[1] == 0:
        raise InvalidInputError("input_ids must be a non-empty integer tensor (batch, prompt_length)")
    if ids.is_floating_point() or ids.dtype == torch.bool:
        raise InvalidInputError(f"input_ids must be integer token ids, got {ids.dtype}")
    vocabulary = vocabulary_size(model)
    if bool(((ids < 0) | (ids >= vocabulary)).any()):
        raise InvalidInputError(f"input_ids must be token ids in [0, {vocabulary - 1}] (the model's vocabulary)")
    mask = inputs.get("attention_mask")
    if mask is None:
        mask = torch.ones_like(ids)
    if not isinstance(mask, Tensor) or mask.shape != ids.shape:
        raise InvalidInputError(f"attention_mask must be a tensor of the shape of input_ids {tuple(ids.shape)}")
    if not bool(((mask == 0) | (mask == 1)).all()):
        raise InvalidInputError("attention_mask must hold only 0 and 1")
    mask = mask.long()
    left = bool((mask[:, -1] == 1).all()) and bool((mask[:, 1:] >= mask[:, :-1]).all())
    right = bool((mask[:, 0] == 1).all()) and bool((mask[:, 1:] <= mask[:, :-1]).all())
    if not (left or right):
        raise InvalidInputError(
            "attention_mask of a prompt batch must be left-padded (0s then 1s) or right-padded (1s then 0s), the same "
            "side for every row, with at least one real token per row"
        )
    ids, mask = ids.long(), mask
    if not left:  # right padding: move each row's real tokens to the right end
        lengths = mask.sum(dim=1)
        width = ids.shape[1]
        shift = (width - lengths).view(-1, 1)
        columns = (torch.arange(width, device=ids.device).view(1, -1) - shift) % width
        ids = ids.gather(1, columns)
        mask = mask.gather(1, columns)
        ids = torch.where(mask.bool(), ids, torch.full_like(ids, pad_token(model)))
    device = _device(model)
    return ids.to(device), mask.to(device)


def _check_length(model: nn.Module, prompt_mask: Tensor, new_tokens: int) -> None:
    limit = position_limit(model)
    longest = int(prompt_mask.sum(dim=1).max())
    if limit is not None and longest + new_tokens > limit:
        raise InvalidInputError(
            f"the longest prompt has {longest} tokens and {new_tokens} new tokens would make {longest + new_tokens}, "
            f"beyond the model's {limit} positions: shorten the prompt or ask for fewer new tokens"
        )


def given_continuation(model: nn.Module, inputs: Mapping[str, Any], continuation: Any) -> Continuation:
    """The :class:`Continuation` of prompts and a continuation produced elsewhere.

    Args:
        model: the causal LM.
        inputs: the prompts (a tokenizer batch, left or right padding).
        continuation: ``(batch, T)`` token ids (a row ends at its first EOS token of the model, included; what
            follows is ignored), or a mapping with ``input_ids (batch, T)`` and a right-padded ``attention_mask``
            (1 at the row's tokens, then 0: a row ends where its mask does, EOS or not).

    Raises:
        InvalidInputError: for a malformed continuation: wrong batch size, no column, token ids outside the
            vocabulary, a mask that is not right-padding, or prompt + continuation beyond the model's positions.
    """
    prompt_ids, prompt_mask = left_padded_prompts(model, inputs)
    mask: Tensor | None = None
    if isinstance(continuation, Mapping):
        unexpected = sorted(set(continuation) - {"input_ids", "attention_mask"})
        if "input_ids" not in continuation or unexpected:
            raise InvalidInputError("a continuation mapping takes input_ids and an optional attention_mask")
        tokens, mask = continuation["input_ids"], continuation.get("attention_mask")
    else:
        tokens = continuation
    if isinstance(tokens, Sequence) and not isinstance(tokens, str):
        try:
            tokens = torch.tensor(tokens, dtype=torch.long)
        except (TypeError, ValueError):
            raise InvalidInputError("continuation must be a (batch, T) tensor of token ids") from None
    if not isinstance(tokens, Tensor) or tokens.dim() != 2 or tokens.is_floating_point() or tokens.dtype == torch.bool:
        raise InvalidInputError("continuation must be a (batch, T) integer tensor of token ids")
    batch = prompt_ids.shape[0]
    if tokens.shape[0] != batch or tokens.shape[1] == 0:
        raise InvalidInputError(
            f"continuation has shape {tuple(tokens.shape)}: expected ({batch}, T) with T >= 1 (one row per prompt)"
        )
    vocabulary = vocabulary_size(model)
    if bool(((tokens < 0) | (tokens >= vocabulary)).any()):
        raise InvalidInputError(f"continuation token ids must be in [0, {vocabulary - 1}] (the model's vocabulary)")
    tokens = tokens.long().to(prompt_ids.device)
    if mask is not None:
        if not isinstance(mask, Tensor) or mask.shape != tokens.shape or not bool(((mask == 0) | (mask == 1)).all()):
            raise InvalidInputError("the continuation's attention_mask must be 0/1 of the shape of its input_ids")
        mask = mask.to(prompt_ids.device).bool()
        if not bool((mask[:, 1:] <= mask[:, :-1]).all()) or not bool(mask[:, 0].all()):
            raise InvalidInputError(
                "the continuation's attention_mask must be right-padded (1s then 0s) with at least one token per row"
            )
        token_mask = mask
    else:
        token_mask = _until_eos(tokens, model_eos_tokens(model))
    _check_length(model, prompt_mask, int(token_mask.sum(dim=1).max()))
    tokens = torch.where(token_mask, tokens, torch.full_like(tokens, pad_token(model)))
    return Continuation(prompt_ids, prompt_mask, tokens, token_mask)


def _until_eos(tokens: Tensor, eos: Sequence[int]) -> Tensor:
    """``(batch, T)`` bool: each row's columns up to and including its first EOS."""
    if not eos:
        return torch.ones_like(tokens, dtype=torch.bool)
    is_eos = torch.isin(tokens, torch.tensor(list(eos), device=tokens.device))
    ended_before = (is_eos.long().cumsum(dim=1) - is_eos.long()) > 0
    return ~ended_before


@contextmanager
def evaluating(model: nn.Module) -> Iterator[None]:
    """``model`` in eval mode for the block; every module's ``training`` flag restored on exit.

    A model on eager attention runs the capture's implementation for the block (outside a capture it is the
    architecture's own eager attention, with float64 masks kept finite: see
    :func:`explainers.architectures.attention._float32_safe`; without it a left-padded float64 batch turns NaN), so that
    generation and the explanation's forward compute the same numbers. Any other implementation (``sdpa``, flash)
    is left as it is.
    """
    flags = [(module, module.training) for module in model.modules()]
    config = model_config(model)
    eager = getattr(config, "_attn_implementation", None) == "eager"
    try:
        model.eval()
        with attention_implementation(model) if eager else nullcontext():
            yield
    finally:
        for module, flag in flags:
            module.training = flag


def _generators(settings: GenerationSettings, batch: int, device: torch.device) -> list[torch.Generator]:
    seeds = settings.seed
    if isinstance(seeds, tuple):
        if len(seeds) != batch:
            raise InvalidOptionError(f"generation 'seed' has {len(seeds)} values for a batch of {batch} prompts")
        per_row: list[int | None] = list(seeds)
    else:
        per_row = [seeds] * batch
    generators = []
    for seed in per_row:
        generator = torch.Generator(device=device)
        if seed is None:
            generator.seed()
        else:
            generator.manual_seed(seed)
        generators.append(generator)
    return generators


def filtered_logits(logits: Tensor, settings: GenerationSettings) -> Tensor:
    """``(batch, vocab)`` logits with temperature, top-k and top-p applied (filtered tokens at ``-inf``)."""
    scores = logits / settings.temperature
    if settings.top_k:
        kept = min(settings.top_k, scores.shape[-1])
        threshold = scores.topk(kept, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < threshold, float("-inf"))
    if settings.top_p < 1.0:
        ordered, order = scores.sort(dim=-1, descending=True)
        cumulative = ordered.softmax(dim=-1).cumsum(dim=-1)
        # drop a token when the tokens before it already reach top_p (the most probable is always kept)
        drop = (cumulative - ordered.softmax(dim=-1)) >= settings.top_p
        scores = scores.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return scores


def _choose(logits: Tensor, settings: Sequence[GenerationSettings], generators: Sequence[torch.Generator]) -> Tensor:
    """The next token of each row: its argmax, or a sample from its filtered distribution with its generator."""
    greedy = logits.argmax(dim=-1)
    if not any(row.do_sample for row in settings):
        return greedy
    chosen = []
    for row, row_settings in enumerate(settings):
        if not row_settings.do_sample:
            chosen.append(greedy[row : row + 1])
            continue
        probabilities = filtered_logits(logits[row : row + 1].float(), row_settings).softmax(dim=-1)
        chosen.append(torch.multinomial(probabilities[0], 1, generator=generators[row]))
    return torch.cat(chosen)


def generate_continuation(
    model: nn.Module,
    inputs: Mapping[str, Any],
    max_new_tokens: int | Sequence[int] | None = None,
    generation: Mapping[str, Any] | GenerationSettings | Sequence[Mapping[str, Any] | GenerationSettings] | None = None,
    top_logprobs: int | None = None,
    stop: Callable[[Tensor], Tensor] | None = None,
    deadline: Deadline | None = None,
    on_step: Callable[[GeneratedStep], None] | None = None,
) -> Continuation:
    """Generate after each prompt of a batch, all rows together, each stopping at its EOS, its token budget or when
    ``stop`` says so.

    Args:
        model: a Hugging Face causal LM (``*ForCausalLM``, ``GPT2LMHeadModel``).
        inputs: the prompts (a tokenizer batch; left or right padding).
        max_new_tokens: the most tokens each row writes (one for all rows, or one per row;
            ``None``: :data:`DEFAULT_MAX_NEW_TOKENS`).
        generation: sampling settings (:class:`GenerationSettings` or a mapping of its fields) for every row, or a
            sequence of them, one per row (a served batch); greedy by default.
        top_logprobs: record each step's :class:`StepLogprobs` with this many most probable tokens (``0``: the chosen
            token's log-probability only); ``None`` (the default) records nothing and costs nothing.
        stop: called after each step with the ``(batch, t)`` tokens written so far; returns a ``(batch,)`` bool of the
            rows that end at this step (their last token is kept, as an EOS is), e.g. when the decoded text reached a
            stop sequence. Rows that already ended are ignored whatever it says.
        deadline: when the answer is due (``None``: none), checked before each step.
        on_step: called after each step (after ``stop``) with its :class:`GeneratedStep`, as the tokens are written
            (a stream's hook); it changes nothing of the answer.

    Returns:
        The :class:`Continuation`; ``T`` is the longest row's number of steps.

    Raises:
        InvalidInputError: for malformed prompts or prompt + new tokens beyond the model's positions.
        InvalidOptionError: for bad generation settings, token budgets or ``top_logprobs``.
        DeadlineExceededError: once ``deadline`` has passed (the tokens written so far are dropped).
    """
    if top_logprobs is not None and (
        isinstance(top_logprobs, bool) or not isinstance(top_logprobs, int) or top_logprobs < 0
    ):
        raise InvalidOptionError(f"top_logprobs must be an integer >= 0, got {top_logprobs!r}")
    prompt_ids, prompt_mask = left_padded_prompts(model, inputs)
    batch = prompt_ids.shape[0]
    budgets = _budgets(max_new_tokens, batch)
    rows = _row_settings(model, generation, batch)
    longest = max(budgets)
    _check_length(model, prompt_mask, longest)
    device = prompt_ids.device
    if isinstance(rows[0].seed, tuple):  # one settings object for every row, a seed per row
        generators = _generators(rows[0], batch, device)
    else:
        generators = [generator for settings in rows for generator in _generators(settings, 1, device)]
    budget = torch.tensor(budgets, device=device)
    eos_rows = [torch.tensor(list(settings.eos_token_id), device=device, dtype=torch.long) for settings in rows]
    pad = pad_token(model)
    mask = prompt_mask
    positions = (mask.cumsum(dim=-1) - 1).clamp(min=0)
    step_input, step_positions = prompt_ids, positions
    alive = torch.ones(batch, dtype=torch.bool, device=device)
    chosen: list[Tensor] = []
    masks: list[Tensor] = []
    probabilities: list[Tensor] = []
    recorded: list[StepLogprobs] = []
    cache: Any = None
    active = torch.arange(batch, device=device)  # the rows the model still computes
    with evaluating(model), torch.no_grad():
        for step in range(longest):
            alive = alive & (budget > step)
            if not bool(alive.any()):
                break
            if deadline is not None:
                deadline.check(f"generating step {step + 1} of at most {longest}")
            computing = alive[active]
            if not bool(computing.all()) and hasattr(cache, "batch_select_indices"):  # ended rows leave the loop
                kept = computing.nonzero().view(-1)
                cache.batch_select_indices(kept)
                step_input, mask, step_positions, active = (
                    step_input[kept],
                    mask[kept],
                    step_positions[kept],
                    active[kept],
                )
            output = model(
                input_ids=step_input,
                attention_mask=mask,
                position_ids=step_positions,
                cache=cache,
                use_cache=True,
                logits_to_keep=1,
            )
            cache = output.cache if "cache" in output else output.past_key_values
            logits = output.logits[:, -1]
            order = active.tolist()
            token = torch.full((batch,), pad, dtype=torch.long, device=device)
            token[active] = _choose(logits, [rows[row] for row in order], [generators[row] for row in order])
            token = torch.where(alive, token, torch.full_like(token, pad))
            chosen.append(token)
            log_probabilities = (
                logits.log_softmax(dim=-1) if logits.dtype == torch.float64 else logits.float().log_softmax(-1)
            )
            probability = torch.zeros(batch, dtype=log_probabilities.dtype, device=device)
            probability[active] = log_probabilities.gather(1, token[active].view(-1, 1)).view(-1).exp()
            probabilities.append(probability * alive)
            if top_logprobs is not None:
                computed = step_logprobs(
                    logits.unsqueeze(1), token[active].view(-1, 1), alive[active].view(-1, 1), top_logprobs
                )
                recorded.append(_scattered(computed, active, batch))
            masks.append(alive.clone())
            ended = torch.stack([torch.isin(token[row], eos) for row, eos in enumerate(eos_rows)])
            if stop is not None:
                ended = ended | stop(torch.stack(chosen, dim=1)).to(device=device, dtype=torch.bool)
            if on_step is not None:
                written = masks[-1]
                finished = written & (ended | (budget <= step + 1))
                on_step(GeneratedStep(step, token, written, finished, probabilities[-1],
                                      recorded[-1] if top_logprobs is not None else None))  # fmt: skip
            alive = alive & ~ended
            step_input = token[active].view(-1, 1)
            mask = torch.cat([mask, torch.ones_like(step_input)], dim=1)
            step_positions = step_positions[:, -1:] + 1
    tokens = torch.stack(chosen, dim=1)
    logprobs = None
    if top_logprobs is not None:
        logprobs = StepLogprobs(
            torch.cat([step.chosen for step in recorded], dim=1),
            torch.cat([step.top_ids for step in recorded], dim=1),
            torch.cat([step.top_values for step in recorded], dim=1),
        )
    return Continuation(
        prompt_ids, prompt_mask, tokens, torch.stack(masks, dim=1), torch.stack(probabilities, dim=1), logprobs
    )


def _scattered(computed: StepLogprobs, active: Tensor, batch: int) -> StepLogprobs:
    """One step's :class:`StepLogprobs` of the rows ``active`` put at their rows of the whole batch (the rows that
    had ended: 0, as a row's steps after its end are)."""
    chosen = torch.zeros((batch, 1), dtype=computed.chosen.dtype, device=computed.chosen.device)
    top_ids = torch.zeros((batch, 1, computed.top_ids.shape[-1]), dtype=computed.top_ids.dtype,
                          device=computed.top_ids.device)  # fmt: skip
    top_values = torch.zeros_like(top_ids, dtype=computed.top_values.dtype)
    chosen[active], top_ids[active], top_values[active] = computed.chosen, computed.top_ids, computed.top_values
    return StepLogprobs(chosen, top_ids, top_values)


def _row_settings(model: nn.Module, generation: Any, batch: int) -> list[GenerationSettings]:
    """One :class:`GenerationSettings` per row (``generation``: one for all rows, or one per row)."""

    def resolved(value: Any) -> GenerationSettings:
        return value if isinstance(value, GenerationSettings) else GenerationSettings.from_mapping(value, model)

    if generation is None or isinstance(generation, GenerationSettings | Mapping):
        one = resolved(generation)
        if isinstance(one.seed, tuple) and len(one.seed) != batch:
            raise InvalidOptionError(f"generation 'seed' has {len(one.seed)} values for a batch of {batch} prompts")
        return [one] * batch
    rows = [resolved(value) for value in generation]
    if len(rows) != batch:
        raise InvalidOptionError(f"generation has {len(rows)} settings for a batch of {batch} prompts")
    if any(isinstance(row.seed, tuple) for row in rows):
        raise InvalidOptionError("per-row generation settings take one seed each, not a list")
    return rows


def _budgets(max_new_tokens: int | Sequence[int] | None, batch: int) -> list[int]:
    if max_new_tokens is None:
        return [DEFAULT_MAX_NEW_TOKENS] * batch
    values = [max_new_tokens] if isinstance(max_new_tokens, int) else list(max_new_tokens)
    if isinstance(max_new_tokens, Sequence) and len(values) != batch:
        raise InvalidOptionError(f"max_new_tokens has {len(values)} values for a batch of {batch} prompts")
    if any(isinstance(value, bool) or not isinstance(value, int) or value < 1 for value in values):
        raise InvalidOptionError(f"max_new_tokens must be an integer >= 1 (or one per row), got {max_new_tokens!r}")
    return values * batch if len(values) == 1 and isinstance(max_new_tokens, int) else values
