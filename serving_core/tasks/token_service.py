"""The token classification service (handler task ``token_classification``): entities with character offsets
and, when a row asks, each entity's attribution.

The service loads the checkpoint as every task does (:mod:`serving_core.loading`: local safetensors, the library's
default attention, the tokenizer, the labels checked against ``handler.labels``) and serves a batch row by row: each
valid row is tokenized with character offsets, the rows are grouped by the library's planner
(:func:`explainers.group_rows`) by what they ask (prediction only, or a method with its options, every entity
explained) and their deadline, and each group is one call of :func:`explainers.explain_tokens` (or
:func:`explainers.predict_tokens`): one forward for the group's rows, the gradient methods' products batched over its
entities. A row whose request is invalid (method, option, an input a token classifier does not take) gets its own
error; the others are served. Each group's pass is a ``forward`` stage of the batch span
(:func:`serving_core.tracing.stage`).

Time (docs/SERVING.md, "Time budgets and deadlines"): with a ``time_budget_s`` each explained row is estimated before
any work (:mod:`explainers.timing`) for as many entities as it has real tokens, at most; a row over the budget at that
bound has its entities counted by a prediction forward of its group first and is estimated again for them, then
refused with ``over_time_budget`` if it still does not fit (its group explains the counted entities, the same spans).
Rows with a deadline (``explain.deadline_ms``) are grouped by it, and their group's work is abandoned between chunks
of entities once it passes (``deadline_exceeded``).
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from explainers import (
    ExplainError,
    GroupKey,
    ModelSpeed,
    ServedSpeed,
    Span,
    TimeBudgetError,
    TokenExplanation,
    TokenPrediction,
    available_methods,
    check_method,
    check_time_budget,
    describe,
    explain_tokens,
    get_method,
    group_rows,
    label_scheme,
    predict_tokens,
    prediction_seconds,
    supported_methods,
    unit_scores,
    work_kind,
)

from .. import tracing
from ..config import HandlerConfig
from ..errors import RowError, from_explain_error
from ..loading import autocast, load_classifier, load_tokenizer
from ..task import BatchTimings
from ..wire import Encoding
from .classify_schema import DecodedRow
from .in_memory import InMemory
from .text_units import text_units
from .token_schema import EntityOutcome, TokenOutcome

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Encoded:
    """One tokenized row: model inputs (unpadded), character offsets, special-token flags and truncation."""

    inputs: dict[str, list[int]]
    offsets: list[tuple[int, int]]
    special: list[bool]
    truncated: bool


class TokenClassificationService:
    """One loaded token classifier and its tokenizer."""

    head_type = "token_classification"

    def __init__(self, config: HandlerConfig, model_dir: Path, device: torch.device) -> None:
        """Load the checkpoint (:mod:`serving_core.loading`) with the library's default attention.

        Raises:
            ValueError: if the checkpoint's labels disagree with ``config.labels`` or its tokenizer gives no
                character offsets (a "fast" tokenizer, ``tokenizer.json``, is needed).
        """
        self.config = config
        self.device = device
        self.model = load_classifier(config, model_dir, device)
        self.tokenizer = load_tokenizer(model_dir, self.model, config.pad_token_id)
        accepted = inspect.signature(self.model.forward).parameters
        self.input_names = tuple(name for name in ("input_ids", "attention_mask", "token_type_ids") if name in accepted)
        if not getattr(self.tokenizer, "is_fast", False):
            raise ValueError(
                f"the tokenizer in {model_dir} is not a fast tokenizer (no tokenizer.json): a token classifier's "
                "entities are answered with character offsets, which only fast tokenizers give"
            )
        self.scheme = label_scheme(config.labels)
        self.arch = describe(self.model)
        self.served: ServedSpeed | None = None
        if config.time_budget_s is not None:  # probed on the loaded model and its device; then served batches
            self.served = ServedSpeed(self._probe(), measure=self._probe)
        self.alternatives = supported_methods(self.arch.model_type, self.arch.task)
        logger.info(
            "loaded token classifier from %s on %s; time budget %s s, speed %s",
            model_dir, device, config.time_budget_s, self.speed,
        )  # fmt: skip

    def _probe(self) -> ModelSpeed:
        """The model's speed, measured now (:meth:`explainers.ModelSpeed.measure`, at ``max_length``)."""
        with autocast(self.config, self.device):
            return ModelSpeed.measure(self.model, self.arch, self.config.max_length)

    @property
    def speed(self) -> ModelSpeed | None:
        """The speed probed at load (``None``: no time budget); :attr:`served` corrects it by the batches served."""
        return None if self.served is None else self.served.probe

    @speed.setter
    def speed(self, value: ModelSpeed | None) -> None:
        """Set a speed by hand: estimates then use it as given, not corrected by served batches."""
        self.served = None if value is None else ServedSpeed(value, learns=False)

    def _encode(self, text: str) -> _Encoded:
        """One row tokenized (unpadded), with its character offsets and special-token flags."""
        return self._encode_all([text])[0]

    def _encode_all(self, texts: Sequence[str]) -> list[_Encoded]:
        """Rows tokenized as :meth:`_encode` tokenizes each: in one call of the tokenizer for the non-empty ones."""
        if not texts:
            return []
        if not all(texts):  # an empty text alone (the tokenizer's one-text path), the others together
            together = iter(self._encode_all([text for text in texts if text]))
            return [next(together) if text else self._encode_one(text) for text in texts]
        encoded = self.tokenizer(
            list(texts),
            truncation=True,
            max_length=self.config.max_length,
            return_offsets_mapping=True,
            return_special_tokens_mask=True,
        )
        names = [name for name in self.input_names if name in encoded]
        rows = []
        for index, encoding in enumerate(encoded.encodings):
            special = [bool(flag) for flag in encoded["special_tokens_mask"][index]]
            offsets = [
                (0, 0) if flag else (int(start), int(end))
                for (start, end), flag in zip(encoded["offset_mapping"][index], special, strict=True)
            ]
            inputs = {name: list(encoded[name][index]) for name in names}
            inputs["special_tokens_mask"] = [int(flag) for flag in special]
            rows.append(_Encoded(inputs, offsets, special, bool(encoding.overflowing)))
        return rows

    def _encode_one(self, text: str) -> _Encoded:
        encoded = self.tokenizer(
            text,
            truncation=True,
            max_length=self.config.max_length,
            return_offsets_mapping=True,
            return_special_tokens_mask=True,
        )
        offsets = [(int(start), int(end)) for start, end in encoded["offset_mapping"]]
        special = [bool(flag) for flag in encoded["special_tokens_mask"]]
        offsets = [(0, 0) if flag else offset for offset, flag in zip(offsets, special, strict=True)]
        inputs = {name: list(encoded[name]) for name in self.input_names if name in encoded}
        inputs["special_tokens_mask"] = [int(flag) for flag in special]
        return _Encoded(inputs, offsets, special, bool(encoded.encodings[0].overflowing))

    def _group_key(self, row: DecodedRow) -> GroupKey:
        """The group key of a row: its method (``None``: a prediction) and resolved options, every entity explained,
        its deadline.

        Raises:
            RowError: for an input or a request a token classifier does not take.
            ExplainError: for an unknown or refused method or a bad option.
        """
        if row.text_pair is not None:
            raise RowError("invalid_request", "a token classifier tags one text: send 'text' alone (no 'text_pair')")
        request = row.request
        if request.target is not None:
            raise RowError(
                "invalid_target",
                "a token classifier explains each entity it finds for the entity's own label: 'target' is for "
                "sequence classifiers; leave it out",
            )
        if request.below is not None:
            raise RowError(
                "invalid_request",
                "explain when unsure ('below') is for sequence classifiers: a token classifier explains every entity "
                "it finds (leave 'below' out, or set it to null)",
            )
        if request.method is None:
            return GroupKey.of(None, {}, "entities", deadline=request.deadline)
        method = get_method(request.method)
        check_method(self.arch.model_type, method.name, available_methods(), self.arch.task)
        options = method.resolve_options(request.options, self.arch)
        return GroupKey.of(method.name, options, "entities", deadline=request.deadline)

    def run(
        self, rows: Sequence[DecodedRow | RowError], encodings: Sequence[Encoding]
    ) -> tuple[list[TokenOutcome], BatchTimings]:
        """Serve a batch: one :class:`TokenOutcome` per row, in order, and the summed stage timings of its groups."""
        outcomes = [TokenOutcome(encoding=encoding) for encoding in encodings]
        keys: dict[int, GroupKey] = {}
        texts: dict[int, str] = {}
        for index, row in enumerate(rows):
            outcome = outcomes[index]
            if isinstance(row, RowError):
                outcome.error = row
                continue
            try:
                key = self._group_key(row)
            except RowError as error:
                outcome.error = error
                continue
            except ExplainError as error:
                outcome.error = from_explain_error(error)
                outcome.method = row.request.method
                continue
            keys[index] = key
            texts[index] = row.text or ""
        encoded = dict(zip(texts, self._encode_all(list(texts.values())), strict=True))  # one tokenizer call
        groups = group_rows(keys)
        admitted = _Admission(self, encoded)
        for group in groups:
            if group.key.method is None:
                admitted.predictions(group.rows)
        forward = backward = 0.0
        started, ran = time.perf_counter(), True
        for group in groups:
            key, indices, deadline = group.key, list(group.rows), group.key.deadline
            spans: dict[int, list[Span]] | None = None
            if key.method is not None:
                spans = admitted.explained(key, indices, outcomes)
                indices = [index for index in indices if outcomes[index].error is None]
                if not indices:
                    continue
            batch = self.tokenizer.pad([encoded[index].inputs for index in indices], padding=True, return_tensors="pt")
            inputs = {name: batch[name] for name in (*self.input_names, "special_tokens_mask") if name in batch}
            try:
                if deadline is not None:
                    deadline.check("any work")
                stage = {"explain.method": key.method or "none", "explain.batch_rows": len(indices)}
                with tracing.stage("forward", stage), autocast(self.config, self.device):
                    if key.method is None:
                        result: TokenPrediction = predict_tokens(self.model, inputs)
                    else:
                        options: dict[str, Any] = dict(key.options)
                        positions = None if spans is None else [spans[index] for index in indices]
                        result = explain_tokens(
                            self.model, inputs, method=key.method, positions=positions, deadline=deadline, **options
                        )
            except ExplainError as error:  # the deadline passed: the group's rows answer it, the others are served
                ran = False
                for index in indices:
                    outcomes[index].error = from_explain_error(error)
                    outcomes[index].method = key.method
                continue
            except Exception:
                ran = False
                logger.exception("group of %d rows failed", len(indices))
                for index in indices:
                    outcomes[index].error = RowError("internal", "the batch failed on the server; see the server log")
                continue
            if isinstance(result, TokenExplanation):
                forward += float(result.seconds.get("forward", 0.0))
                backward += float(result.seconds.get("backward", 0.0))
            for position, index in enumerate(indices):
                row = rows[index]
                assert isinstance(row, DecodedRow)
                self._fill(outcomes[index], row.text or "", encoded[index], result, position)
                if row.granularity != "token" and outcomes[index].method is not None and outcomes[index].error is None:
                    self._fill_units(outcomes[index], row.text or "", encoded[index], row.granularity)
        if ran and admitted.ledger is not None:  # every admitted row's work was done: a measure of the model's speed
            admitted.ledger.settle(time.perf_counter() - started)
        return outcomes, BatchTimings(forward, backward)

    def predicted_spans(self, encoded: Sequence[_Encoded]) -> list[list[Span]]:
        """The entities a prediction forward finds in rows (to count them before they are explained)."""
        batch = self.tokenizer.pad([item.inputs for item in encoded], padding=True, return_tensors="pt")
        inputs = {name: batch[name] for name in (*self.input_names, "special_tokens_mask") if name in batch}
        with autocast(self.config, self.device):
            return predict_tokens(self.model, inputs).spans

    def _fill_units(self, outcome: TokenOutcome, text: str, encoded: _Encoded, granularity: str) -> None:
        """Each entity's scores summed into the text's words or sentences (the answer's ``context``; sentences: the
        scores over the tokens kept in memory, :attr:`EntityOutcome.token_scores`)."""
        offsets = [None if flag else offset for offset, flag in zip(encoded.offsets, encoded.special, strict=True)]
        sequences = [None if flag else 0 for flag in encoded.special]
        units, described = text_units(text, None, offsets, sequences, outcome.tokens or [], granularity)
        outcome.granularity = granularity
        outcome.context = described
        kept = granularity == "sentence"  # a sentence's score cannot be split into words: the monitor's tokens
        outcome.entities = [
            replace(
                entity,
                scores=[float(v) for v in unit_scores(torch.tensor(entity.scores), units)],
                token_scores=InMemory(entity.scores) if kept else None,
            )
            if entity.scores is not None
            else entity
            for entity in outcome.entities
        ]

    def _fill(
        self, outcome: TokenOutcome, text: str, encoded: _Encoded, result: TokenPrediction, position: int
    ) -> None:
        length = len(encoded.offsets)
        ids = encoded.inputs["input_ids"]
        outcome.scheme = result.scheme
        outcome.tokens = self.tokenizer.convert_ids_to_tokens(ids)
        outcome.special_tokens = encoded.special
        outcome.offsets = encoded.offsets
        outcome.truncated = encoded.truncated
        explained = isinstance(result, TokenExplanation)
        row_scores: torch.Tensor | None = None
        if isinstance(result, TokenExplanation):
            row_scores = result.scores[position, :, :length].float().cpu()
            if not bool(torch.isfinite(row_scores).all()):
                outcome.error = RowError(
                    "attribution_failed",
                    f"method {result.method!r} gave NaN or infinite scores for this input (a numerical breakdown of "
                    "the attribution; the other rows are unaffected); another method may still explain it",
                )
                outcome.method = result.method
                return
            outcome.method = result.method
            outcome.options = dict(result.options)
            outcome.attribution_seconds = float(result.seconds.get("attribution", 0.0))
        for number, (span, score) in enumerate(zip(result.spans[position], result.span_scores[position], strict=True)):
            start, end, label = span
            first, last = encoded.offsets[start][0], encoded.offsets[end - 1][1]
            tag = self.scheme.tags[label]
            outcome.entities.append(
                EntityOutcome(
                    text=text[first:last],
                    label=tag.type or tag.name,
                    tag=tag.name,
                    label_id=label,
                    start=first,
                    end=last,
                    token_start=start,
                    token_end=end,
                    score=score,
                    scores=row_scores[number].tolist() if explained and row_scores is not None else None,
                )
            )


class _Admission:
    """A batch's rows admitted against the model's time budget, in order: the predictions first, then each explained
    row (``time_budget_s`` ``None``: every row is admitted)."""

    def __init__(self, service: TokenClassificationService, encoded: Mapping[int, _Encoded]) -> None:
        self.service = service
        self.encoded = encoded
        self.seconds = 0.0
        #: the speeds the batch is admitted at, and its estimates (``None``: no time budget)
        self.ledger = None if service.served is None else service.served.ledger()

    def predictions(self, indices: Sequence[int]) -> None:
        """Count the prediction-only rows."""
        if self.ledger is not None:
            for index in indices:
                length = len(self.encoded[index].offsets)
                seconds = prediction_seconds(self.ledger.speed(ServedSpeed.PREDICT, length), length)
                self.ledger.add(ServedSpeed.PREDICT, seconds, length)
                self.seconds += seconds

    def explained(
        self, key: GroupKey, indices: Sequence[int], outcomes: Sequence[TokenOutcome]
    ) -> dict[int, list[Span]] | None:
        """Admit a group's explained rows (``key``: its method, options and deadline), each estimated for at most one
        entity per real token, and where that is over the budget for the entities a prediction forward counts; a row
        that does not fit gets ``over_time_budget``. Returns the counted spans of the group's rows (``None``: nothing
        was counted)."""
        service = self.service
        budget, ledger = service.config.time_budget_s, self.ledger
        if budget is None or ledger is None:
            return None
        assert key.method is not None
        method = get_method(key.method)
        options = dict(key.options)
        kind = work_kind(method.name, options)
        deadline = key.deadline
        unsure: list[int] = []
        for index in indices:
            item = self.encoded[index]
            bound = max(sum(not flag for flag in item.special), 1)
            length = len(item.offsets)
            try:
                seconds = check_time_budget(
                    ledger.speed(kind, length), method, length, options, budget, (), self.seconds, targets=bound
                )
            except TimeBudgetError:
                unsure.append(index)
                continue
            self.seconds += seconds
            ledger.add(kind, seconds, length)
        if not unsure:
            return None
        if deadline is not None and deadline.passed:
            return None  # the group answers deadline_exceeded without work
        counted = dict(zip(indices, self.service.predicted_spans([self.encoded[i] for i in indices]), strict=True))
        for index in unsure:
            item = self.encoded[index]
            length = len(item.offsets)
            arguments = (method, length, options, budget, service.alternatives, self.seconds)
            targets = max(len(counted[index]), 1)
            try:
                try:
                    seconds = check_time_budget(ledger.speed(kind, length), *arguments, targets=targets)
                except TimeBudgetError as error:  # over the budget alone: a probe no batch corrected may be stale
                    if error.beside or service.served is None or not service.served.recheck(kind):
                        raise
                    seconds = check_time_budget(ledger.speed(kind, length), *arguments, targets=targets)
            except TimeBudgetError as error:
                outcomes[index].error = from_explain_error(error)
                outcomes[index].method = method.name
                continue
            self.seconds += seconds
            ledger.add(kind, seconds, length)
        return counted
