"""Where a door's rows are served: in the door's own process (:class:`LocalBackend`, the KServe door) or on Ray Serve
replicas (:class:`doors.kserve.ray_deployment.RayBackend`). Both take decoded rows and give back a
:class:`~doors.kserve.batching.Served` share of a batch; the door around them is the same.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any, Protocol

from monitoring.monitor import Monitor
from monitoring.serving import start_monitor
from serving_core import tracing
from serving_core.loading import worker_device
from serving_core.task import BatchTimings, Service, get_task
from serving_core.wire import Encoding

from .batching import RowBatcher, Served
from .row_records import RequestRecords
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
    #: The model's monitor in the door's process (:mod:`monitoring.serving`), which the door hands each served row;
    #: None when monitoring is off or the rows are served elsewhere (their replicas run the monitor).
    monitor: Monitor | None
    #: Whether the backend records the rows where it serves them (:attr:`Served.refusals`); where not, the door
    #: records them.
    records: bool
    #: The door named in the records (``kserve``, ``ray``).
    door: str

    def load(self) -> str:
        """Load (or connect to) the model; returns its head type (classifiers: ``single_label``, ``multi_label`` or
        ``regression``; the other tasks: the task's name).

        Raises:
            Exception: if the model cannot be loaded.
        """
        ...

    async def serve(self, rows: Sequence[Any], records: RequestRecords | None = None) -> Served:
        """Serve one request's decoded rows (each the task's row or a ``RowError``), batched with other requests';
        a backend that :attr:`records` commits ``records`` (the request's records) before it answers.

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
    """The model in the door's process, behind a :class:`~doors.kserve.batching.RowBatcher`, with its monitor (the
    canaries run between batches: a lock is held around each batch)."""

    streams = True
    records = False
    door = "kserve"

    def __init__(self, settings: ModelSettings) -> None:
        """Remember the settings; :meth:`load` loads the model."""
        self.settings = settings
        self._service: Service[Any, Any] | None = None
        self._batcher: RowBatcher | None = None
        self._serving = threading.Lock()
        self.monitor: Monitor | None = None

    def load(self) -> str:
        """Load the checkpoint, start its monitor (``handler.monitor``; ``false``: off) and start batching.

        Raises:
            ValueError: if the monitor setting, or its baseline or canary file, is not valid.
        """
        service = load_service(self.settings)
        self._service = service
        config = self.settings.config
        self.monitor = start_monitor(self.settings.name, get_task(config.task), config, service, config.monitor,
                                     base=self.settings.archive, is_idle=lambda: not self._serving.locked(),
                                     lock=self._serving)  # fmt: skip
        self._batcher = RowBatcher(self._run, self.settings.batch_size, self.settings.max_batch_delay)
        return service.head_type

    def _run(self, rows: list[Any]) -> tuple[list[Any], BatchTimings]:
        """One batch on the service, holding the serving lock."""
        assert self._service is not None
        with self._serving:
            return run_rows(self._service, rows)

    async def serve(self, rows: Sequence[Any], records: RequestRecords | None = None) -> Served:
        """Serve the rows in the next batch (the door records them)."""
        if self._batcher is None:
            raise UnavailableError(f"model {self.settings.name} is not loaded")
        served = await self._batcher.submit(rows)
        tracing.record_explanations(served.outcomes)  # under the request's span
        return served

    def close(self) -> None:
        """Stop batching."""
        if self._batcher is not None:
            self._batcher.close()
