"""The generation service (task ``generation``: causal LMs): a batch of decoded rows in, one outcome per row out.

A row's prompt is read first (:mod:`~serving_core.tasks.generation_prompts`: its ``prompt`` after a documents block
when it has documents, or its chat ``messages`` rendered with the chat template, tokenized with character offsets) and
the rows are admitted against the time budget (:mod:`~serving_core.tasks.generation_admission`). The rows that
generate do so together, in one :func:`explainers.generate_continuation` call (each with its own budget, sampling
settings and seed, so a row's answer does not depend on its batch); rows that bring their own continuation join them
after. A row with ``stop`` sequences ends at the step whose text first contains one
(:mod:`~serving_core.tasks.generation_stopping`); a row that asks for ``logprobs`` gets each step's log-probabilities
from the generation loop (a given continuation: from its probabilities' forward), the others cost nothing more
(:mod:`~serving_core.tasks.generation_logprobs`). A row that streams (its ``listener``, set by its door) is sent its
tokens as they are written, and the rest of its text once it is answered
(:mod:`~serving_core.tasks.generation_streaming`); its door then sends the answer. The rows that ask for an
explanation are then grouped by the library's planner and explained group by group
(:mod:`~serving_core.tasks.generation_explanation`). Rows that fail to decode or whose request is invalid get their
own error; the others are served. Nothing per request is kept on the service object. Loading and devices are
:mod:`serving_core.loading`'s. The batch span's stages
(:func:`serving_core.tracing.stage`) are ``generate`` and ``explanation``.

Time (docs/SERVING.md, "Time budgets and deadlines"): with a ``time_budget_s``, each row is estimated before anything
is generated; a row over the budget, alone or beside the rows admitted before it, is refused with
``over_time_budget``; once its answer is written its explanation is admitted for the answer's actual sentences or
steps, and one that does not fit leaves the answer served with an ``explanation_error``
(:mod:`~serving_core.tasks.generation_admission`). The model's speed is probed at load and corrected by the batches
it serves (:class:`explainers.ServedSpeed`). A row with a deadline stops generating once it passes
(``deadline_exceeded``; the batch's other rows go on), and its explanation group (rows are grouped by deadline) is
abandoned between chunks of steps.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from explainers import (
    Continuation,
    ModelSpeed,
    ServedSpeed,
    describe,
    evaluating,
    generate_continuation,
    model_eos_tokens,
    pad_token,
    position_limit,
    step_logprobs,
    step_probabilities,
    supported_methods,
    vocabulary_size,
)

from .. import tracing
from ..config import HandlerConfig
from ..errors import RowError, from_explain_error
from ..loading import check_default_method, load_model, load_tokenizer
from ..task import BatchTimings
from ..wire import Encoding
from .generation_admission import Admission
from .generation_context import prompt_parts
from .generation_explanation import Explanations
from .generation_logprobs import LogprobsDecoder, RowLogprobs, row_logprobs
from .generation_prompts import Prepared, Prompts
from .generation_schema import GenerationOutcome, GenerationRow, GenerationStepOutcome
from .generation_stopping import first_stop, stopper, until_eos
from .generation_streaming import RowStreams

logger = logging.getLogger(__name__)


class GenerationService:
    """One loaded causal LM and its tokenizer."""

    head_type = "generation"

    def __init__(self, config: HandlerConfig, model_dir: Path, device: torch.device) -> None:
        """Load the checkpoint from ``model_dir`` (eager attention, eval mode, local safetensors only).

        Raises:
            ConfigError: if the model's family refuses ``config.default_method``.
        """
        self.config = config
        self.device = device
        self.model = load_model(AutoModelForCausalLM, model_dir, device, attn_implementation="eager")
        check_default_method(config.default_method, str(getattr(self.model.config, "model_type", "")), config.task)
        self.tokenizer: Any = load_tokenizer(model_dir, self.model, config.pad_token_id)
        self.vocabulary = vocabulary_size(self.model)
        self.eos = frozenset(model_eos_tokens(self.model))
        self.special_ids = frozenset(int(i) for i in self.tokenizer.all_special_ids)
        self.logprob_decoder = LogprobsDecoder(self.tokenizer)
        self.positions = position_limit(self.model)
        self.arch = describe(self.model)
        self.alternatives = supported_methods(self.arch.model_type, self.arch.task)
        self.explanations = Explanations(self.model, self.tokenizer)
        self.served: ServedSpeed | None = None
        if config.time_budget_s is not None:  # probed at load; then corrected by the batches served
            self.served = ServedSpeed(self._probe(), measure=self._probe)
        logger.info(
            "loaded causal LM from %s on %s; time budget %s s, speed %s", model_dir, device, config.time_budget_s,
            self.speed,
        )  # fmt: skip

    def _probe(self) -> ModelSpeed:
        """The model's speed, measured now at the longest prompt and answer served (with its cached step)."""
        return ModelSpeed.measure(self.model, self.arch, self.config.max_length + self.config.max_new_tokens)

    @property
    def speed(self) -> ModelSpeed | None:
        """The speed probed at load (``None``: no time budget); :attr:`served` corrects it by the batches served."""
        return None if self.served is None else self.served.probe

    @speed.setter
    def speed(self, value: ModelSpeed | None) -> None:
        """Set a speed by hand: estimates then use it as given, not corrected by served batches."""
        self.served = None if value is None else ServedSpeed(value, learns=False)

    def run(
        self, rows: Sequence[GenerationRow | RowError], encodings: Sequence[Encoding]
    ) -> tuple[list[GenerationOutcome], BatchTimings]:
        """Serve a batch: one outcome per row, in order, and the batch's shared stage timings."""
        outcomes = [GenerationOutcome(encoding=encoding) for encoding in encodings]
        prompts = Prompts(self.config, self.tokenizer, self.model, self.vocabulary, self.positions)
        prepared: list[Prepared] = []
        for index, row in enumerate(rows):
            if isinstance(row, RowError):
                outcomes[index].error = row
                continue
            try:
                prepared.append(prompts.prepare(index, row))
            except RowError as error:
                outcomes[index].error = error
        admission = Admission(self.config.time_budget_s, self.served, self.arch, self.alternatives)
        prepared = admission.admitted(prepared, outcomes)
        if not prepared:
            return outcomes, BatchTimings()
        late: set[int] = set()
        streams = RowStreams(
            self.tokenizer,
            self.logprob_decoder,
            [item.row.listener for item in prepared],
            [item.row.stop for item in prepared],
            [item.row.logprobs for item in prepared],
        )
        try:
            with tracing.stage("generate", {"explain.batch_rows": len(prepared)}):
                made, generate_seconds, logprobs = self._continuations(prepared, late, streams)
        except Exception:
            logger.exception("generation of a batch of %d rows failed", len(prepared))
            for item in prepared:
                outcomes[item.index].error = RowError("internal", "the batch failed on the server; see the server log")
            return outcomes, BatchTimings()
        for position, item in enumerate(prepared):
            if position in late:  # its deadline passed while it was being written
                assert item.row.deadline is not None
                outcomes[item.index].error = from_explain_error(
                    item.row.deadline.exceeded("writing the rest of the answer")
                )
                continue
            self._fill(outcomes[item.index], item, made, position, logprobs[position])
            streams.finish(position, outcomes[item.index].text)
        admission.written(prepared, made, generate_seconds)
        started = time.perf_counter()
        with tracing.stage("explanation", {"explain.batch_rows": len(prepared)}):
            forward, backward = self.explanations.explain(prepared, made, outcomes, admit=admission.explanation)
        admission.explained(time.perf_counter() - started)
        tokens = int(made.token_mask[[not item.row.given for item in prepared]].sum())
        return outcomes, BatchTimings(forward=forward, backward=backward, generate=generate_seconds, tokens=tokens)

    def _continuations(
        self, prepared: Sequence[Prepared], late: set[int], streams: RowStreams
    ) -> tuple[Continuation, float, list[RowLogprobs | None]]:
        """One :class:`Continuation` of every prepared row: the generated rows from one generation call, then the
        given ones; the generation's seconds; and each row's log-probabilities, if it asked for them. A row whose
        deadline passes while it is written stops there; its position is added to ``late``. A streaming row sends its
        tokens through ``streams`` as they are written."""
        pad = pad_token(self.model)
        prompts = [item.prompt_ids for item in prepared]
        width = max(len(prompt) for prompt in prompts)
        prompt_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=self.device)
        prompt_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self.device)
        generating = [position for position, item in enumerate(prepared) if not item.row.given]
        columns: list[list[int]] = [[] for _ in prepared]
        probabilities: list[list[float] | None] = [None] * len(prepared)
        logprobs: list[RowLogprobs | None] = [None] * len(prepared)
        seconds = 0.0
        if generating:
            started = time.perf_counter()
            index = torch.tensor(generating, device=self.device)
            asked = [k for k in (prepared[position].row.logprobs for position in generating) if k is not None]
            made = generate_continuation(
                self.model,
                {"input_ids": prompt_ids[index], "attention_mask": prompt_mask[index]},
                [prepared[position].row.max_new_tokens for position in generating],
                [prepared[position].settings for position in generating],
                top_logprobs=max(asked) if asked else None,
                stop=stopper(
                    self.tokenizer,
                    self.eos,
                    [prepared[position].row.stop for position in generating],
                    [prepared[position].row.deadline for position in generating],
                    [prepared[position].row.max_new_tokens for position in generating],
                    lambda offset: late.add(generating[offset]),
                ),
                on_step=streams.hook(generating),
            )
            seconds = time.perf_counter() - started
            assert made.probabilities is not None
            for offset, position in enumerate(generating):
                real = made.token_mask[offset]
                columns[position] = made.tokens[offset][real].tolist()
                probabilities[position] = made.probabilities[offset][real].tolist()
                logprobs[position] = row_logprobs(made.logprobs, offset, real, prepared[position].row.logprobs)
        for position, item in enumerate(prepared):
            if item.continuation_ids is not None:
                columns[position] = until_eos(item.continuation_ids, self.eos)
        steps = max(max(len(column) for column in columns), 1)
        tokens = torch.tensor([column + [pad] * (steps - len(column)) for column in columns], device=self.device)
        mask = torch.tensor([[True] * len(c) + [False] * (steps - len(c)) for c in columns], device=self.device)
        known = torch.tensor([[*(p or []), *[0.0] * (steps - len(p or []))] for p in probabilities])
        if any(p is None for p in probabilities):
            given = Continuation(prompt_ids, prompt_mask, tokens, mask)
            known = self._probabilities(given, known, probabilities, logprobs, [item.row for item in prepared])
        return Continuation(prompt_ids, prompt_mask, tokens, mask, known), seconds, logprobs

    def _probabilities(
        self,
        made: Continuation,
        known: torch.Tensor,
        probabilities: Sequence[list[float] | None],
        logprobs: list[RowLogprobs | None],
        rows: Sequence[GenerationRow],
    ) -> torch.Tensor:
        """The step probabilities of the given continuations, from one plain forward over their rows (and the
        log-probabilities of those that ask, into ``logprobs``)."""
        given = [position for position, value in enumerate(probabilities) if value is None]
        subset = made.rows(given)
        with evaluating(self.model), torch.no_grad():
            logits = self.model(**subset.model_inputs()).logits
        computed = step_probabilities(logits, subset).cpu()
        asked = [k for k in (rows[position].logprobs for position in given) if k is not None]
        recorded = None
        if asked:
            width = subset.prompt_width
            reading = logits[:, width - 1 : width - 1 + subset.steps]
            recorded = step_logprobs(reading, subset.tokens, subset.token_mask, max(asked))
        for offset, position in enumerate(given):
            width = computed.shape[1]
            known[position, :width] = computed[offset].to(known.dtype)
            logprobs[position] = row_logprobs(recorded, offset, subset.token_mask[offset], rows[position].logprobs)
        return known

    def _fill(
        self,
        outcome: GenerationOutcome,
        item: Prepared,
        made: Continuation,
        position: int,
        logprobs: RowLogprobs | None,
    ) -> None:
        """A row's answer into its outcome: its text (cut before a stop sequence), why it stopped, its prompt's tokens
        and parts, and its steps (with their log-probabilities, if it asked)."""
        steps = int(made.token_mask[position].sum())
        ids = made.tokens[position, :steps].tolist()
        assert made.probabilities is not None
        values = made.probabilities[position, :steps].tolist()
        outcome.text = self.tokenizer.decode(ids, skip_special_tokens=True)
        cut = first_stop(outcome.text, item.row.stop)
        if item.row.given:
            outcome.stop_reason = "given"
        elif cut is not None:
            outcome.stop_reason, outcome.stop = "stop", cut[1]
            outcome.text = outcome.text[: cut[0]]
        else:
            outcome.stop_reason = "eos" if ids and ids[-1] in self.eos else "length"
        outcome.prompt_tokens = self.tokenizer.convert_ids_to_tokens(item.prompt_ids)
        outcome.prompt_special = [token in self.special_ids for token in item.prompt_ids]
        row = item.row
        if row.messages is not None or row.documents:
            outcome.rendered_prompt = item.rendered.text
            roles = None if row.messages is None else [message.role for message in row.messages]
            outcome.messages, outcome.documents = prompt_parts(item.rendered, roles, len(row.documents))
            outcome.documents_placement = item.rendered.placement
        pieces = self.tokenizer.convert_ids_to_tokens(ids)
        outcome.steps = [
            GenerationStepOutcome(token=str(piece), token_id=int(token), probability=float(value))
            for piece, token, value in zip(pieces, ids, values, strict=True)
        ]
        if logprobs is not None:
            self.logprob_decoder.fill(outcome.steps, logprobs)
