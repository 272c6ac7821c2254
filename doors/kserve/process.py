"""The door's server process: ``python -m doors.kserve.process CONFIG.json`` loads the models and serves them with
KServe's model server until SIGTERM.

``CONFIG.json`` (written by :mod:`doors.kserve.launch`) names the door (``kserve``: the models in this process;
``ray``: the models as Ray Serve deployments behind this process's KServe door), the models (served name → archive
folder), the address and ports, and for Ray the replicas (``replicas`` for every model, ``model_replicas`` per
model) and the cluster to join (``ray_address``; absent: a local Ray started here and stopped on exit, with
``ray_cpus`` CPUs; ``attach``: use the Serve applications already running there, as a KubeRay RayService deploys
them, instead of deploying). ``metrics_port`` also serves ``/metrics`` (KServe's request histograms and the
explanation metrics) on ``metrics_address`` for Prometheus, apart from the REST port. The OpenAI Batch API
(:mod:`doors.kserve.batch_routes`) keeps its files and batches in ``batch_api/`` beside ``CONFIG.json``. When the
deployment keeps records (``EXPLAIN_RECORDS``), the REST port also has the ``/v1/records`` routes
(:mod:`doors.kserve.records_routes`), behind the records key of ``key_file.json`` beside ``CONFIG.json``. Ray Serve
replicas record the rows they serve and run the model's monitor; a local Ray's replicas write their monitors'
metrics to ``replica-metrics/`` beside ``CONFIG.json``, which this process's ``/metrics`` reads
(:mod:`doors.kserve.replica_metrics`).
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from doors import DOORS as ALL_DOORS

from .settings import ModelSettings, read_settings

logger = logging.getLogger(__name__)

#: The Batch API's state folder, in the run folder (beside ``CONFIG.json``).
BATCH_STATE = "batch_api"
#: The door's tokens, in its run folder: the records key (``records``), as TorchServe keeps its own.
KEY_FILE = "key_file.json"

#: The doors this process serves: those of :data:`doors.DOORS` whose launch module is this package's.
DOORS = tuple(name for name, door in ALL_DOORS.items() if door.module == "doors.kserve.launch")


@dataclass(frozen=True)
class DoorConfig:
    """What the server process serves (see the module docstring)."""

    server: str
    models: Mapping[str, str]
    address: str = "127.0.0.1"
    http_port: int = 8080
    grpc_port: int = 7070
    replicas: int | None = None
    model_replicas: Mapping[str, int] = field(default_factory=dict)
    ray_address: str | None = None
    ray_cpus: float | None = None
    attach: bool = False
    metrics_port: int | None = None
    metrics_address: str = "127.0.0.1"
    grpc_threads: int = 4
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def read(cls, path: Path) -> DoorConfig:
        """Read ``path``.

        Raises:
            ValueError: for an unknown door or missing models.
        """
        document = json.loads(path.read_text(encoding="utf-8"))
        config = cls(**document)
        if config.server not in DOORS:
            raise ValueError(f"server must be one of {DOORS}, got {config.server!r}")
        if not config.models:
            raise ValueError("no models to serve")
        return config

    def settings(self) -> list[ModelSettings]:
        """Each model's settings from its archive folder."""
        return [
            read_settings(name, Path(path), self.model_replicas.get(name, self.replicas))
            for name, path in self.models.items()
        ]


@contextmanager
def ray_cluster(config: DoorConfig, settings: list[ModelSettings]) -> Iterator[None]:
    """Join ``config.ray_address``, or start a local Ray sized for the replicas; Serve's HTTP proxy stays off (the
    KServe door in this process is the way in). Stops what it started on exit."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray
    from ray import serve

    if config.ray_address:
        ray.init(address=config.ray_address, logging_level=logging.WARNING, log_to_driver=False)
    else:
        cpus = math.ceil(config.ray_cpus or sum(s.replicas * s.replica_cpus for s in settings))
        ray.init(num_cpus=cpus, include_dashboard=False, object_store_memory=200 * 1024**2,
                 logging_level=logging.WARNING, log_to_driver=False)  # fmt: skip
    try:
        if not config.attach:
            serve.start(proxy_location="Disabled")
        yield
    finally:
        try:
            if config.attach:  # the applications belong to whoever deployed them
                pass
            elif config.ray_address:  # a shared cluster: remove only this door's applications
                for model in settings:
                    serve.delete(model.name, _blocking=False)
            else:
                serve.shutdown()
        finally:
            ray.shutdown()


def main(argv: list[str] | None = None) -> int:
    """Load and serve (blocks until SIGTERM/SIGINT)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m doors.kserve.process CONFIG.json", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    for name in ("kserve.trace", "uvicorn.access"):  # one line per request: only at DEBUG
        logging.getLogger(name).setLevel(logging.WARNING)
    config = DoorConfig.read(Path(args[0]))
    settings = config.settings()
    from explain_client.protos import explain_messages

    explain_messages()  # the explanation stubs, generated on first use if missing
    if config.server == "kserve":
        from .backends import LocalBackend

        _serve(config, [LocalBackend(model) for model in settings], Path(args[0]).parent)
        return 0
    from .ray_deployment import RayBackend, attached, replica_env
    from .replica_metrics import export_replica_metrics, replica_folder

    run_dir = Path(args[0]).parent
    folder = None
    if not config.ray_address and not config.attach:  # the replicas run on this machine: their metrics come here
        folder = replica_folder(run_dir)
        export_replica_metrics(folder)
    env = replica_env(metrics_folder=folder)
    with ray_cluster(config, settings):
        backends = [RayBackend(model, attached(model) if config.attach else None, env) for model in settings]
        _serve(config, backends, run_dir)
    return 0


def _serve(config: DoorConfig, backends: list[Any], run_dir: Path) -> None:
    from kserve.model_server import app

    from .batch_routes import add_batch_api
    from .kserve_model import ExplainModel
    from .kserve_server import ExplainModelServer
    from .records_routes import add_records_routes

    if config.metrics_port is not None:
        from prometheus_client import start_http_server

        start_http_server(config.metrics_port, addr=config.metrics_address)
        logger.info("metrics on %s:%d/metrics", config.metrics_address, config.metrics_port)
    models = [ExplainModel(backend) for backend in backends]
    for model in models:
        model.load()
        logger.info("model %s ready (%s head, %s door)", model.name, model.head_type, config.server)
    add_batch_api(app, models, run_dir / BATCH_STATE)
    add_records_routes(app, {model.name: model for model in models}, run_dir / KEY_FILE)
    server = ExplainModelServer(config.address, config.http_port, config.grpc_port, config.grpc_threads)
    server.serve(models)


if __name__ == "__main__":
    sys.exit(main())
