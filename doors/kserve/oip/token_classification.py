"""The OIP codec of token classifiers (``token_classification``: NER, PII detection).

- Input ``text`` (BYTES ``[B]``); what each row asks to explain: :mod:`doors.kserve.oip.asks` (``explain_method``,
  ``explain_option_<name>``; a token classifier explains every entity it finds for its own label, so
  ``explain_target`` is refused, as on the REST door).
- Outputs ``entities`` (BYTES ``[B]``: each element a JSON list of the row's entities, the same objects the REST
  answer holds — ``text``, ``label``, ``tag``, ``label_id``, ``start``/``end`` character offsets,
  ``token_start``/``token_end``, ``score`` and, when explained, ``scores`` over the row's tokens), ``tokens`` (BYTES
  ``[B, n]``, padded with ``""``), ``truncated`` (BOOL ``[B]``) and, when a row is explained, ``explain_method``
  (BYTES ``[B]``, ``""`` for rows not explained).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from serving_core.config import HandlerConfig
from serving_core.errors import RowError
from serving_core.tasks.classify_schema import DecodedRow, decode_fields
from serving_core.tasks.token_schema import TokenOutcome, token_outcome_to_dict

from .asks import EXPLAIN_METHOD, RowAsk, check_inputs, decode_rows, row_asks
from .codecs import register_codec
from .tensors import OipRequest, Tensor, TensorSpec, batch_size, error_specs, padded, text_value


class TokenClassificationCodec:
    """Token classifiers: ``text`` in; entities (JSON per row) and tokens out."""

    task = "token_classification"

    def input_specs(self, config: HandlerConfig) -> list[TensorSpec]:
        """``text`` and the optional per-row ``explain_method``."""
        return [TensorSpec("text", "BYTES", (-1,)), TensorSpec(EXPLAIN_METHOD, "BYTES", (-1,), optional=True)]

    def output_specs(self, config: HandlerConfig, head_type: str) -> list[TensorSpec]:
        """Entities, tokens, truncation, then the explanation and error outputs."""
        return [
            TensorSpec("entities", "BYTES", (-1,)),
            TensorSpec("tokens", "BYTES", (-1, -1)),
            TensorSpec("truncated", "BOOL", (-1,)),
            TensorSpec(EXPLAIN_METHOD, "BYTES", (-1,), optional=True),
            *error_specs(),
        ]

    def decode(self, request: OipRequest, config: HandlerConfig) -> list[DecodedRow | RowError]:
        """One row per element of ``text``."""
        message = "this is a token classifier: send input 'text'"
        check_inputs(request, "text", set(), {"image": message, "text_pair": message})
        batch = batch_size(request, "text")
        texts = request.inputs["text"].rows()
        asks = row_asks(request, batch, config)

        def build(row: int, ask: RowAsk) -> DecodedRow:
            text = text_value(texts[row], f"text[{row}]")
            return decode_fields(config, text=text, method=ask.method, target=ask.target, options=ask.options)

        return decode_rows(batch, asks, build)

    def encode(self, outcomes: Sequence[TokenOutcome], config: HandlerConfig) -> list[Tensor]:
        """``entities``, ``tokens`` and ``truncated``; ``explain_method`` when some row is explained."""
        batch = len(outcomes)
        served = [outcome.error is None for outcome in outcomes]
        entities = [
            json.dumps(token_outcome_to_dict(outcome)["entities"], separators=(",", ":")) if ok else "[]"
            for outcome, ok in zip(outcomes, served, strict=True)
        ]
        width, tokens = padded([o.tokens if ok else None for o, ok in zip(outcomes, served, strict=True)], "")
        outputs = [
            Tensor("entities", "BYTES", (batch,), entities),
            Tensor("tokens", "BYTES", (batch, width), tokens),
            Tensor("truncated", "BOOL", (batch,), [ok and o.truncated for o, ok in zip(outcomes, served, strict=True)]),
        ]
        methods = [o.method if ok and o.method is not None else "" for o, ok in zip(outcomes, served, strict=True)]
        if any(methods):
            outputs.append(Tensor(EXPLAIN_METHOD, "BYTES", (batch,), methods))
        return outputs


register_codec(TokenClassificationCodec())
