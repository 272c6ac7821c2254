"""The TorchServe handler contract, row by row: ``initialize`` once, then ``handle`` per batch.

``handle`` decodes each row on its own (an undecodable row gets its own error), serves the valid rows with one
:meth:`~handlers.service.ExplanationService.run`, encodes each row in the encoding it came in, sets each row's REST
status and records the metrics. It never uses ``BaseHandler.handle``/``explain_handle``, which decide for the whole
batch from row 0 and explain row 0 only. No per-request state is stored on ``self``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from . import metrics
from .config import HandlerConfig
from .errors import RowError
from .pools import model_of
from .schema import DecodedRow, Encoding, RowOutcome, decode_row, encode_outcome, row_encoding
from .service import ExplanationService, select_device

Row = TypeVar("Row")

logger = logging.getLogger(__name__)

_CONTENT_TYPES = {Encoding.JSON: "application/json", Encoding.PROTOBUF: "application/x-protobuf"}


def _explain_header(context: Any, index: int) -> bool:
    value = context.get_request_header(index, "explain")
    return isinstance(value, str) and value.strip().lower() == "true"


class ExplanationHandler:
    """Base class of the handler entry points (``handlers/text_handler.py``, ``image_handler.py``,
    ``token_handler.py``): a task's entry point names its task, and may name its own service class and encoder."""

    task: str = ""
    #: The serving core of the task (a subclass of :class:`ExplanationService` with its own ``run``).
    service_class: type[ExplanationService] = ExplanationService
    #: Encodes one row's outcome in the encoding its request came in.
    encode: staticmethod[[RowOutcome, tuple[str, ...]], bytes] = staticmethod(encode_outcome)

    def __init__(self) -> None:
        """Create an uninitialised handler (TorchServe calls :meth:`initialize`)."""
        self.initialized = False
        self.config: HandlerConfig | None = None
        self.service: Any = None
        self.model_name = ""

    def initialize(self, context: Any) -> None:
        """Read the ``handler:`` config from ``model-config.yaml`` and load the model.

        Raises:
            ConfigError: if the config is invalid or its task is not this handler's.
        """
        from .config import ConfigError

        config = HandlerConfig.from_model_yaml(context.model_yaml_config)
        if config.task != self.task:
            raise ConfigError(f"handler.task is {config.task!r} but this is the {self.task} handler")
        properties = context.system_properties
        model_dir = Path(properties.get("model_dir", ".")) / config.model_dir
        if config.threads is not None:
            import torch

            torch.set_num_threads(config.threads)
        device = select_device(config.device)
        gpu_id = properties.get("gpu_id")
        if device.type == "cuda" and gpu_id is not None:
            import torch

            device = torch.device(f"cuda:{int(gpu_id)}")
        self.model_name = model_of(str(context.model_name))  # an explanation pool's metrics are its model's
        self.service = self.create_service(config, model_dir, device)
        self.config = config
        metrics.check_multiprocess()
        self.initialized = True

    def create_service(self, config: HandlerConfig, model_dir: Path, device: Any) -> Any:
        """The serving core of this handler's task: :attr:`service_class` (generation models override this)."""
        return self.service_class(config, model_dir, device)

    def decode_batch(
        self, data: list[dict[str, Any]], context: Any, decode: Callable[[dict[str, Any], bool, HandlerConfig], Row]
    ) -> tuple[HandlerConfig, list[Encoding], list[Row | RowError]]:
        """The start of every task's ``handle``: the batch counted, each row's encoding, and each row decoded with
        ``decode(row, explain_header, config)`` (a row that fails to decode keeps its :class:`RowError`)."""
        if self.service is None or self.config is None:
            raise RuntimeError("handler used before initialize()")
        config = self.config
        metrics.observe_batch(self.model_name, len(data))
        encodings = [row_encoding(row) for row in data]
        decoded: list[Row | RowError] = []
        for index, row in enumerate(data):
            try:
                decoded.append(decode(row, _explain_header(context, index), config))
            except RowError as error:
                decoded.append(error)
        return config, encodings, decoded

    def handle(self, data: list[dict[str, Any]], context: Any) -> list[bytes]:
        """Serve one TorchServe batch: exactly one response per row, in order."""
        config, encodings, decoded = self.decode_batch(data, context, decode_row)
        outcomes, timings = self.service.run(decoded, encodings)
        logger.info("%s: batch of %d rows", self.model_name, len(data))
        responses: list[bytes] = []
        for index, outcome in enumerate(outcomes):
            started = time.perf_counter()
            body = self.encode(outcome, config.labels)
            encode_seconds = time.perf_counter() - started
            context.set_response_content_type(index, _CONTENT_TYPES[outcome.encoding])
            decoded_row = decoded[index]
            requested = decoded_row.request.method if isinstance(decoded_row, DecodedRow) else outcome.method
            if outcome.error is not None:
                context.set_response_status(outcome.error.http_status, outcome.error.phrase, index)
                logger.debug("row %d: %s %s", index, outcome.error.code, outcome.error.message)
            metrics.observe_outcome(
                self.model_name, requested, outcome, timings.forward, timings.backward, encode_seconds
            )
            responses.append(body)
        return responses
