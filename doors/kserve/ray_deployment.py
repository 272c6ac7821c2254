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
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ray import serve
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError
from ray.serve.handle import DeploymentHandle

from monitoring.config import parse_monitor
from monitoring.serving import start_monitor
from records.recorder import Recorder
from serving_core import tracing, wire
from serving_core.recording import served_version
from serving_core.task import BatchTimings, get_task
from supervise.workdir import WORKDIR_ENV, workdir

from .backends import UnavailableError, load_service, run_rows
from .batching import Served, serve_traced
from .row_records import RequestRecords, commit_batch
from .settings import ModelSettings

logger = logging.getLogger(__name__)

#: The door the replicas' records name.
DOOR = "ray"
#: Errors that mean "the replica this request went to is gone": retryable.
REPLICA_GONE = (ActorDiedError, ActorUnavailableError, RayActorError)


@dataclass(frozen=True)
class ReplicaRequest:
    """One request's rows as a replica receives them: the rows, their records (None: none kept), and the
    ``traceparent`` of the door's request span (the batch span links to it)."""

    rows: list[Any]
    records: RequestRecords | None = None
    traceparent: str | None = None


def _row_count(requests: list[ReplicaRequest]) -> int:
    """``@serve.batch`` counts rows, not requests (a request may carry several)."""
    return sum(len(request.rows) for request in requests)


@serve.deployment(ray_actor_options={"num_cpus": 1})
class ExplainReplica:
    """One replica: the serving core for one model, its records and its monitor."""

    def __init__(self, settings: ModelSettings) -> None:
        """Load the model, open its recorder (its ``records:`` section, else ``EXPLAIN_RECORDS``), start its monitor
        (``handler.monitor``) and size the batches from its settings.

        Raises:
            ValueError: if the monitor setting, or its baseline or canary file, is not valid.
            SettingsError: if the records settings are not usable.
        """
        self.settings = settings
        self.service = load_service(settings)
        config = settings.config
        self._serving = threading.Lock()
        self.recorder = Recorder.open(settings.name, config.records)
        self.version = served_version(settings.archive)
        self.monitor = start_monitor(settings.name, get_task(config.task), config, self.service, config.monitor,
                                     base=settings.archive, is_idle=lambda: not self._serving.locked(),
                                     lock=self._serving)  # fmt: skip
        batcher: Any = self.serve_batch  # Ray's batch handler: its setters are not in the method's type
        batcher.set_max_batch_size(settings.batch_size)
        batcher.set_batch_wait_timeout_s(settings.max_batch_delay)
        logger.info("replica of %s ready (pid %d)", settings.name, os.getpid())

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.002, batch_size_fn=_row_count)
    async def serve_batch(self, requests: list[ReplicaRequest]) -> list[Served]:
        """Serve the batched requests' rows with one call of the serving core (in a thread: the replica keeps
        queueing the next batch meanwhile)."""
        return await asyncio.to_thread(self._serve_batch, requests)

    def _serve_batch(self, requests: list[ReplicaRequest]) -> list[Served]:
        """One batch, in a batch span linked to each request's span; each row handed to the monitor, and the batch's
        records committed (one transaction) before it is answered."""
        links = [tracing.remote_span_context(request.traceparent) for request in requests]
        served = serve_traced(self._run, [request.rows for request in requests], links)
        if self.monitor is not None:
            for request, share in zip(requests, served, strict=True):
                for row, outcome in zip(request.rows, share.outcomes, strict=True):
                    self.monitor.observe(row, outcome)
        recorded = [(index, request.records) for index, request in enumerate(requests) if request.records is not None]
        config = self.settings.config
        task = get_task(config.task)
        answers = [
            [wire.error_document(o.error) if o.error is not None else task.to_dict(o, config) for o in share.outcomes]
            for share in served
        ]
        refusals = commit_batch(self.recorder, [(records, answers[index]) for index, records in recorded],
                                task=config.task, door=DOOR, version=self.version)  # fmt: skip
        results = list(served)
        for (index, _), refused in zip(recorded, refusals, strict=True):
            results[index] = replace(served[index], refusals=refused)
        return results

    def _run(self, rows: list[Any]) -> tuple[list[Any], BatchTimings]:
        """One batch on the service, holding the serving lock (the monitor's canaries take turns with it)."""
        with self._serving:
            return run_rows(self.service, rows)

    async def serve(self, request: ReplicaRequest) -> Served:
        """Serve one request's rows in the next batch."""
        result: Served = await self.serve_batch(request)
        return result

    def head_type(self) -> str:
        """The model's head type."""
        return str(self.service.head_type)

    def where(self) -> tuple[int, str]:
        """This replica's process id and Ray node id (the scale-out test checks placement and kills one)."""
        import ray

        return os.getpid(), str(ray.get_runtime_context().get_node_id())


#: What the replicas' environment takes from the door's: the records settings and the working directory (a
#: relative SQLite store and the HTTP sink's salt resolve as in the door), and the OpenTelemetry settings.
FORWARDED_PREFIXES = ("EXPLAIN_RECORDS", "OTEL_")


def replica_env(environ: Mapping[str, str] | None = None, metrics_folder: Path | None = None) -> dict[str, str]:
    """The environment variables the door gives its replicas (:data:`FORWARDED_PREFIXES`, ``EXPLAIN_WORKDIR``, and
    ``PROMETHEUS_MULTIPROC_DIR`` for the monitors' metrics when ``metrics_folder`` is given:
    :mod:`doors.kserve.replica_metrics`), so that replicas on another node of a cluster record and trace as the
    door's own process would."""
    env = os.environ if environ is None else environ
    forwarded = {name: value for name, value in env.items() if name.startswith(FORWARDED_PREFIXES)}
    forwarded[WORKDIR_ENV] = str(workdir())
    if metrics_folder is not None:
        forwarded["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_folder)
    return forwarded


def deployment_for(settings: ModelSettings, env: Mapping[str, str] | None = None) -> Any:
    """The bound Ray Serve application of one model: its replicas, CPUs, GPUs and request limits from ``settings``;
    ``env``: the replicas' environment variables (:func:`replica_env`)."""
    actor_options: dict[str, Any] = {"num_cpus": settings.replica_cpus, "num_gpus": settings.replica_gpus}
    if env:
        actor_options["runtime_env"] = {"env_vars": dict(env)}
    return ExplainReplica.options(  # type: ignore[attr-defined]
        name=settings.name,
        num_replicas=settings.replicas,
        ray_actor_options=actor_options,
        max_ongoing_requests=max(2 * settings.batch_size, 16),
        health_check_period_s=2,
        health_check_timeout_s=30,
    ).bind(settings)


def deploy(settings: ModelSettings, env: Mapping[str, str] | None = None) -> DeploymentHandle:
    """Deploy (or update) the model as the Serve application named ``settings.name`` on the connected Ray cluster
    (its replicas' environment variables ``env``) and wait until its replicas are running."""
    handle: DeploymentHandle = serve.run(deployment_for(settings, env), name=settings.name, route_prefix=None)
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
    """A door's rows served by the model's Ray Serve replicas, which record them and run the model's monitor (a
    streaming row's events are sent once it is served: a row's listener does not cross to the replicas)."""

    streams = False
    monitor = None  # the rows are served, and monitored, on the replicas
    records = True
    door = DOOR

    def __init__(
        self, settings: ModelSettings, handle: DeploymentHandle | None = None, env: Mapping[str, str] | None = None
    ) -> None:
        """Use ``handle``, or deploy the model on :meth:`load` with the replicas' environment variables ``env``
        (:func:`replica_env`)."""
        self.settings = settings
        self._handle = handle
        self._env = env

    def load(self) -> str:
        """Deploy the replicas (unless a handle was given) and read the model's head type from one of them.

        Raises:
            MonitorConfigError: the model's ``monitor:`` setting is not valid (refused before any replica starts).
        """
        if self._handle is None:
            parse_monitor(self.settings.config.monitor, self.settings.archive)
            self._handle = deploy(self.settings, self._env)
        head: str = self._handle.head_type.remote().result(timeout_s=self.settings.response_timeout)
        return head

    async def serve(self, rows: Sequence[Any], records: RequestRecords | None = None) -> Served:
        """Serve the rows on a replica, which commits their ``records`` before it answers; the batch's span there
        links to the current span (the door's request span; else the caller's ``traceparent``).

        Raises:
            UnavailableError: if the replica died with the request in flight (retry it).
        """
        if self._handle is None:
            raise UnavailableError(f"model {self.settings.name} is not deployed")
        traceparent = tracing.outgoing_headers(None).get(tracing.TRACEPARENT)
        if traceparent is None and records is not None:
            traceparent = records.traceparent
        try:
            request = ReplicaRequest(list(rows), records, traceparent)
            result: Served = await self._handle.serve.remote(request)
        except REPLICA_GONE as error:
            name = self.settings.name
            logger.warning("%s: a replica died with a request in flight (%s)", name, type(error).__name__)
            raise UnavailableError(f"the replica serving this request of {name} stopped; retry") from error
        tracing.record_explanations(result.outcomes)  # under the request's span, in the door's process
        return result

    def close(self) -> None:
        """Nothing to release: the replicas belong to the Serve application (``serve.shutdown()`` stops them)."""
