"""The generation service (task ``generation``: causal LMs): a batch of decoded rows in, one outcome per row out.

The rows that generate do so together, in one :func:`explainers.tasks.continuation.generate_continuation` call
(each with its own budget, sampling settings and seed, so a row's answer does not depend on its batch); rows that
bring their own continuation join them after. The rows that ask for an explanation are then grouped by method,
options and target kind (steps or a sum), and each group is one
:func:`explainers.tasks.generation.explain_continuation` (one forward for the group, one batched backward); a row's
own steps and foils are its share of the group's targets. Rows that fail to decode or whose request is invalid get
their own error; the others are served. Nothing per request is kept on the service object. Loading and devices are
:mod:`serving_core.loading`'s.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from explainers import ExplainError, InvalidTargetError, StepSum
from explainers.tasks.continuation import (
    Continuation,
    GenerationSettings,
    generate_continuation,
    model_eos_tokens,
    pad_token,
    vocabulary_size,
)
from explainers.tasks.generation import check_generation_call, explain_continuation, resolve_steps

from ..config import HandlerConfig
from ..errors import RowError, from_explain_error
from ..loading import load_model, load_tokenizer
from ..task import BatchTimings
from ..wire import Encoding
from .generation_schema import GenerationOutcome, GenerationRow, GenerationStepOutcome

logger = logging.getLogger(__name__)


@dataclass
class _Prepared:
    """A valid row, tokenized: its prompt ids and, for a given continuation, its ids."""

    index: int
    row: GenerationRow
    prompt_ids: list[int]
    continuation_ids: list[int] | None
    foils: list[int] | None
    settings: GenerationSettings


class GenerationService:
    """One loaded causal LM and its tokenizer."""

    head_type = "generation"

    def __init__(self, config: HandlerConfig, model_dir: Path, device: torch.device) -> None:
        """Load the checkpoint from ``model_dir`` (eager attention, eval mode, local safetensors only)."""
        self.config = config
        self.device = device
        self.model = load_model(AutoModelForCausalLM, model_dir, device, attn_implementation="eager")
        self.tokenizer: Any = load_tokenizer(model_dir, self.model, config.pad_token_id)
        self.vocabulary = vocabulary_size(self.model)
        self.eos = frozenset(model_eos_tokens(self.model))
        self.special_ids = frozenset(int(i) for i in self.tokenizer.all_special_ids)
        logger.info("loaded causal LM from %s on %s", model_dir, device)

    def _foil_id(self, foil: str | int) -> int:
        if isinstance(foil, int):
            if not 0 <= foil < self.vocabulary:
                raise RowError("invalid_target", f"foil id {foil} is not in the vocabulary [0, {self.vocabulary - 1}]")
            return foil
        vocabulary = self.tokenizer.get_vocab()
        if foil in vocabulary:
            return int(vocabulary[foil])
        ids = self.tokenizer(foil, add_special_tokens=False)["input_ids"]
        unknown = self.tokenizer.unk_token_id
        if len(ids) == 1 and unknown is not None and ids[0] == unknown and foil != self.tokenizer.unk_token:
            raise RowError("invalid_target", f"foil {foil!r} is not in the vocabulary (it is the unknown token)")
        if len(ids) != 1:
            raise RowError(
                "invalid_target",
                f"foil {foil!r} is not one token of the vocabulary (it tokenizes to {len(ids)} tokens): give a "
                "single token's text or its id",
            )
        return int(ids[0])

    def _prepare(self, index: int, row: GenerationRow) -> _Prepared:
        prompt = self.tokenizer(row.prompt)["input_ids"]
        if len(prompt) > self.config.max_length:
            raise RowError(
                "too_many_tokens",
                f"the prompt has {len(prompt)} tokens; this model takes at most {self.config.max_length}",
            )
        continuation: list[int] | None = None
        if row.continuation_ids is not None:
            continuation = list(row.continuation_ids)
            if any(not 0 <= token < self.vocabulary for token in continuation):
                raise RowError("invalid_request", f"continuation_ids must be token ids in [0, {self.vocabulary - 1}]")
        elif row.continuation is not None:
            continuation = list(self.tokenizer(row.continuation, add_special_tokens=False)["input_ids"])
            if len(continuation) > self.config.max_new_tokens:
                raise RowError(
                    "too_many_tokens",
                    f"the continuation has {len(continuation)} tokens; this model explains at most "
                    f"{self.config.max_new_tokens} (max_new_tokens)",
                )
        foils = None
        try:
            if row.ask is not None:
                check_generation_call(self.model, row.ask.method, row.ask.options)
                if row.ask.contrast is not None:
                    foils = [self._foil_id(foil) for foil in row.ask.contrast]
            settings = GenerationSettings.from_mapping(row.sampling, self.model)
        except ExplainError as error:
            raise from_explain_error(error) from None
        return _Prepared(index, row, prompt, continuation, foils, settings)

    def run(
        self, rows: Sequence[GenerationRow | RowError], encodings: Sequence[Encoding]
    ) -> tuple[list[GenerationOutcome], BatchTimings]:
        """Serve a batch: one outcome per row, in order, and the batch's shared stage timings."""
        outcomes = [GenerationOutcome(encoding=encoding) for encoding in encodings]
        prepared: list[_Prepared] = []
        for index, row in enumerate(rows):
            if isinstance(row, RowError):
                outcomes[index].error = row
                continue
            try:
                prepared.append(self._prepare(index, row))
            except RowError as error:
                outcomes[index].error = error
        if not prepared:
            return outcomes, BatchTimings()
        try:
            made, generate_seconds = self._continuations(prepared)
        except Exception:
            logger.exception("generation of a batch of %d rows failed", len(prepared))
            for item in prepared:
                outcomes[item.index].error = RowError("internal", "the batch failed on the server; see the server log")
            return outcomes, BatchTimings()
        for position, item in enumerate(prepared):
            self._fill(outcomes[item.index], item, made, position)
        forward, backward = self._explain(prepared, made, outcomes)
        tokens = int(made.token_mask[[not item.row.given for item in prepared]].sum())
        return outcomes, BatchTimings(forward=forward, backward=backward, generate=generate_seconds, tokens=tokens)

    def _continuations(self, prepared: Sequence[_Prepared]) -> tuple[Continuation, float]:
        """One :class:`Continuation` of every prepared row: the generated rows from one generation call, then the
        given ones; and the generation's seconds."""
        pad = pad_token(self.model)
        prompts = [item.prompt_ids for item in prepared]
        width = max(len(prompt) for prompt in prompts)
        prompt_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=self.device)
        prompt_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self.device)
        generating = [position for position, item in enumerate(prepared) if not item.row.given]
        columns: list[list[int]] = [[] for _ in prepared]
        probabilities: list[list[float] | None] = [None] * len(prepared)
        seconds = 0.0
        if generating:
            started = time.perf_counter()
            index = torch.tensor(generating, device=self.device)
            made = generate_continuation(
                self.model,
                {"input_ids": prompt_ids[index], "attention_mask": prompt_mask[index]},
                [prepared[position].row.max_new_tokens for position in generating],
                [prepared[position].settings for position in generating],
            )
            seconds = time.perf_counter() - started
            assert made.probabilities is not None
            for offset, position in enumerate(generating):
                real = made.token_mask[offset]
                columns[position] = made.tokens[offset][real].tolist()
                probabilities[position] = made.probabilities[offset][real].tolist()
        for position, item in enumerate(prepared):
            if item.continuation_ids is not None:
                columns[position] = _until_eos(item.continuation_ids, self.eos)
        steps = max(max(len(column) for column in columns), 1)
        tokens = torch.tensor([column + [pad] * (steps - len(column)) for column in columns], device=self.device)
        mask = torch.tensor([[True] * len(c) + [False] * (steps - len(c)) for c in columns], device=self.device)
        known = torch.tensor([[*(p or []), *[0.0] * (steps - len(p or []))] for p in probabilities])
        if any(p is None for p in probabilities):
            known = self._probabilities(Continuation(prompt_ids, prompt_mask, tokens, mask), known, probabilities)
        return Continuation(prompt_ids, prompt_mask, tokens, mask, known), seconds

    def _probabilities(
        self, made: Continuation, known: torch.Tensor, probabilities: Sequence[list[float] | None]
    ) -> torch.Tensor:
        """The step probabilities of the given continuations, from one plain forward over their rows."""
        from explainers.tasks.continuation import evaluating
        from explainers.tasks.generation import step_probabilities

        given = [position for position, value in enumerate(probabilities) if value is None]
        subset = made.rows(given)
        with evaluating(self.model), torch.no_grad():
            logits = self.model(**subset.model_inputs()).logits
        computed = step_probabilities(logits, subset).cpu()
        for offset, position in enumerate(given):
            width = computed.shape[1]
            known[position, :width] = computed[offset].to(known.dtype)
        return known

    def _fill(self, outcome: GenerationOutcome, item: _Prepared, made: Continuation, position: int) -> None:
        steps = int(made.token_mask[position].sum())
        ids = made.tokens[position, :steps].tolist()
        assert made.probabilities is not None
        values = made.probabilities[position, :steps].tolist()
        outcome.text = self.tokenizer.decode(ids, skip_special_tokens=True)
        if item.row.given:
            outcome.stop_reason = "given"
        else:
            outcome.stop_reason = "eos" if ids and ids[-1] in self.eos else "length"
        outcome.prompt_tokens = self.tokenizer.convert_ids_to_tokens(item.prompt_ids)
        outcome.prompt_special = [token in self.special_ids for token in item.prompt_ids]
        pieces = self.tokenizer.convert_ids_to_tokens(ids)
        outcome.steps = [
            GenerationStepOutcome(token=str(piece), token_id=int(token), probability=float(value))
            for piece, token, value in zip(pieces, ids, values, strict=True)
        ]

    def _explain(
        self, prepared: Sequence[_Prepared], made: Continuation, outcomes: list[GenerationOutcome]
    ) -> tuple[float, float]:
        """Explain the rows that ask, one group per (method, options, steps kind); returns forward and backward
        seconds summed over the groups."""
        groups: dict[tuple[Any, ...], list[tuple[int, Any, list[int] | None]]] = {}
        for position, item in enumerate(prepared):
            ask = item.row.ask
            if ask is None or outcomes[item.index].error is not None:
                continue
            row_steps = int(made.token_mask[position].sum())
            try:
                steps = resolve_steps(ask.steps, row_steps)
                foils = item.foils
                if foils is not None and len(foils) not in (1, row_steps):
                    raise InvalidTargetError(
                        f"contrast has {len(foils)} foils for {row_steps} steps: give one for every step or one each"
                    )
            except ExplainError as error:
                outcomes[item.index].error = from_explain_error(error)
                continue
            key_steps = ("sum", steps.start, steps.stop) if isinstance(steps, StepSum) else ("steps",)
            key = (ask.method, tuple(sorted(ask.options.items())), key_steps, foils is not None)
            groups.setdefault(key, []).append((position, steps, foils))
        forward = backward = 0.0
        for (method, options, key_steps, contrasted), members in groups.items():
            positions = [position for position, _, _ in members]
            subset = made.rows(positions)
            total = subset.steps
            wanted = torch.zeros((len(positions), total), dtype=torch.bool, device=subset.tokens.device)
            foil_ids = torch.full((len(positions), total), -1, dtype=torch.long, device=subset.tokens.device)
            for offset, (_, steps, row_foils) in enumerate(members):
                if isinstance(steps, StepSum):
                    wanted[offset] = True
                else:
                    wanted[offset, list(steps)] = True
                if row_foils is not None:
                    count = int(subset.token_mask[offset].sum())
                    repeated = row_foils * (count if len(row_foils) == 1 else 1)
                    foil_ids[offset, :count] = torch.tensor(repeated[:count], device=foil_ids.device)
            summed = StepSum(key_steps[1], key_steps[2]) if key_steps[0] == "sum" else None
            try:
                result = explain_continuation(
                    self.model,
                    subset,
                    method=method,
                    steps=summed,
                    contrast=foil_ids if contrasted else None,
                    options=dict(options),
                    wanted=wanted,
                )
            except ExplainError as error:
                for position in positions:
                    outcomes[prepared[position].index].error = from_explain_error(error)
                continue
            except Exception:
                logger.exception("explaining a group of %d generation rows failed", len(positions))
                for position in positions:
                    outcomes[prepared[position].index].error = RowError(
                        "internal", "the batch failed on the server; see the server log"
                    )
                continue
            forward += float(result.seconds.get("forward", 0.0))
            backward += float(result.seconds.get("backward", 0.0))
            seconds = float(result.seconds.get("attribution", 0.0))
            for offset, (position, steps, _) in enumerate(members):
                self._fill_explanation(outcomes[prepared[position].index], result, offset, steps, seconds)
        return forward, backward

    def _fill_explanation(
        self, outcome: GenerationOutcome, result: Any, offset: int, steps: Any, seconds: float
    ) -> None:
        scores = result.scores.float().cpu()
        if not bool(torch.isfinite(scores[offset]).all()):
            outcome.error = RowError(
                "attribution_failed", f"method {result.method!r} gave NaN or infinite scores for this row"
            )
            return
        outcome.method = result.method
        outcome.options = dict(result.options)
        outcome.attribution_seconds = seconds
        if isinstance(steps, StepSum):
            start, stop = steps.span(int(result.generated_mask[offset].sum()))
            outcome.summed = (start, stop)
            outcome.sum_scores = result.context_scores(offset, 0).float().tolist()
            outcome.sum_value = float(result.values[offset, 0])
            return
        for step in steps:
            entry = outcome.steps[step]
            entry.explained = True
            entry.scores = result.context_scores(offset, step).float().tolist()
            entry.value = float(result.values[offset, step])
            if result.contrast is not None and int(result.contrast[offset, step]) >= 0:
                entry.foil_id = int(result.contrast[offset, step])
                entry.foil = str(self.tokenizer.convert_ids_to_tokens(entry.foil_id))


def _until_eos(tokens: Sequence[int], eos: frozenset[int]) -> list[int]:
    """The tokens up to and including the first EOS."""
    kept: list[int] = []
    for token in tokens:
        kept.append(int(token))
        if token in eos:
            break
    return kept
