"""Where a door's rows are served: in the door's own process (:class:`LocalBackend`, the KServe door) or on Ray Serve
replicas (:class:`doors.kserve.ray_deployment.RayBackend`). Both take decoded rows and give back a
:class:`~doors.kserve.batching.Served` share of a batch; the door around them is the same.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Protocol

from serving_core import tracing
from serving_core.loading import worker_device
from serving_core.task import BatchTimings, Service, get_task
from serving_core.wire import Encoding

from .batching import RowBatcher, Served
from .settings import ModelSettings

logger = logging.getLogger(__name__)


class UnavailableError(Exception):
    """The rows could not be served right now (a replica died, none is ready): the client should retry."""


class Backend(Protocol):
    """Serves a door's decoded rows."""

    settings: ModelSettings
    #: Whether a streaming row's events reach the door as they are written (rows served in the door's process);
    #: where not, its door sends its answer's events once it is served.
    streams: bool

    def load(self) -> str:
        """Load (or connect to) the model; returns its head type (classifiers: ``single_label``, ``multi_label`` or
        ``regression``; the other tasks: the task's name).

        Raises:
            Exception: if the model cannot be loaded.
        """
        ...

    async def serve(self, rows: Sequence[Any]) -> Served:
        """Serve one request's decoded rows (each the task's row or a ``RowError``), batched with other requests'.

        Raises:
            UnavailableError: if no replica could serve them now (retryable).
        """
        ...

    def close(self) -> None:
        """Release what :meth:`load` took."""
        ...


def load_service(settings: ModelSettings) -> Service[Any, Any]:
    """The serving core of ``settings``'s checkpoint, by its task (torch threads from ``handler.threads``)."""
    config = settings.config
    return get_task(config.task).load(config, settings.model_dir, worker_device(config))


def run_rows(service: Service[Any, Any], rows: list[Any]) -> tuple[list[Any], BatchTimings]:
    """The service's ``run`` on rows that all answer in the door's own encoding."""
    outcomes, timings = service.run(rows, [Encoding.JSON] * len(rows))
    return list(outcomes), timings


class LocalBackend:
    """The model in the door's process, behind a :class:`~doors.kserve.batching.RowBatcher`."""

    streams = True

    def __init__(self, settings: ModelSettings) -> None:
        """Remember the settings; :meth:`load` loads the model."""
        self.settings = settings
        self._service: Service[Any, Any] | None = None
        self._batcher: RowBatcher | None = None

    def load(self) -> str:
        """Load the checkpoint and start batching."""
        service = load_service(self.settings)
        self._service = service
        self._batcher = RowBatcher(
            lambda rows: run_rows(service, rows), self.settings.batch_size, self.settings.max_batch_delay
        )
        return service.head_type

    async def serve(self, rows: Sequence[Any]) -> Served:
        """Serve the rows in the next batch."""
        if self._batcher is None:
            raise UnavailableError(f"model {self.settings.name} is not loaded")
        served = await self._batcher.submit(rows)
        tracing.record_explanations(served.outcomes)  # under the request's span
        return served

    def close(self) -> None:
        """Stop batching."""
        if self._batcher is not None:
            self._batcher.close()
