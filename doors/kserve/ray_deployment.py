"""The model as a Ray Serve deployment: replicas of the serving core, fed by Ray Serve's own ``@serve.batch``.

Each replica loads the archive folder's checkpoint once (:func:`doors.kserve.backends.load_service`) and serves batches
of requests' rows with one call of the task's service (``service.run``). The deployment's
``num_replicas`` comes from the model settings (``minWorkers``, or ``REPLICAS=``), each replica asks Ray for
``handler.threads`` CPUs (default 1) and a GPU when ``handler.device`` is ``cuda``; ``@serve.batch`` is set to the
settings' ``batchSize`` rows and ``maxBatchDelay``.

The KServe door talks to the replicas through a :class:`RayBackend` (a ``DeploymentHandle``); Ray Serve routes each
request to a replica with room. A request in flight on a replica that dies is answered as
:class:`~doors.kserve.backends.UnavailableError` (HTTP 503 / gRPC ``UNAVAILABLE``: retry it), the others go on to the
live replicas while Ray Serve starts a replacement.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Sequence
from typing import Any

from ray import serve
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError
from ray.serve.handle import DeploymentHandle

from serving_core import tracing

from .backends import UnavailableError, load_service, run_rows
from .batching import Served, serve_together
from .settings import ModelSettings

logger = logging.getLogger(__name__)

#: Errors that mean "the replica this request went to is gone": retryable.
REPLICA_GONE = (ActorDiedError, ActorUnavailableError, RayActorError)


def _row_count(requests: list[Sequence[Any]]) -> int:
    """``@serve.batch`` counts rows, not requests (a request may carry several)."""
    return sum(len(rows) for rows in requests)


@serve.deployment(ray_actor_options={"num_cpus": 1})
class ExplainReplica:
    """One replica: the serving core for one model."""

    def __init__(self, settings: ModelSettings) -> None:
        """Load the model and size the batches from its settings."""
        self.settings = settings
        self.service = load_service(settings)
        batcher: Any = self.serve_batch  # Ray's batch handler: its setters are not in the method's type
        batcher.set_max_batch_size(settings.batch_size)
        batcher.set_batch_wait_timeout_s(settings.max_batch_delay)
        logger.info("replica of %s ready (pid %d)", settings.name, os.getpid())

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.002, batch_size_fn=_row_count)
    async def serve_batch(self, requests: list[Sequence[Any]]) -> list[Served]:
        """Serve the batched requests' rows with one call of the serving core (in a thread: the replica keeps
        queueing the next batch meanwhile)."""
        return await asyncio.to_thread(serve_together, lambda rows: run_rows(self.service, rows), requests)

    async def serve(self, rows: Sequence[Any]) -> Served:
        """Serve one request's rows in the next batch."""
        result: Served = await self.serve_batch(list(rows))
        return result

    def head_type(self) -> str:
        """The model's head type."""
        return str(self.service.head_type)

    def where(self) -> tuple[int, str]:
        """This replica's process id and Ray node id (the scale-out test checks placement and kills one)."""
        import ray

        return os.getpid(), str(ray.get_runtime_context().get_node_id())


def deployment_for(settings: ModelSettings) -> Any:
    """The bound Ray Serve application of one model: its replicas, CPUs, GPUs and request limits from ``settings``."""
    return ExplainReplica.options(  # type: ignore[attr-defined]
        name=settings.name,
        num_replicas=settings.replicas,
        ray_actor_options={"num_cpus": settings.replica_cpus, "num_gpus": settings.replica_gpus},
        max_ongoing_requests=max(2 * settings.batch_size, 16),
        health_check_period_s=2,
        health_check_timeout_s=30,
    ).bind(settings)


def deploy(settings: ModelSettings) -> DeploymentHandle:
    """Deploy (or update) the model as the Serve application named ``settings.name`` on the connected Ray cluster
    and wait until its replicas are running."""
    handle: DeploymentHandle = serve.run(deployment_for(settings), name=settings.name, route_prefix=None)
    return handle


def attached(settings: ModelSettings) -> DeploymentHandle:
    """The handle of the model's Serve application already running on the cluster (a RayService deployed it)."""
    return serve.get_app_handle(settings.name)


def build_app(args: dict[str, Any]) -> Any:
    """Ray Serve application builder (``import_path: doors.kserve.ray_deployment:build_app`` in a Serve config or a
    KubeRay RayService): ``args`` = ``{"name": ..., "archive": ..., "replicas": optional}``."""
    from pathlib import Path

    from .settings import read_settings

    replicas = args.get("replicas")
    settings = read_settings(str(args["name"]), Path(str(args["archive"])), int(replicas) if replicas else None)
    return deployment_for(settings)


class RayBackend:
    """A door's rows served by the model's Ray Serve replicas (a streaming row's events are sent once it is served:
    a row's listener does not cross to the replicas)."""

    streams = False
    monitor = None  # the rows are served on the replicas

    def __init__(self, settings: ModelSettings, handle: DeploymentHandle | None = None) -> None:
        """Use ``handle``, or deploy the model on :meth:`load`."""
        self.settings = settings
        self._handle = handle

    def load(self) -> str:
        """Deploy the replicas (unless a handle was given) and read the model's head type from one of them."""
        if self._handle is None:
            self._handle = deploy(self.settings)
        head: str = self._handle.head_type.remote().result(timeout_s=self.settings.response_timeout)
        return head

    async def serve(self, rows: Sequence[Any]) -> Served:
        """Serve the rows on a replica.

        Raises:
            UnavailableError: if the replica died with the request in flight (retry it).
        """
        if self._handle is None:
            raise UnavailableError(f"model {self.settings.name} is not deployed")
        try:
            result: Served = await self._handle.serve.remote(list(rows))
        except REPLICA_GONE as error:
            name = self.settings.name
            logger.warning("%s: a replica died with a request in flight (%s)", name, type(error).__name__)
            raise UnavailableError(f"the replica serving this request of {name} stopped; retry") from error
        tracing.record_explanations(result.outcomes)  # under the request's span, in the door's process
        return result

    def close(self) -> None:
        """Nothing to release: the replicas belong to the Serve application (``serve.shutdown()`` stops them)."""
