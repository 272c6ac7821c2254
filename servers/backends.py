"""Where a door's rows are served: in the door's own process (:class:`LocalBackend`, the KServe door) or on Ray Serve
replicas (:class:`servers.ray_deployment.RayBackend`). Both take decoded rows and give back a
:class:`~servers.batching.Served` share of a batch; the door around them is the same.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

from handlers.errors import RowError
from handlers.schema import DecodedRow, Encoding, RowOutcome
from handlers.service import BatchTimings, ExplanationService, select_device

from .batching import RowBatcher, Served
from .settings import ModelSettings

logger = logging.getLogger(__name__)


class UnavailableError(Exception):
    """The rows could not be served right now (a replica died, none is ready): the client should retry."""


class Backend(Protocol):
    """Serves a door's decoded rows."""

    settings: ModelSettings

    def load(self) -> str:
        """Load (or connect to) the model; returns its head type (``single_label``, ``multi_label``, ``regression``).

        Raises:
            Exception: if the model cannot be loaded.
        """
        ...

    async def serve(self, rows: Sequence[DecodedRow | RowError]) -> Served:
        """Serve one request's rows (batched with other requests').

        Raises:
            UnavailableError: if no replica could serve them now (retryable).
        """
        ...

    def close(self) -> None:
        """Release what :meth:`load` took."""
        ...


def load_service(settings: ModelSettings) -> ExplanationService:
    """The serving core for ``settings``'s checkpoint (torch threads from ``handler.threads``)."""
    if settings.config.threads is not None:
        import torch

        torch.set_num_threads(settings.config.threads)
    return ExplanationService(settings.config, settings.model_dir, select_device(settings.config.device))


def run_rows(service: ExplanationService, rows: list[DecodedRow | RowError]) -> tuple[list[RowOutcome], BatchTimings]:
    """:meth:`ExplanationService.run` on rows that all answer in the door's own encoding."""
    return service.run(rows, [Encoding.JSON] * len(rows))


class LocalBackend:
    """The model in the door's process, behind a :class:`~servers.batching.RowBatcher`."""

    def __init__(self, settings: ModelSettings) -> None:
        """Remember the settings; :meth:`load` loads the model."""
        self.settings = settings
        self._service: ExplanationService | None = None
        self._batcher: RowBatcher | None = None

    def load(self) -> str:
        """Load the checkpoint and start batching."""
        service = load_service(self.settings)
        self._service = service
        self._batcher = RowBatcher(
            lambda rows: run_rows(service, rows), self.settings.batch_size, self.settings.max_batch_delay
        )
        return service.head_type

    async def serve(self, rows: Sequence[DecodedRow | RowError]) -> Served:
        """Serve the rows in the next batch."""
        if self._batcher is None:
            raise UnavailableError(f"model {self.settings.name} is not loaded")
        return await self._batcher.submit(rows)

    def close(self) -> None:
        """Stop batching."""
        if self._batcher is not None:
            self._batcher.close()
