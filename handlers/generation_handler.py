"""TorchServe entry point of generation models (causal LMs), packaged into each generation archive.

TorchServe instantiates the one class defined in this file. ``initialize`` is the shared one of
:class:`handlers.base.ExplanationHandler` (it reads the ``handler:`` section and loads the model through
:meth:`create_service`); ``handle`` decodes each row as a generation request, serves the batch with one
:meth:`handlers.generation_service.GenerationService.run` and encodes each row in the encoding it came in.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch

from handlers import metrics
from handlers.base import ExplanationHandler
from handlers.config import HandlerConfig
from handlers.generation_schema import GenerationRow, decode_generation_row, encode_generation
from handlers.generation_service import GenerationService

logger = logging.getLogger(__name__)


class GenerationExplanationHandler(ExplanationHandler):
    """A causal LM's continuation with, per row as asked, an attribution of each generated token."""

    task = "generation"

    def create_service(self, config: HandlerConfig, model_dir: Path, device: torch.device) -> Any:
        """The :class:`GenerationService` of the archive's checkpoint."""
        return GenerationService(config, model_dir, device)

    def handle(self, data: list[dict[str, Any]], context: Any) -> list[bytes]:
        """Serve one TorchServe batch: exactly one response per row, in order."""
        _, encodings, decoded = self.decode_batch(data, context, decode_generation_row)
        outcomes, timings = self.service.run(decoded, encodings)
        metrics.observe_generated_tokens(self.model_name, timings.tokens)
        responses: list[bytes] = []
        for index, outcome in enumerate(outcomes):
            started = time.perf_counter()
            body = encode_generation(outcome)
            context.set_response_content_type(
                index, "application/x-protobuf" if outcome.encoding.value == "protobuf" else "application/json"
            )
            asked = decoded[index]
            requested = asked.ask.method if isinstance(asked, GenerationRow) and asked.ask is not None else None
            if outcome.error is not None:
                context.set_response_status(outcome.error.http_status, outcome.error.phrase, index)
                metrics.observe_error(self.model_name, metrics.metric_method(requested), outcome.error.code)
            else:
                stages = {"generate": timings.generate, "encode": time.perf_counter() - started}
                if outcome.method is not None:
                    stages["forward"] = timings.forward
                    stages["attribution"] = outcome.attribution_seconds
                    if timings.backward > 0:
                        stages["backward"] = timings.backward
                metrics.observe_row(self.model_name, outcome.method, stages)
            responses.append(body)
        logger.info("%s: batch of %d generation rows", self.model_name, len(data))
        return responses
