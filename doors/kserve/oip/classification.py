"""The OIP codecs of the classification tasks (``text``, ``image``): the explain extension for classifiers.

- Inputs ``text`` (BYTES ``[B]``) and, for sentence-pair models, ``text_pair`` (BYTES ``[B]``, ``""`` = no pair);
  images: ``image`` (BYTES ``[B]``, each element the encoded PNG/JPEG file, raw bytes or base64 text); what each row
  asks to explain: :mod:`doors.kserve.oip.asks` (``explain_method``, ``explain_target``, ``explain_option_<name>``,
  ``explain_deadline_ms``).
- Outputs ``label`` (BYTES ``[B]``), ``label_id`` (INT64 ``[B]``), ``probabilities`` (FP32 ``[B, C]``) (multi-label
  heads add ``predicted``, BOOL ``[B, C]``; regression heads answer ``value``, FP32 ``[B]``), ``truncated`` (text)
  and, when a row is explained, ``tokens`` (BYTES ``[B, n]``) and ``scores`` (FP32 ``[B, n]``), rows padded to the
  longest with ``""`` and 0, ``special_tokens``, ``segments`` (pairs), ``explain_method`` (BYTES ``[B]``, ``""`` for
  rows not explained), ``explain_target`` and ``explain_option_<name>``; images: ``scores`` (FP32
  ``[B, grid_h, grid_w]``).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from typing import Any

from serving_core.config import HandlerConfig
from serving_core.errors import RowError
from serving_core.pools import IMAGE_MAGIC
from serving_core.tasks.classify_schema import DecodedRow, RowOutcome, decode_fields

from .asks import EXPLAIN_METHOD, EXPLAIN_TARGET, OPTION_PREFIX, RowAsk, check_inputs, decode_rows, row_asks
from .codecs import register_codec
from .tensors import OipRequest, Tensor, TensorSpec, batch_size, error_specs, padded, text_value


def prediction_outputs(outcomes: Sequence[RowOutcome], labels: Sequence[str], head_type: str) -> list[Tensor]:
    """``label``, ``label_id``, ``probabilities`` (``predicted`` for multi-label heads; ``value`` for regression);
    failed rows get ``""``, -1 and zeros."""
    batch = len(outcomes)
    if head_type == "regression":
        values = [float(o.value) if o.error is None and o.value is not None else 0.0 for o in outcomes]
        return [Tensor("value", "FP32", (batch,), values)]
    width = len(labels)
    names: list[str] = []
    ids: list[int] = []
    probabilities: list[float] = []
    predicted: list[bool] = []
    for outcome in outcomes:
        served = outcome.error is None
        names.append(labels[outcome.label_id] if served else "")
        ids.append(outcome.label_id if served else -1)
        probabilities += outcome.probabilities if served else [0.0] * width
        chosen = set(outcome.predicted) if served else set()
        predicted += [index in chosen for index in range(width)]
    outputs = [
        Tensor("label", "BYTES", (batch,), names),
        Tensor("label_id", "INT64", (batch,), ids),
        Tensor("probabilities", "FP32", (batch, width), probabilities),
    ]
    if head_type == "multi_label":
        outputs.append(Tensor("predicted", "BOOL", (batch, width), predicted))
    return outputs


def explained_outputs(outcomes: Sequence[RowOutcome]) -> list[Tensor]:
    """``explain_method`` (``""`` where a row is not explained), ``explain_target`` (-1) and one
    ``explain_option_<name>`` per option any row used (-1 where a row has none): INT64 for an integer option, FP64
    for a real-valued one."""
    batch = len(outcomes)
    explained = [o.error is None and o.method is not None for o in outcomes]
    methods = [o.method if ok else "" for o, ok in zip(outcomes, explained, strict=True)]
    targets = [o.target if ok else -1 for o, ok in zip(outcomes, explained, strict=True)]
    outputs = [Tensor(EXPLAIN_METHOD, "BYTES", (batch,), methods), Tensor(EXPLAIN_TARGET, "INT64", (batch,), targets)]
    names = sorted({name for o, ok in zip(outcomes, explained, strict=True) if ok for name in o.options})
    for name in names:
        used = [o.options.get(name, -1) if ok else -1 for o, ok in zip(outcomes, explained, strict=True)]
        if any(isinstance(value, float) for value in used):
            outputs.append(Tensor(f"{OPTION_PREFIX}{name}", "FP64", (batch,), [float(value) for value in used]))
        else:
            outputs.append(Tensor(f"{OPTION_PREFIX}{name}", "INT64", (batch,), [int(value) for value in used]))
    return outputs


def classifier_outputs(outcomes: Sequence[RowOutcome], config: HandlerConfig) -> list[Tensor]:
    """The prediction outputs, then the explained rows' method, target and options (when some row is explained)."""
    served = [outcome for outcome in outcomes if outcome.error is None]
    outputs = prediction_outputs(outcomes, config.labels, served[0].head_type if served else "single_label")
    if any(outcome.method is not None for outcome in served):
        outputs += explained_outputs(outcomes)
    return outputs


class TextCodec:
    """Sequence classifiers: ``text`` (+ ``text_pair``) in; tokens and per-token scores out."""

    task = "text"

    def input_specs(self, config: HandlerConfig) -> list[TensorSpec]:
        """``text`` and the optional ``text_pair`` and per-row explain inputs."""
        return [
            TensorSpec("text", "BYTES", (-1,)),
            TensorSpec("text_pair", "BYTES", (-1,), optional=True),
            *_explain_input_specs(),
        ]

    def output_specs(self, config: HandlerConfig, head_type: str) -> list[TensorSpec]:
        """The prediction outputs, then the explanation and error outputs."""
        return [
            *_prediction_specs(head_type),
            TensorSpec("truncated", "BOOL", (-1,)),
            TensorSpec("tokens", "BYTES", (-1, -1), optional=True),
            TensorSpec("scores", "FP32", (-1, -1), optional=True),
            TensorSpec("special_tokens", "BOOL", (-1, -1), optional=True),
            TensorSpec("segments", "INT32", (-1, -1), optional=True),
            *_explained_specs(),
        ]

    def decode(self, request: OipRequest, config: HandlerConfig) -> list[DecodedRow | RowError]:
        """One row per element of ``text`` (and ``text_pair``)."""
        check_inputs(request, "text", {"text_pair"}, {"image": "this is a text model: send input 'text', not 'image'"})
        batch = batch_size(request, "text")
        texts = request.inputs["text"].rows()
        pairs: list[Any] = [None] * batch
        if "text_pair" in request.inputs:
            pairs = request.inputs["text_pair"].rows()
            if len(pairs) != batch:
                raise RowError("invalid_request", f"input 'text_pair' must have as many rows as 'text' ({batch})")
        asks = row_asks(request, batch, config)

        def build(row: int, ask: RowAsk) -> DecodedRow:
            text = text_value(texts[row], f"text[{row}]")
            pair = text_value(pairs[row], f"text_pair[{row}]") if pairs[row] is not None else None
            return decode_fields(
                config, text=text, text_pair=pair or None, method=ask.method, target=ask.target, options=ask.options
            )

        return decode_rows(batch, asks, build)

    def encode(self, outcomes: Sequence[RowOutcome], config: HandlerConfig) -> list[Tensor]:
        """The prediction, ``truncated``; when some row is explained, ``tokens``, ``scores``, ``special_tokens`` (and
        ``segments`` for pairs), padded to the longest row."""
        batch = len(outcomes)
        outputs = classifier_outputs(outcomes, config)
        outputs.append(Tensor("truncated", "BOOL", (batch,), [o.error is None and o.truncated for o in outcomes]))
        explained = [o.error is None and o.method is not None for o in outcomes]
        if not any(explained):
            return outputs
        rows = [o if ok else None for o, ok in zip(outcomes, explained, strict=True)]
        width, token_data = padded([o.tokens if o else None for o in rows], "")
        _, score_data = padded([o.scores if o else None for o in rows], 0.0)
        _, special = padded([o.special_tokens if o else None for o in rows], False)
        outputs += [
            Tensor("tokens", "BYTES", (batch, width), token_data),
            Tensor("scores", "FP32", (batch, width), score_data),
            Tensor("special_tokens", "BOOL", (batch, width), special),
        ]
        if any(o is not None and o.segments is not None for o in rows):
            _, segments = padded([o.segments if o else None for o in rows], -1)
            outputs.append(Tensor("segments", "INT32", (batch, width), segments))
        return outputs


class ImageCodec:
    """Image classifiers: ``image`` (encoded PNG/JPEG) in; a patch grid of scores out."""

    task = "image"

    def input_specs(self, config: HandlerConfig) -> list[TensorSpec]:
        """``image`` and the per-row explain inputs."""
        return [TensorSpec("image", "BYTES", (-1,)), *_explain_input_specs()]

    def output_specs(self, config: HandlerConfig, head_type: str) -> list[TensorSpec]:
        """The prediction outputs, then the explanation and error outputs."""
        return [*_prediction_specs(head_type), TensorSpec("scores", "FP32", (-1, -1, -1), optional=True),
                *_explained_specs()]  # fmt: skip

    def decode(self, request: OipRequest, config: HandlerConfig) -> list[DecodedRow | RowError]:
        """One row per element of ``image``: raw file bytes, or the file as base64 text (REST JSON)."""
        message = "this is an image model: send input 'image', not 'text'"
        check_inputs(request, "image", set(), {"text": message, "text_pair": message})
        batch = batch_size(request, "image")
        images = request.inputs["image"].rows()
        asks = row_asks(request, batch, config)

        def build(row: int, ask: RowAsk) -> DecodedRow:
            image = _image_bytes(images[row], row, config)
            return decode_fields(config, image=image, method=ask.method, target=ask.target, options=ask.options)

        return decode_rows(batch, asks, build)

    def encode(self, outcomes: Sequence[RowOutcome], config: HandlerConfig) -> list[Tensor]:
        """The prediction; when some row is explained, ``scores`` ``[B, grid_h, grid_w]`` (zeros for rows not
        explained)."""
        outputs = classifier_outputs(outcomes, config)
        if not any(o.error is None and o.method is not None for o in outcomes):
            return outputs
        grids = {o.grid for o in outcomes if o.error is None and o.method is not None and o.grid is not None}
        height, width = grids.pop() if len(grids) == 1 else (0, 0)
        cells = height * width
        data: list[float] = []
        for outcome in outcomes:
            explained = outcome.error is None and outcome.method is not None and outcome.scores is not None
            data += list(outcome.scores or []) if explained else [0.0] * cells
        return [*outputs, Tensor("scores", "FP32", (len(outcomes), height, width), data)]


def _image_bytes(value: Any, row: int, config: HandlerConfig) -> bytes:
    """A row's image: raw bytes as they are, base64 text (REST JSON cannot carry raw bytes) decoded."""
    if isinstance(value, bytes | bytearray):
        value = bytes(value)
        if value.startswith(IMAGE_MAGIC):
            return value
        try:
            text = value.decode("ascii")
        except UnicodeDecodeError:
            return value  # neither an image nor base64: the service answers invalid_image
    elif isinstance(value, str):
        text = value
    else:
        raise RowError("invalid_request", f"image[{row}] must be BYTES, got {type(value).__name__}")
    if len(text) * 3 // 4 > config.max_image_bytes:
        raise RowError("image_too_large", f"image[{row}] exceeds the limit of {config.max_image_bytes} bytes")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise RowError("invalid_image", f"image[{row}] is neither a PNG/JPEG file nor valid base64") from None


def _explain_input_specs() -> list[TensorSpec]:
    return [TensorSpec(EXPLAIN_METHOD, "BYTES", (-1,), optional=True),
            TensorSpec(EXPLAIN_TARGET, "INT64", (-1,), optional=True)]  # fmt: skip


def _prediction_specs(head_type: str) -> list[TensorSpec]:
    if head_type == "regression":
        return [TensorSpec("value", "FP32", (-1,))]
    specs = [TensorSpec("label", "BYTES", (-1,)), TensorSpec("label_id", "INT64", (-1,)),
             TensorSpec("probabilities", "FP32", (-1, -1))]  # fmt: skip
    if head_type == "multi_label":
        specs.append(TensorSpec("predicted", "BOOL", (-1, -1)))
    return specs


def _explained_specs() -> list[TensorSpec]:
    return [
        TensorSpec(EXPLAIN_METHOD, "BYTES", (-1,), optional=True),
        TensorSpec(EXPLAIN_TARGET, "INT64", (-1,), optional=True),
        *error_specs(),
    ]


register_codec(TextCodec())
register_codec(ImageCodec())
