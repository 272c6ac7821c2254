"""The serving core of token classifiers (handler task ``token_classification``): entities with character offsets
and, when a row asks, each entity's attribution.

The service loads the checkpoint as :class:`~handlers.service.ExplanationService` does (local safetensors, the
library's default attention, the tokenizer, the labels checked against ``handler.labels``) and serves a batch row by
row: each valid row is tokenized with character offsets, the rows are grouped by what they ask (prediction only, or
a method with its options) and each group is one call of :func:`explainers.explain_tokens` (or
:func:`explainers.predict_tokens`): one forward for the group's rows, the gradient methods' products batched over its
entities. A row whose request is invalid (method, option, an input a token classifier does not take) gets its own
error; the others are served.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from explainers import (
    ExplainError,
    TokenExplanation,
    TokenPrediction,
    available_methods,
    describe,
    explain_tokens,
    get_method,
    predict_tokens,
)
from explainers.architectures.support import check_method
from explainers.tasks.tagging import label_scheme

from .config import HandlerConfig
from .errors import RowError, from_explain_error
from .schema import DecodedRow, Encoding, RowOutcome, encode_outcome
from .service import BatchTimings, ExplanationService

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EntityOutcome:
    """One entity of a row's answer.

    Attributes:
        text: ``text[start:end]``.
        label: the entity type (``PER`` for a span tagged ``B-PER I-PER``; the tag itself without a scheme).
        tag: the label of the span's first token, as ``id2label`` spells it.
        label_id: that label's index.
        start, end: character offsets into the text (``end`` exclusive).
        token_start, token_end: token positions (``end`` exclusive).
        score: the mean over its tokens of the probability of each token's tag.
        scores: its attribution over the row's tokens (``None`` when no explanation was asked).
    """

    text: str
    label: str
    tag: str
    label_id: int
    start: int
    end: int
    token_start: int
    token_end: int
    score: float
    scores: list[float] | None = None


@dataclass
class TokenOutcome(RowOutcome):
    """A token classifier's outcome for one row: the :class:`~handlers.schema.RowOutcome` fields it shares (error,
    tokens, special tokens, truncation, method, options, attribution seconds) and its entities."""

    scheme: str = ""
    offsets: list[tuple[int, int]] | None = None
    entities: list[EntityOutcome] = field(default_factory=list)


@dataclass(frozen=True)
class _Encoded:
    """One tokenized row: model inputs (unpadded), character offsets, special-token flags and truncation."""

    inputs: dict[str, list[int]]
    offsets: list[tuple[int, int]]
    special: list[bool]
    truncated: bool


class TokenClassificationService(ExplanationService):
    """One loaded token classifier and its tokenizer."""

    def __init__(self, config: HandlerConfig, model_dir: Path, device: torch.device) -> None:
        """Load the checkpoint (see :class:`~handlers.service.ExplanationService`).

        Raises:
            ValueError: if the checkpoint's labels disagree with ``config.labels`` or its tokenizer gives no
                character offsets (a "fast" tokenizer, ``tokenizer.json``, is needed).
        """
        super().__init__(config, model_dir, device)
        if not getattr(self.tokenizer, "is_fast", False):
            raise ValueError(
                f"the tokenizer in {model_dir} is not a fast tokenizer (no tokenizer.json): a token classifier's "
                "entities are answered with character offsets, which only fast tokenizers give"
            )
        self.scheme = label_scheme(config.labels)
        self.arch = describe(self.model)

    def _encode(self, text: str) -> _Encoded:
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

    def _request_key(self, row: DecodedRow) -> tuple[str, tuple[tuple[str, int], ...]] | None:
        """The group of a row: ``None`` for a prediction, else its method and resolved options.

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
            return None
        method = get_method(request.method)
        check_method(self.arch.model_type, method.name, available_methods(), self.arch.task)
        options = method.resolve_options(request.options, self.arch)
        return method.name, tuple(sorted(options.items()))

    def run(
        self, rows: Sequence[DecodedRow | RowError], encodings: Sequence[Encoding]
    ) -> tuple[list[RowOutcome], BatchTimings]:
        """Serve a batch: one :class:`TokenOutcome` per row, in order, and the summed stage timings of its groups."""
        outcomes: list[RowOutcome] = [TokenOutcome(encoding=encoding) for encoding in encodings]
        groups: dict[tuple[str, tuple[tuple[str, int], ...]] | None, list[int]] = {}
        encoded: dict[int, _Encoded] = {}
        for index, row in enumerate(rows):
            outcome = outcomes[index]
            if isinstance(row, RowError):
                outcome.error = row
                continue
            try:
                key = self._request_key(row)
            except RowError as error:
                outcome.error = error
                continue
            except ExplainError as error:
                outcome.error = from_explain_error(error)
                outcome.method = row.request.method
                continue
            encoded[index] = self._encode(row.text or "")
            groups.setdefault(key, []).append(index)
        forward = backward = 0.0
        for key, indices in groups.items():
            batch = self.tokenizer.pad([encoded[index].inputs for index in indices], padding=True, return_tensors="pt")
            inputs = {name: batch[name] for name in (*self.input_names, "special_tokens_mask") if name in batch}
            try:
                with self._autocast():
                    if key is None:
                        result: TokenPrediction = predict_tokens(self.model, inputs)
                    else:
                        options: dict[str, Any] = dict(key[1])
                        result = explain_tokens(self.model, inputs, method=key[0], **options)
            except Exception:
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
        return outcomes, BatchTimings(forward, backward)

    def _fill(self, outcome: RowOutcome, text: str, encoded: _Encoded, result: TokenPrediction, position: int) -> None:
        assert isinstance(outcome, TokenOutcome)
        length = len(encoded.offsets)
        ids = encoded.inputs["input_ids"]
        outcome.head_type = "token_classification"
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


def _rounded(value: float) -> float:
    return float(f"{value:.6g}")


def token_outcome_to_dict(outcome: TokenOutcome) -> dict[str, Any]:
    """The JSON document of one token classifier's row (docs/SERVING.md, "Token classification")."""
    if outcome.error is not None:
        return {"error": outcome.error.to_dict()}
    entities = []
    for entity in outcome.entities:
        document: dict[str, Any] = {
            "text": entity.text,
            "label": entity.label,
            "tag": entity.tag,
            "label_id": entity.label_id,
            "start": entity.start,
            "end": entity.end,
            "token_start": entity.token_start,
            "token_end": entity.token_end,
            "score": _rounded(entity.score),
        }
        if entity.scores is not None:
            document["scores"] = [_rounded(value) for value in entity.scores]
        entities.append(document)
    answer: dict[str, Any] = {
        "head_type": "token_classification",
        "scheme": outcome.scheme,
        "entities": entities,
        "tokens": outcome.tokens,
        "special_tokens": outcome.special_tokens,
        "offsets": [list(offset) for offset in outcome.offsets or []],
        "truncated": outcome.truncated,
    }
    if outcome.method is not None:
        answer["explanation"] = {
            "method": outcome.method,
            "options": dict(outcome.options),
            "seconds": round(outcome.attribution_seconds, 6),
        }
    return answer


def encode_token_outcome(outcome: RowOutcome, labels: tuple[str, ...]) -> bytes:
    """Encode one token classifier's row in the encoding its request came in (JSON, or an ``ExplainResponse`` whose
    ``token_classification`` holds the entities)."""
    import json

    from .protos import explain_messages

    if outcome.error is not None:  # an error row is answered as any other task's
        return encode_outcome(outcome, labels)
    assert isinstance(outcome, TokenOutcome)
    if outcome.encoding is Encoding.JSON:
        return json.dumps(token_outcome_to_dict(outcome), separators=(",", ":")).encode("utf-8")
    response = explain_messages().ExplainResponse()
    response.head_type = "token_classification"
    response.truncated = outcome.truncated
    answer = response.token_classification
    answer.scheme = outcome.scheme
    answer.tokens.extend(outcome.tokens or [])
    answer.special_tokens.extend(outcome.special_tokens or [])
    for start, end in outcome.offsets or []:
        answer.offsets.add(start=start, end=end)
    for entity in outcome.entities:
        answer.entities.add(
            text=entity.text,
            label=entity.label,
            tag=entity.tag,
            label_id=entity.label_id,
            start=entity.start,
            end=entity.end,
            token_start=entity.token_start,
            token_end=entity.token_end,
            score=entity.score,
            scores=entity.scores or [],
        )
    if outcome.method is not None:
        answer.method = outcome.method
        for key, value in outcome.options.items():
            answer.options[key] = value
        answer.seconds = outcome.attribution_seconds
    return bytes(response.SerializeToString())
