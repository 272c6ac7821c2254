"""The generic OIP codec: any task's rows as the JSON documents its TorchServe door takes, for a task that has no
codec of its own (:func:`~doors.kserve.oip.codecs.codec_for`).

Input ``document`` (BYTES, shape ``[B]``): one JSON document per row, exactly what the task takes as a TorchServe
REST body (its ``explain`` field included: this codec reads no explain parameters). Output ``document`` (BYTES, shape
``[B]``): each served row's JSON answer, as that door writes it (a failed row: ``""``, its error in the
``error_code``/``error_message`` outputs).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from serving_core.config import HandlerConfig
from serving_core.errors import RowError
from serving_core.task import get_task
from serving_core.wire import parse_json

from .tensors import OipRequest, Tensor, TensorSpec, batch_size, error_specs, text_value

#: The name of the codec's input and output tensor.
DOCUMENT = "document"


@dataclass
class DocumentCodec:
    """Rows of ``task`` as JSON documents (the module docstring)."""

    task: str

    def input_specs(self, config: HandlerConfig) -> list[TensorSpec]:
        """``document``: one JSON document per row."""
        return [TensorSpec(DOCUMENT, "BYTES", (-1,))]

    def output_specs(self, config: HandlerConfig, head_type: str) -> list[TensorSpec]:
        """``document``: one JSON answer per row; then the error outputs."""
        return [TensorSpec(DOCUMENT, "BYTES", (-1,)), *error_specs()]

    def decode(self, request: OipRequest, config: HandlerConfig) -> list[Any]:
        """One row per element of ``document``, decoded by the task (:meth:`serving_core.task.Task.decode_document`).

        Raises:
            RowError: ``invalid_request`` without the ``document`` input, with another input, or with a wrong shape.
        """
        names = set(request.inputs)
        if DOCUMENT not in names:
            raise RowError("invalid_request", f"missing input {DOCUMENT!r} (BYTES, shape [B]: a JSON document per row)")
        if names != {DOCUMENT}:
            raise RowError("invalid_request", f"unknown input(s) {sorted(names - {DOCUMENT})}; inputs: [{DOCUMENT!r}]")
        if request.inputs[DOCUMENT].datatype != "BYTES":
            raise RowError("invalid_request", f"input {DOCUMENT!r} must be BYTES")
        batch = batch_size(request, DOCUMENT)
        task = get_task(config.task)
        rows: list[Any] = []
        for row, value in enumerate(request.inputs[DOCUMENT].rows()[:batch]):
            try:
                document = parse_json(text_value(value, f"{DOCUMENT}[{row}]"))
                if not isinstance(document, Mapping):
                    kind = type(document).__name__
                    raise RowError("invalid_request", f"{DOCUMENT}[{row}] must be a JSON object, got {kind}")
                rows.append(task.decode_document(document, False, config))
            except RowError as error:
                rows.append(error)
        return rows

    def encode(self, outcomes: Sequence[Any], config: HandlerConfig) -> list[Tensor]:
        """``document``: each served row's JSON answer (``""`` for a failed row)."""
        task = get_task(config.task)
        documents = [
            json.dumps(task.to_dict(outcome, config), separators=(",", ":")) if outcome.error is None else ""
            for outcome in outcomes
        ]
        return [Tensor(DOCUMENT, "BYTES", (len(outcomes),), documents)]
