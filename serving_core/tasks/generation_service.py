"""The generation service (task ``generation``: causal LMs): a batch of decoded rows in, one outcome per row out.

A row's prompt is its ``prompt`` (after a documents block when it has documents) or its chat ``messages`` rendered
with the chat template (:func:`explainers.render_chat`), tokenized with character offsets. The rows that generate do
so together, in one :func:`explainers.tasks.continuation.generate_continuation` call (each with its own budget,
sampling settings and seed, so a row's answer does not depend on its batch); rows that bring their own continuation
join them after. The rows that ask for an explanation are then grouped by method, options and target kind (steps, a
sum, or spans of the answer: its sentences or the span asked for), and each group is one
:func:`explainers.tasks.generation.explain_continuation` or :func:`explainers.explain_spans` (one forward for the
group, one batched backward); a row's own steps, foils and sentences are its share of the group's targets. Scores are
then summed into the units the row asked for (:mod:`~serving_core.tasks.generation_context`). A row with ``stop``
sequences ends at the step whose text first contains one (its steps keep the tokens that wrote the stop sequence, as
they keep an EOS, and its text ends before it); a row that asks for ``logprobs`` gets each step's log-probabilities
from the generation loop (a given continuation: from its probabilities' forward), the others cost nothing more.
Rows that fail to decode or whose request is invalid get their own error; the others are served. Nothing per request
is kept on the service object. Loading and devices are :mod:`serving_core.loading`'s.

Time (docs/SERVING.md, "Time budgets and deadlines"): with a ``time_budget_s``, each row is estimated before anything
is generated (:mod:`explainers.timing`): writing its ``max_new_tokens`` (or reading its given continuation) and, if it
asks, explaining its steps (every step, at most ``max_new_tokens``; one for a sum; a sentence per step at most) at the
length of prompt and answer; a row over the budget, alone or beside the rows admitted before it, is refused with
``over_time_budget``. A row with a deadline stops generating once it passes (``deadline_exceeded``; the batch's other
rows go on), and its explanation group (rows are grouped by deadline) is abandoned between chunks of steps.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from explainers import (
    Deadline,
    ExplainError,
    InvalidOptionError,
    InvalidTargetError,
    ModelSpeed,
    PromptField,
    RenderedPrompt,
    SpanExplanation,
    StepSum,
    decoded_offsets,
    describe,
    explain_spans,
    render_chat,
    render_prompt,
    span_steps,
)
from explainers.architectures.support import supported_methods
from explainers.methods import available_methods, get_method
from explainers.tasks.continuation import (
    Continuation,
    GenerationSettings,
    StepLogprobs,
    generate_continuation,
    model_eos_tokens,
    pad_token,
    position_limit,
    step_logprobs,
    vocabulary_size,
)
from explainers.tasks.generation import check_generation_call, explain_continuation, resolve_steps
from explainers.timing import (
    check_generation_budget,
    check_time_budget,
    generation_seconds,
    prediction_seconds,
)

from ..config import HandlerConfig
from ..errors import RowError, from_explain_error
from ..loading import check_default_method, load_model, load_tokenizer
from ..task import BatchTimings
from ..wire import Encoding
from .chat_schema import AnswerSpan
from .generation_context import RowContext, prompt_parts, row_context, sentence_spans
from .generation_schema import (
    SENTENCES,
    GenerationAsk,
    GenerationOutcome,
    GenerationRow,
    GenerationStepOutcome,
    TopToken,
)

logger = logging.getLogger(__name__)


@dataclass
class _Prepared:
    """A valid row, tokenized: its rendered prompt and ids and, for a given continuation, its ids."""

    index: int
    row: GenerationRow
    rendered: RenderedPrompt
    continuation_ids: list[int] | None
    foils: list[int] | None
    settings: GenerationSettings

    @property
    def prompt_ids(self) -> list[int]:
        """The prompt's token ids."""
        return list(self.rendered.input_ids)


def _explains_spans(ask: GenerationAsk, row: GenerationRow) -> bool:
    """Whether a row explains spans of its answer (its sentences, or the span asked for) rather than steps."""
    return ask.span is not None or ask.steps == SENTENCES or (ask.steps is None and bool(row.documents))


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
        self.byte_decoder = byte_level_decoder(self.tokenizer)
        self.special_pieces = frozenset(str(piece) for piece in self.tokenizer.all_special_tokens)
        self.positions = position_limit(self.model)
        self.arch = describe(self.model)
        self.alternatives = supported_methods(self.arch.model_type, available_methods(), self.arch.task)
        self.speed: ModelSpeed | None = None
        if config.time_budget_s is not None:  # measured once, at the longest prompt and answer served
            self.speed = ModelSpeed.measure(self.model, self.arch, config.max_length + config.max_new_tokens)
        logger.info(
            "loaded causal LM from %s on %s; time budget %s s, speed %s", model_dir, device, config.time_budget_s,
            self.speed,
        )  # fmt: skip

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

    def _render(self, row: GenerationRow) -> RenderedPrompt:
        """The row's prompt rendered (chat template, documents block) and tokenized with character offsets.

        Raises:
            RowError: ``no_chat_template``, ``invalid_messages``, or ``invalid_request``/``invalid_option`` for what a
                slow tokenizer (no offsets) cannot do.
        """
        try:
            if row.messages is not None:
                return render_chat(self.tokenizer, row.messages, row.documents, chat_template=self.config.chat_template)
            if getattr(self.tokenizer, "is_fast", False):
                return render_prompt(self.tokenizer, row.prompt or "", row.documents)
            if row.documents:
                render_prompt(self.tokenizer, row.prompt or "", row.documents)  # raises: it needs offsets
            if row.ask is not None and (row.ask.granularity != "token" or _explains_spans(row.ask, row)):
                raise InvalidOptionError(
                    "words, sentences and spans of the answer need a fast tokenizer's character offsets; this model's "
                    "tokenizer is not one (no tokenizer.json): explain tokens and steps"
                )
        except ExplainError as error:
            raise from_explain_error(error) from None
        prompt = row.prompt or ""
        ids = self.tokenizer(prompt)["input_ids"]
        return RenderedPrompt(prompt, tuple(ids), (None,) * len(ids), (PromptField("prompt", 0, "prompt"),))

    def _prepare(self, index: int, row: GenerationRow) -> _Prepared:
        rendered = self._render(row)
        prompt = list(rendered.input_ids)
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
        answer = len(continuation) if continuation is not None else row.max_new_tokens
        if self.positions is not None and len(prompt) + answer > self.positions:
            raise RowError(
                "too_many_tokens",
                f"the prompt has {len(prompt)} tokens and {answer} new tokens would make {len(prompt) + answer}, "
                f"beyond the model's {self.positions} positions: send a shorter prompt or ask for at most "
                f"{max(self.positions - len(prompt), 0)} new tokens (max_new_tokens)",
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
        return _Prepared(index, row, rendered, continuation, foils, settings)

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
        prepared = self._admitted(prepared, outcomes)
        if not prepared:
            return outcomes, BatchTimings()
        late: set[int] = set()
        try:
            made, generate_seconds, logprobs = self._continuations(prepared, late)
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
        forward, backward = self._explain(prepared, made, outcomes)
        tokens = int(made.token_mask[[not item.row.given for item in prepared]].sum())
        return outcomes, BatchTimings(forward=forward, backward=backward, generate=generate_seconds, tokens=tokens)

    def _admitted(self, prepared: list[_Prepared], outcomes: list[GenerationOutcome]) -> list[_Prepared]:
        """The rows admitted against the time budget, in order: the rows that only generate are counted first, then
        the rows that ask for an explanation, each in order; each refused row gets ``over_time_budget`` (or
        ``deadline_exceeded`` when its deadline has already passed)."""
        admitted: list[_Prepared] = []
        seconds = 0.0
        for item in sorted(prepared, key=lambda item: item.row.ask is not None):  # a stable sort: order kept
            deadline = item.row.deadline
            if deadline is not None and deadline.passed:
                outcomes[item.index].error = from_explain_error(deadline.exceeded("any work"))
                continue
            try:
                seconds += self._estimate(item, seconds)
            except ExplainError as error:
                outcomes[item.index].error = from_explain_error(error)
                if item.row.ask is not None:
                    outcomes[item.index].method = item.row.ask.method
                continue
            admitted.append(item)
        return sorted(admitted, key=lambda item: item.index)

    def _estimate(self, item: _Prepared, admitted_s: float) -> float:
        """A row's estimated seconds (0 without a budget): writing its tokens, then explaining its steps.

        Raises:
            TimeBudgetError: when it does not fit beside ``admitted_s`` seconds of the rows admitted before it.
        """
        budget, speed = self.config.time_budget_s, self.speed
        if budget is None or speed is None:
            return 0.0
        row = item.row
        prompt = len(item.prompt_ids)
        if item.continuation_ids is not None:
            new_tokens = len(item.continuation_ids)
            writing = prediction_seconds(speed, prompt + new_tokens)
        else:
            new_tokens = row.max_new_tokens
            writing = generation_seconds(speed, prompt, new_tokens)
        ask = row.ask
        if ask is None:
            if item.continuation_ids is not None:
                return writing
            return check_generation_budget(speed, prompt, new_tokens, budget, admitted_s)
        method = get_method(ask.method)
        options = method.resolve_options(ask.options, self.arch)
        if isinstance(ask.steps, StepSum) or ask.span is not None:
            targets = 1  # one summed objective: the steps' sum, or the span asked for
        elif isinstance(ask.steps, tuple):
            targets = len(ask.steps)
        else:
            targets = max(new_tokens, 1)  # every step, or a sentence per step at most
        return check_time_budget(
            speed, method, prompt + new_tokens, options, budget, self.alternatives, admitted_s,
            targets=targets, generate_s=writing,
        )  # fmt: skip

    def _continuations(
        self, prepared: Sequence[_Prepared], late: set[int]
    ) -> tuple[Continuation, float, list[_RowLogprobs | None]]:
        """One :class:`Continuation` of every prepared row: the generated rows from one generation call, then the
        given ones; the generation's seconds; and each row's log-probabilities, if it asked for them. A row whose
        deadline passes while it is written stops there; its position is added to ``late``."""
        pad = pad_token(self.model)
        prompts = [item.prompt_ids for item in prepared]
        width = max(len(prompt) for prompt in prompts)
        prompt_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=self.device)
        prompt_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self.device)
        generating = [position for position, item in enumerate(prepared) if not item.row.given]
        columns: list[list[int]] = [[] for _ in prepared]
        probabilities: list[list[float] | None] = [None] * len(prepared)
        logprobs: list[_RowLogprobs | None] = [None] * len(prepared)
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
                stop=self._stopper(
                    [prepared[position].row.stop for position in generating],
                    [prepared[position].row.deadline for position in generating],
                    [prepared[position].row.max_new_tokens for position in generating],
                    lambda offset: late.add(generating[offset]),
                ),
            )
            seconds = time.perf_counter() - started
            assert made.probabilities is not None
            for offset, position in enumerate(generating):
                real = made.token_mask[offset]
                columns[position] = made.tokens[offset][real].tolist()
                probabilities[position] = made.probabilities[offset][real].tolist()
                logprobs[position] = _row_logprobs(made.logprobs, offset, real, prepared[position].row.logprobs)
        for position, item in enumerate(prepared):
            if item.continuation_ids is not None:
                columns[position] = _until_eos(item.continuation_ids, self.eos)
        steps = max(max(len(column) for column in columns), 1)
        tokens = torch.tensor([column + [pad] * (steps - len(column)) for column in columns], device=self.device)
        mask = torch.tensor([[True] * len(c) + [False] * (steps - len(c)) for c in columns], device=self.device)
        known = torch.tensor([[*(p or []), *[0.0] * (steps - len(p or []))] for p in probabilities])
        if any(p is None for p in probabilities):
            given = Continuation(prompt_ids, prompt_mask, tokens, mask)
            known = self._probabilities(given, known, probabilities, logprobs, [item.row for item in prepared])
        return Continuation(prompt_ids, prompt_mask, tokens, mask, known), seconds, logprobs

    def _stopper(
        self,
        stops: Sequence[tuple[str, ...]],
        deadlines: Sequence[Deadline | None],
        budgets: Sequence[int],
        passed: Callable[[int], None],
    ) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """The ``stop`` callback of the generation loop (``None``: no row has stop sequences or a deadline): a row
        ends at the step whose decoded text first contains one of its sequences, or, while it is still being
        written (no EOS yet, under its token budget ``budgets``, no stop sequence), once its deadline has passed
        (``passed`` is told the row's offset, once)."""
        if not any(stops) and not any(deadlines):
            return None
        finished: set[int] = set()

        def stopped(tokens: torch.Tensor) -> torch.Tensor:
            ended = torch.zeros(tokens.shape[0], dtype=torch.bool)
            for row, sequences in enumerate(stops):
                if sequences:
                    text = self.tokenizer.decode(tokens[row].tolist(), skip_special_tokens=True)
                    ended[row] = any(sequence in text for sequence in sequences)
            for row, deadline in enumerate(deadlines):
                if deadline is None or row in finished:
                    continue
                written = tokens[row].tolist()
                if bool(ended[row]) or len(written) >= budgets[row] or any(token in self.eos for token in written):
                    finished.add(row)  # it ends here or has ended: answered, whatever its deadline
                elif deadline.passed:
                    finished.add(row)
                    passed(row)
                    ended[row] = True
            return ended

        return stopped

    def _probabilities(
        self,
        made: Continuation,
        known: torch.Tensor,
        probabilities: Sequence[list[float] | None],
        logprobs: list[_RowLogprobs | None],
        rows: Sequence[GenerationRow],
    ) -> torch.Tensor:
        """The step probabilities of the given continuations, from one plain forward over their rows (and the
        log-probabilities of those that ask, into ``logprobs``)."""
        from explainers.tasks.continuation import evaluating
        from explainers.tasks.generation import step_probabilities

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
            logprobs[position] = _row_logprobs(recorded, offset, subset.token_mask[offset], rows[position].logprobs)
        return known

    def _fill(
        self,
        outcome: GenerationOutcome,
        item: _Prepared,
        made: Continuation,
        position: int,
        logprobs: _RowLogprobs | None,
    ) -> None:
        steps = int(made.token_mask[position].sum())
        ids = made.tokens[position, :steps].tolist()
        assert made.probabilities is not None
        values = made.probabilities[position, :steps].tolist()
        outcome.text = self.tokenizer.decode(ids, skip_special_tokens=True)
        cut = _first_stop(outcome.text, item.row.stop)
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
            self._fill_logprobs(outcome.steps, logprobs)

    def _fill_logprobs(self, steps: Sequence[GenerationStepOutcome], logprobs: _RowLogprobs) -> None:
        """Each step's log-probability, decoded text and most probable tokens (``logprobs``)."""
        for step, chosen, top in zip(steps, logprobs.chosen, logprobs.top, strict=True):
            step.logprob = chosen
            step.text = self._decoded(step.token_id)
            step.bytes = self._bytes(step.token, step.text)
            ids = [token for token, _ in top]
            pieces = [str(piece) for piece in self.tokenizer.convert_ids_to_tokens(ids)]
            texts = [self._decoded(token) for token in ids]
            step.top = [
                TopToken(piece, token, text, value, self._bytes(piece, text))
                for piece, text, (token, value) in zip(pieces, texts, top, strict=True)
            ]

    def _decoded(self, token: int) -> str:
        """One token's text as an OpenAI-style ``logprobs`` entry shows it: decoded alone, special tokens kept."""
        return str(self.tokenizer.decode([token], skip_special_tokens=False))

    def _bytes(self, piece: str, text: str) -> list[int]:
        """A token's bytes: a byte-level BPE piece's own bytes (a piece of a character split over tokens included,
        which decodes alone to U+FFFD), a byte-fallback piece's (``<0xE2>``) byte, else its decoded text's UTF-8."""
        fallback = _BYTE_PIECE.fullmatch(piece)
        if fallback is not None:
            return [int(fallback.group(1), 16)]
        decoder = self.byte_decoder
        if decoder is not None and piece not in self.special_pieces and all(c in decoder for c in piece):
            return [decoder[character] for character in piece]
        return list(text.encode("utf-8"))

    def _explain(
        self, prepared: Sequence[_Prepared], made: Continuation, outcomes: list[GenerationOutcome]
    ) -> tuple[float, float]:
        """Explain the rows that ask, one group per (method, options, target kind); returns forward and backward
        seconds summed over the groups."""
        groups: dict[tuple[Any, ...], list[_Member]] = {}
        for position, item in enumerate(prepared):
            ask = item.row.ask
            if ask is None or outcomes[item.index].error is not None:
                continue
            try:
                member = self._member(position, item, ask, made, len(outcomes[item.index].text))
            except ExplainError as error:
                outcomes[item.index].error = from_explain_error(error)
                continue
            if member.spans is not None:
                kind: tuple[Any, ...] = ("spans",)
            elif isinstance(member.steps, StepSum):
                kind = ("sum", member.steps.start, member.steps.stop)
            else:
                kind = ("steps",)
            key = (ask.method, tuple(sorted(ask.options.items())), kind, member.foils is not None, item.row.deadline)
            groups.setdefault(key, []).append(member)
        forward = backward = 0.0
        for (method, options, kind, contrasted, deadline), members in groups.items():
            positions = [member.position for member in members]
            subset = made.rows(positions)
            try:
                if kind[0] == "spans":
                    result: Any = self._explain_spans(subset, members, method, dict(options), deadline)
                else:
                    result = self._explain_steps(subset, members, method, dict(options), kind, contrasted, deadline)
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
            timings = result.seconds if result is not None else {}
            forward += float(timings.get("forward", 0.0))
            backward += float(timings.get("backward", 0.0))
            seconds = float(timings.get("attribution", 0.0))
            for offset, member in enumerate(members):
                outcome = outcomes[prepared[member.position].index]
                self._fill_explanation(outcome, method, result, offset, member, seconds)
        return forward, backward

    def _member(self, position: int, item: _Prepared, ask: GenerationAsk, made: Continuation, length: int) -> _Member:
        """A row's share of its group: its steps or spans, foils, and its context units (``length``: the characters
        of the row's answer text; fewer than its tokens decode to when a stop sequence cut it).

        Raises:
            ExplainError: for steps, foils or a span that do not fit the row's answer.
        """
        row_steps = int(made.token_mask[position].sum())
        ids = made.tokens[position, :row_steps].tolist()
        answer, offsets = _clipped(*decoded_offsets(self.tokenizer, ids), length)
        context = row_context(
            item.rendered,
            self._texts(item.prompt_ids),
            answer,
            offsets,
            self._texts(ids),
            ask.granularity,
            len(item.row.documents),
        )
        if _explains_spans(ask, item.row):
            if ask.span is None:
                return _Member(position, None, None, context, sentence_spans(answer, offsets), SENTENCES)
            start, end = ask.span
            steps = span_steps(answer, offsets, start, end)
            return _Member(position, None, None, context, [AnswerSpan(answer[start:end], start, end, steps)], "span")
        resolved = resolve_steps(ask.steps if not isinstance(ask.steps, str) else None, row_steps)
        foils = item.foils
        if foils is not None and len(foils) not in (1, row_steps):
            raise InvalidTargetError(
                f"contrast has {len(foils)} foils for {row_steps} steps: give one for every step or one each"
            )
        return _Member(position, resolved, foils, context)

    def _texts(self, ids: Sequence[int]) -> list[str]:
        """Each token decoded on its own (a unit's text where the token has no character offsets: a BOS, an EOS, or
        every token of a slow tokenizer), never a ``Ġ``/``▁`` piece."""
        return [str(self.tokenizer.decode([token])) for token in ids]

    def _explain_spans(
        self,
        subset: Continuation,
        members: Sequence[_Member],
        method: str,
        options: dict[str, Any],
        deadline: Deadline | None,
    ) -> SpanExplanation | None:
        """One forward for every span of the group's rows (``None`` when no row has a sentence to explain)."""
        spans = [[span.steps for span in member.spans or []] for member in members]
        if not any(spans):
            return None
        return explain_spans(self.model, subset, spans, method=method, options=options, deadline=deadline)

    def _explain_steps(
        self,
        subset: Continuation,
        members: Sequence[_Member],
        method: str,
        options: dict[str, Any],
        kind: tuple[Any, ...],
        contrasted: bool,
        deadline: Deadline | None,
    ) -> Any:
        """One forward for the group's steps (or sums), the rows' own steps and foils as ``wanted`` and foil ids."""
        total = subset.steps
        device = subset.tokens.device
        wanted = torch.zeros((len(members), total), dtype=torch.bool, device=device)
        foil_ids = torch.full((len(members), total), -1, dtype=torch.long, device=device)
        for offset, member in enumerate(members):
            if isinstance(member.steps, StepSum):
                wanted[offset] = True
            else:
                wanted[offset, list(member.steps or ())] = True
            if member.foils is not None:
                count = int(subset.token_mask[offset].sum())
                repeated = member.foils * (count if len(member.foils) == 1 else 1)
                foil_ids[offset, :count] = torch.tensor(repeated[:count], device=device)
        summed = StepSum(kind[1], kind[2]) if kind[0] == "sum" else None
        return explain_continuation(
            self.model,
            subset,
            method=method,
            steps=summed,
            contrast=foil_ids if contrasted else None,
            options=options,
            wanted=wanted,
            deadline=deadline,
        )

    def _fill_explanation(
        self, outcome: GenerationOutcome, method: str, result: Any, offset: int, member: _Member, seconds: float
    ) -> None:
        if result is not None and not bool(torch.isfinite(result.scores[offset].float()).all()):
            outcome.error = RowError(
                "attribution_failed", f"method {result.method!r} gave NaN or infinite scores for this row"
            )
            return
        context = member.context
        outcome.method = method if result is None else result.method
        outcome.options = {} if result is None else dict(result.options)
        outcome.attribution_seconds = seconds
        outcome.granularity = context.granularity
        outcome.context = list(context.described)
        if member.spans is not None:
            for index, span in enumerate(member.spans):
                token_scores = result.context_scores(offset, index).float().cpu()
                span.scores = context.scores(token_scores)
                span.value = float(result.values[offset, index])
                span.documents = context.cite(token_scores) if context.documents else None
            if member.mode == SENTENCES:
                outcome.sentences = member.spans
            else:
                outcome.span = member.spans[0]
            return
        steps = member.steps
        if isinstance(steps, StepSum):
            start, stop = steps.span(int(result.generated_mask[offset].sum()))
            outcome.summed = (start, stop)
            outcome.sum_scores = context.scores(result.context_scores(offset, 0).float().cpu())
            outcome.sum_value = float(result.values[offset, 0])
            return
        for step in steps or ():
            entry = outcome.steps[step]
            entry.explained = True
            entry.scores = context.scores(result.context_scores(offset, step).float().cpu())
            entry.value = float(result.values[offset, step])
            if result.contrast is not None and int(result.contrast[offset, step]) >= 0:
                entry.foil_id = int(result.contrast[offset, step])
                entry.foil = str(self.tokenizer.convert_ids_to_tokens(entry.foil_id))


@dataclass
class _Member:
    """A row's share of its explanation group.

    Attributes:
        position: the row's position among the prepared rows.
        steps: its steps (indices, or a sum); ``None`` for spans.
        foils: its foil ids, if any.
        context: its context units.
        spans: its sentences (or the one span asked for), when it explains spans of its answer.
        mode: ``sentences`` or ``span``.
    """

    position: int
    steps: tuple[int, ...] | StepSum | None
    foils: list[int] | None
    context: RowContext
    spans: list[AnswerSpan] | None = None
    mode: str = ""


def _until_eos(tokens: Sequence[int], eos: frozenset[int]) -> list[int]:
    """The tokens up to and including the first EOS."""
    kept: list[int] = []
    for token in tokens:
        kept.append(int(token))
        if token in eos:
            break
    return kept


@dataclass(frozen=True)
class _RowLogprobs:
    """One row's log-probabilities: per step, the chosen token's and ``(token id, log-probability)`` of the most
    probable tokens."""

    chosen: list[float]
    top: list[list[tuple[int, float]]]


def _row_logprobs(
    recorded: StepLogprobs | None, offset: int, real: torch.Tensor, asked: int | None
) -> _RowLogprobs | None:
    """Row ``offset``'s share of a batch's :class:`StepLogprobs` (its real steps, ``asked`` alternatives each);
    ``None`` when the row did not ask."""
    if asked is None or recorded is None:
        return None
    chosen = recorded.chosen[offset][real].tolist()
    ids = recorded.top_ids[offset][real][:, :asked].tolist()
    values = recorded.top_values[offset][real][:, :asked].tolist()
    top = [list(zip(step_ids, step_values, strict=True)) for step_ids, step_values in zip(ids, values, strict=True)]
    return _RowLogprobs(chosen, top)


#: A byte-fallback piece of a SentencePiece vocabulary (``<0xE2>``).
_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def byte_level_decoder(tokenizer: Any) -> dict[str, int] | None:
    """The character → byte map of a byte-level BPE tokenizer (GPT-2's ``bytes_to_unicode``, inverted: its pieces
    spell bytes with printable characters), or ``None`` when the tokenizer's decoder is not byte-level."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    try:
        decoder = json.loads(backend.to_str()).get("decoder") if backend is not None else None
    except (AttributeError, ValueError):
        return None
    kinds = [decoder, *(decoder.get("decoders") or [])] if isinstance(decoder, dict) else []
    if not any(isinstance(kind, dict) and kind.get("type") == "ByteLevel" for kind in kinds):
        return None
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    codes = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            codes.append(256 + extra)
            extra += 1
    return {chr(code): byte for byte, code in zip(printable, codes, strict=True)}


def _first_stop(text: str, stops: Sequence[str]) -> tuple[int, str] | None:
    """Where the first of ``stops`` starts in ``text`` and which it is (the longest of those starting there), or
    ``None``."""
    found = [(text.find(stop), -len(stop), stop) for stop in stops if stop in text]
    if not found:
        return None
    start, _, stop = min(found)
    return start, stop


def _clipped(
    text: str, offsets: Sequence[tuple[int, int] | None], length: int
) -> tuple[str, list[tuple[int, int] | None]]:
    """The answer text cut to its first ``length`` characters, and the tokens' offsets in it (a token with no
    character left, one of a stop sequence, has none, as an EOS)."""
    if length >= len(text):
        return text, list(offsets)
    kept: list[tuple[int, int] | None] = []
    for offset in offsets:
        kept.append(None if offset is None or offset[0] >= length else (offset[0], min(offset[1], length)))
    return text[:length], kept
