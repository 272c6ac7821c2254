"""The classification service (tasks ``text`` and ``image``): one loaded classifier, a batch of decoded rows in, one
outcome per row out.

The valid rows of a batch are tokenized (or image-processed) together, then :func:`explainers.explain_batch` runs
one forward for all of them (grad-enabled only for the rows whose method needs it) and each row's method. Rows
that failed to decode, or whose method/target/options are invalid, get their own :class:`~serving_core.errors.RowError`;
the others are served. Nothing per request is kept on the service object. The shared pass is the batch span's
``forward`` stage (:func:`serving_core.tracing.stage`).
"""

from __future__ import annotations

import inspect
import io
import logging
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from PIL import Image
from transformers import AutoImageProcessor

from explainers import (
    ExplainError,
    ModelSpeed,
    RowExplanation,
    RowSkipped,
    ServedSpeed,
    describe,
    explain_batch,
    head_type,
    pooled_position,
    prediction_confidence,
    unit_scores,
)

from .. import tracing
from ..config import DEFAULT_THRESHOLD, HandlerConfig
from ..errors import RowError, from_explain_error
from ..loading import autocast, load_classifier, load_tokenizer
from ..task import BatchTimings
from ..wire import Encoding
from .classify_schema import DecodedRow, RowOutcome
from .in_memory import InMemory
from .text_units import text_units

logger = logging.getLogger(__name__)


class ExplanationService:
    """One loaded classifier and its tokenizer or image processor."""

    def __init__(self, config: HandlerConfig, model_dir: Path, device: torch.device) -> None:
        """Load the checkpoint from ``model_dir`` (eval mode) onto ``device``, with the library's default attention:
        ``sdpa`` where the architecture has it, so that the gradient methods run on it; the map methods switch to
        the architecture's eager attention for their pass (``explainers.explain_batch``).

        Raises:
            ValueError: if the checkpoint's labels disagree with ``config.labels``.
        """
        self.config = config
        self.device = device
        self.model = load_classifier(config, model_dir, device)
        self.head_type = head_type(self.model)
        self.pooled = pooled_position(self.model)
        self.threshold = config.threshold if config.threshold is not None else DEFAULT_THRESHOLD
        self.tokenizer: Any = None
        self.processor: Any = None
        if config.input_kind == "text":
            self.tokenizer = load_tokenizer(model_dir, self.model, config.pad_token_id)
            self.special_ids = frozenset(int(i) for i in self.tokenizer.all_special_ids)
            accepted = inspect.signature(self.model.forward).parameters
            self.input_names = tuple(
                name for name in ("input_ids", "attention_mask", "token_type_ids") if name in accepted
            )
        else:
            self.processor = AutoImageProcessor.from_pretrained(str(model_dir), local_files_only=True)
        self.served: ServedSpeed | None = None
        if config.time_budget_s is not None:  # probed on the loaded model and its device; then served batches
            self.served = ServedSpeed(self._probe(), measure=self._probe)
        logger.info(
            "loaded %s model (%s head) from %s on %s; time budget %s s, speed %s",
            config.task, self.head_type, model_dir, device, config.time_budget_s, self.speed,
        )  # fmt: skip

    def _probe(self) -> ModelSpeed:
        """The model's speed, measured now (:meth:`explainers.ModelSpeed.measure`, at ``max_length``)."""
        with autocast(self.config, self.device):
            return ModelSpeed.measure(self.model, describe(self.model), self.config.max_length)

    @property
    def speed(self) -> ModelSpeed | None:
        """The speed probed at load (``None``: no time budget); :attr:`served` corrects it by the batches served."""
        return None if self.served is None else self.served.probe

    @speed.setter
    def speed(self, value: ModelSpeed | None) -> None:
        """Set a speed by hand: estimates then use it as given, not corrected by served batches."""
        self.served = None if value is None else ServedSpeed(value, learns=False)

    def _text_inputs(
        self, texts: Sequence[str], pairs: Sequence[str | None]
    ) -> tuple[dict[str, torch.Tensor], list[bool], list[list[int] | None]]:
        """Tokenize the rows (a text, or a text and its pair) into one batch, padded on the tokenizer's padding side:
        one call of a fast tokenizer for the whole batch when its rows are all texts or all pairs (none empty), else
        each row tokenized alone and the rows padded together (the same ids, masks and segments either way).

        Returns:
            The model inputs, whether each row was truncated, and each pair row's segment per token
            (0 text, 1 text_pair, -1 special token; ``None`` for a single text).
        """
        alone = all(pair is None for pair in pairs)
        if getattr(self.tokenizer, "is_fast", False) and all(texts) and (alone or all(pairs)):
            return self._text_inputs_together(texts, None if alone else pairs)  # (an empty pair is no pair alone)
        rows: list[dict[str, list[int]]] = []
        truncated: list[bool] = []
        segments: list[list[int] | None] = []
        limit = self.config.max_length
        for text, pair in zip(texts, pairs, strict=True):
            encoded = self.tokenizer(text, pair, truncation=True, max_length=limit)
            ids = encoded["input_ids"]
            encodings = getattr(encoded, "encodings", None)
            if encodings:
                truncated.append(bool(encodings[0].overflowing))
            else:  # a tokenizer without a Rust backend: tokenize again untruncated only when it may have cut
                truncated.append(len(ids) >= limit and len(self.tokenizer(text, pair)["input_ids"]) > limit)
            if pair is None:
                segments.append(None)
            else:
                sequence_ids = encoded.sequence_ids(0) if encodings else [None] * len(ids)
                segments.append([-1 if sequence is None else int(sequence) for sequence in sequence_ids])
            rows.append({name: encoded[name] for name in self.input_names if name in encoded})
        batch = self.tokenizer.pad(rows, padding=True, return_tensors="pt")
        return {name: batch[name] for name in self.input_names if name in batch}, truncated, segments

    def _text_inputs_together(
        self, texts: Sequence[str], pairs: Sequence[str | None] | None
    ) -> tuple[dict[str, torch.Tensor], list[bool], list[list[int] | None]]:
        """:meth:`_text_inputs` of a fast tokenizer's rows, all texts (``pairs`` ``None``) or all pairs, in one call."""
        second = list(pairs) if pairs is not None else None
        batch = self.tokenizer(
            list(texts), second, truncation=True, max_length=self.config.max_length, padding=True, return_tensors="pt"
        )
        encodings = batch.encodings
        truncated = [bool(encoding.overflowing) for encoding in encodings]
        segments: list[list[int] | None] = [None] * len(encodings)
        if pairs is not None:  # each row's real tokens' segments, its padding left out
            masks = batch["attention_mask"].tolist()
            for index, encoding in enumerate(encodings):
                segments[index] = [
                    -1 if sequence is None else int(sequence)
                    for sequence, real in zip(encoding.sequence_ids, masks[index], strict=True)
                    if real
                ]
        return {name: batch[name] for name in self.input_names if name in batch}, truncated, segments

    def _row_tokens(self, inputs: dict[str, torch.Tensor]) -> list[tuple[list[int], list[str]]]:
        """Each row's real token ids (its padding left out) and their tokens, converted once for the batch."""
        rows = inputs["input_ids"].tolist()
        masks = inputs["attention_mask"].tolist()
        real = [
            [token for token, kept in zip(row, mask, strict=True) if kept]
            for row, mask in zip(rows, masks, strict=True)
        ]
        distinct = sorted({token for ids in real for token in ids})
        tokens = dict(zip(distinct, self.tokenizer.convert_ids_to_tokens(distinct), strict=True))
        return [(ids, [tokens[token] for token in ids]) for ids in real]

    def decode_image(self, data: bytes) -> Image.Image:
        """Decode PNG/JPEG bytes to RGB, bounded in pixels.

        Raises:
            RowError: ``invalid_image`` or ``image_too_large``.
        """
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error", Image.DecompressionBombWarning)
                image = Image.open(io.BytesIO(data))
                if image.format not in ("PNG", "JPEG"):
                    raise RowError("invalid_image", f"unsupported image format {image.format}; send PNG or JPEG")
                if image.width * image.height > self.config.max_image_pixels:
                    raise RowError(
                        "image_too_large",
                        f"image of {image.width}x{image.height} pixels exceeds {self.config.max_image_pixels} pixels",
                    )
                return image.convert("RGB")
        except RowError:
            raise
        except (Image.DecompressionBombWarning, Image.DecompressionBombError):
            raise RowError("image_too_large", "image has too many pixels") from None
        except Exception as error:  # PIL raises many types for corrupt data
            raise RowError("invalid_image", f"cannot decode the image: {type(error).__name__}") from None

    def _image_inputs(self, images: Sequence[Image.Image]) -> dict[str, torch.Tensor]:
        assert self.config.image_size is not None
        height, width = self.config.image_size
        processed = self.processor(images=list(images), size={"height": height, "width": width}, return_tensors="pt")
        return {"pixel_values": processed["pixel_values"]}

    def run(
        self, rows: Sequence[DecodedRow | RowError], encodings: Sequence[Encoding]
    ) -> tuple[list[RowOutcome], BatchTimings]:
        """Serve a batch: one outcome per row, in order.

        Args:
            rows: decoded rows, or the error each undecodable row raised.
            encodings: each row's encoding (for the reply).

        Returns:
            The outcomes and the shared stage timings of the batch.
        """
        outcomes = [RowOutcome(encoding=encoding) for encoding in encodings]
        valid: list[int] = []
        images: list[Image.Image] = []
        for index, row in enumerate(rows):
            if isinstance(row, RowError):
                outcomes[index].error = row
                continue
            if row.image is not None:
                try:
                    images.append(self.decode_image(row.image))
                except RowError as error:
                    outcomes[index].error = error
                    continue
            if row.granularity != "token" and not getattr(self.tokenizer, "is_fast", False):
                outcomes[index].error = RowError(
                    "invalid_option",
                    "words and sentences need a fast tokenizer's character offsets; this model's tokenizer is not "
                    "one (no tokenizer.json): ask for tokens",
                )
                continue
            valid.append(index)
        if not valid:
            return outcomes, BatchTimings(0.0, 0.0)
        decoded = [rows[index] for index in valid]
        truncated = [False] * len(valid)
        segments: list[list[int] | None] = [None] * len(valid)
        if self.config.input_kind == "text":
            texts = [row.text or "" for row in decoded]  # type: ignore[union-attr]
            pairs = [row.text_pair for row in decoded]  # type: ignore[union-attr]
            inputs, truncated, segments = self._text_inputs(texts, pairs)
        else:
            inputs = self._image_inputs(images)
        requests = [row.request for row in decoded]  # type: ignore[union-attr]
        try:
            with tracing.stage("forward", {"explain.batch_rows": len(valid)}), autocast(self.config, self.device):
                result = explain_batch(
                    self.model,
                    inputs,
                    requests,
                    memory_budget_mib=self.config.memory_budget_mib,
                    time_budget_s=self.config.time_budget_s,
                    speed=self.served,
                )
        except Exception:
            logger.exception("batch of %d rows failed", len(valid))
            for index in valid:
                outcomes[index].error = RowError("internal", "the batch failed on the server; see the server log")
            return outcomes, BatchTimings(0.0, 0.0)
        values = result.probabilities.float().cpu()  # softmax, sigmoid or the regression values (head_type)
        row_values, label_ids = values.tolist(), values.argmax(dim=-1).tolist()  # once for the batch
        conditional = any(request.below is not None for request in requests) and self.head_type != "regression"
        confidences = prediction_confidence(result.logits, self.head_type).tolist() if conditional else []
        row_tokens = self._row_tokens(inputs) if "input_ids" in inputs else None  # left or right padding
        for position, index in enumerate(valid):
            outcome = outcomes[index]
            self._fill_prediction(outcome, row_values[position], label_ids[position])
            outcome.truncated = truncated[position]
            if row_tokens is not None:
                ids, outcome.tokens = row_tokens[position]
                outcome.special_tokens = [token_id in self.special_ids for token_id in ids]
                outcome.segments = segments[position]
            row_result = result.rows[position]
            request = requests[position]
            outcome.explain_requested = request.method is not None
            if isinstance(row_result, ExplainError):
                outcome.error = from_explain_error(row_result)
                outcome.method = request.method
            elif isinstance(row_result, RowExplanation):
                self._fill_explanation(outcome, row_result)
                row = rows[index]
                if isinstance(row, DecodedRow) and row.granularity != "token":
                    self._fill_units(outcome, row)
            elif isinstance(row_result, RowSkipped):
                outcome.skipped = row_result
            if request.method is not None and request.below is not None and outcome.error is None:
                outcome.below = float(request.below)
                outcome.confidence = float(confidences[position])
        seconds = result.seconds
        return outcomes, BatchTimings(float(seconds.get("forward", 0.0)), float(seconds.get("backward", 0.0)))

    def _fill_units(self, outcome: RowOutcome, row: DecodedRow) -> None:
        """The explanation in the row's words or sentences: its units and each one's summed score (sentences: the
        scores over the tokens kept in memory, :attr:`RowOutcome.token_scores`). The row is tokenized again as
        :meth:`_text_inputs` did, with the fast tokenizer's character offsets."""
        encoded = self.tokenizer(
            row.text or "", row.text_pair, truncation=True, max_length=self.config.max_length,
            return_offsets_mapping=True, return_special_tokens_mask=True,
        )  # fmt: skip
        special = [bool(flag) for flag in encoded["special_tokens_mask"]]
        offsets: list[tuple[int, int] | None] = [
            None if flag or end <= start else (int(start), int(end))
            for (start, end), flag in zip(encoded["offset_mapping"], special, strict=True)
        ]
        sequences = [
            None if flag else sequence for sequence, flag in zip(encoded.sequence_ids(0), special, strict=True)
        ]
        units, described = text_units(
            row.text or "", row.text_pair, offsets, sequences, outcome.tokens or [], row.granularity
        )
        outcome.granularity = row.granularity
        outcome.context = described
        if row.granularity == "sentence":  # a sentence's score cannot be split into words: the monitor's tokens
            outcome.token_scores = InMemory(outcome.scores or [])
        outcome.scores = [float(value) for value in unit_scores(torch.tensor(outcome.scores or []), units)]

    def _fill_prediction(self, outcome: RowOutcome, values: list[float], label_id: int) -> None:
        """The row's answer from its ``num_labels`` probabilities (or regression values) and their argmax."""
        outcome.head_type = self.head_type
        outcome.label_id = label_id
        if self.head_type == "regression":
            outcome.value = values[0]
            return
        outcome.probabilities = values
        if self.head_type == "multi_label":
            outcome.threshold = self.threshold
            outcome.predicted = [label for label, value in enumerate(outcome.probabilities) if value >= self.threshold]

    def _fill_explanation(self, outcome: RowOutcome, explanation: RowExplanation) -> None:
        scores = explanation.scores.float().cpu()
        outcome.method = explanation.method
        outcome.target = explanation.target
        outcome.options = dict(explanation.options)
        outcome.attribution_seconds = explanation.seconds
        outcome.pooled = explanation.pooled
        if scores.dim() == 2:
            outcome.grid = (int(scores.shape[0]), int(scores.shape[1]))
            outcome.scores = scores.flatten().tolist()
        else:
            outcome.scores = scores.tolist()
