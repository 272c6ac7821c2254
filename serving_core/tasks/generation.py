"""The generation task (``generation``: causal LMs): a row is a prompt (and optionally a continuation produced
elsewhere); its answer is the continuation, each generated token's probability and, when asked, each step's
attribution over the prompt and the tokens before it.

Decoding and the answer's fields are :mod:`~serving_core.tasks.generation_schema`'s, serving is
:class:`~serving_core.tasks.generation_service.GenerationService`'s.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from explainers import Deadline

from .. import wire
from ..config import HandlerConfig
from ..deadlines import earliest
from ..streaming import Listener
from ..task import BatchTimings, Task
from .generation_schema import (
    GenerationAsk,
    GenerationOutcome,
    GenerationRow,
    decode_generation_body,
    fill_generation_response,
    generation_to_dict,
)
from .generation_service import GenerationService


class GenerationTask(Task[GenerationRow, GenerationOutcome]):
    """Generation with a causal LM (:data:`GENERATION`)."""

    name = "generation"
    main_input = "prompt"

    def load(self, config: HandlerConfig, model_dir: Path, device: torch.device) -> GenerationService:
        """The causal LM and its tokenizer."""
        return GenerationService(config, model_dir, device)

    def decode(self, body: wire.Body, explain_header: bool, config: HandlerConfig) -> GenerationRow:
        """A JSON/text/protobuf generation request
        (:func:`~serving_core.tasks.generation_schema.decode_generation_body`)."""
        return decode_generation_body(body, explain_header, config)

    def requested_method(self, row: GenerationRow) -> str | None:
        """The method the row asks for."""
        return row.ask.method if row.ask is not None else None

    def with_explanation(self, row: GenerationRow, config: HandlerConfig) -> GenerationRow:
        """The row, asking for the default method over every step if it asks for no explanation."""
        if row.ask is not None:
            return row
        return dataclasses.replace(row, ask=GenerationAsk(config.default_method))

    def streams(self, row: GenerationRow) -> bool:
        """Whether the row asks for a stream (``"stream": true``)."""
        return row.stream

    def with_listener(self, row: GenerationRow, listener: Listener) -> GenerationRow:
        """The row sending its token events to ``listener`` as they are written."""
        return dataclasses.replace(row, stream=True, listener=listener)

    def with_deadline(self, row: GenerationRow, deadline: Deadline | None) -> GenerationRow:
        """The row due by the earlier of its own deadline and ``deadline``."""
        due = earliest(row.deadline, deadline)
        return row if due is row.deadline else dataclasses.replace(row, deadline=due)

    def to_dict(self, outcome: GenerationOutcome, config: HandlerConfig) -> dict[str, Any]:
        """The JSON answer (docs/SERVING.md, "Generation models")."""
        return generation_to_dict(outcome)

    def to_proto(self, outcome: GenerationOutcome, response: Any, config: HandlerConfig) -> None:
        """The ``ExplainResponse`` answer (its ``generation`` field)."""
        fill_generation_response(outcome, response)

    def stages(self, outcome: GenerationOutcome, timings: BatchTimings, encode_seconds: float) -> dict[str, float]:
        """Generation, encoding and, for an explained row, its explanation's forward, attribution and backward."""
        stages = {"generate": timings.generate, "encode": encode_seconds}
        if outcome.method is not None:
            stages["forward"] = timings.forward
            stages["attribution"] = outcome.attribution_seconds
            if timings.backward > 0:
                stages["backward"] = timings.backward
        return stages


GENERATION = GenerationTask()
