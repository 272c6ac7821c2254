"""The classification tasks: ``text`` (sequence classifiers, sentence pairs included) and ``image`` (ViT-family image
classifiers). A row is a text or an image with what it asks to explain; its answer is the prediction and, when asked
(and, with ``below``, only when the prediction is unsure), the attribution over its tokens or patches.

Decoding and the answer's fields are :mod:`~serving_core.tasks.classify_schema`'s, serving is
:class:`~serving_core.tasks.classify_service.ExplanationService`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from explainers import Deadline, RowRequest

from .. import metrics, wire
from ..config import HandlerConfig
from ..deadlines import earliest
from ..errors import RowError
from ..task import BatchTimings, Task
from .classify_schema import DecodedRow, RowOutcome, decode_body, fill_response, outcome_to_dict, read_row
from .classify_service import ExplanationService


class ClassificationTask(Task[DecodedRow, RowOutcome]):
    """Sequence or image classification (one instance per task name: :data:`TEXT`, :data:`IMAGE`)."""

    def __init__(self, name: str, main_input: str) -> None:
        """Name the task and its input field."""
        self.name = name
        self.main_input = main_input

    def load(self, config: HandlerConfig, model_dir: Path, device: torch.device) -> ExplanationService:
        """The classifier and its tokenizer or image processor."""
        return ExplanationService(config, model_dir, device)

    def read(self, row: Mapping[str, Any], config: HandlerConfig) -> wire.Body:
        """The envelope as a classifier takes it (:func:`~serving_core.tasks.classify_schema.read_row`)."""
        return read_row(row, config)

    def decode(self, body: wire.Body, explain_header: bool, config: HandlerConfig) -> DecodedRow:
        """A JSON/text/raw-image/protobuf request (:func:`~serving_core.tasks.classify_schema.decode_body`)."""
        return decode_body(body, explain_header, config)

    def requested_method(self, row: DecodedRow) -> str | None:
        """The method the row asks for."""
        return row.request.method

    def with_explanation(self, row: DecodedRow, config: HandlerConfig) -> DecodedRow:
        """The row, with the default method if it asks for none."""
        if row.request.method is not None:
            return row
        request = RowRequest(method=config.default_method, deadline=row.request.deadline)
        return DecodedRow(row.encoding, request, row.text, row.image, row.text_pair, row.granularity)

    def with_deadline(self, row: DecodedRow, deadline: Deadline | None) -> DecodedRow:
        """The row due by the earlier of its own deadline and ``deadline``."""
        due = earliest(row.request.deadline, deadline)
        return row if due is row.request.deadline else replace(row, request=replace(row.request, deadline=due))

    def to_dict(self, outcome: RowOutcome, config: HandlerConfig) -> dict[str, Any]:
        """The JSON answer (docs/SERVING.md, "Response")."""
        return outcome_to_dict(outcome, config.labels)

    def to_proto(self, outcome: RowOutcome, response: Any, config: HandlerConfig) -> None:
        """The ``ExplainResponse`` answer."""
        fill_response(outcome, response, config.labels)

    def observe(
        self, model: str, row: DecodedRow | RowError, outcome: RowOutcome, timings: BatchTimings, encode_seconds: float
    ) -> None:
        """The shared metrics, and whether a row that asked to be explained only when unsure was explained."""
        super().observe(model, row, outcome, timings, encode_seconds)
        if outcome.error is None and outcome.below is not None:
            requested = outcome.method if isinstance(row, RowError) else self.requested_method(row)
            metrics.observe_unsure(model, metrics.metric_method(requested), outcome.skipped is None)


TEXT = ClassificationTask("text", "text")
IMAGE = ClassificationTask("image", "image")
