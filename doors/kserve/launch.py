"""Start and stop the KServe and Ray Serve doors (``make serve SERVER=kserve``, ``SERVER=ray REPLICAS=2``), as the
launcher (:mod:`doors.launch`) calls them.

The door runs as one process (:mod:`doors.kserve.process`) in its own session, its pid in ``RUN_DIR/doors.pid``; for
``ray`` that process also starts (and stops) a local Ray, or joins ``RAY_ADDRESS``. REST listens on
``INFERENCE_PORT`` and gRPC on ``GRPC_INFERENCE_PORT`` (8080 and 7070 as on TorchServe), on 127.0.0.1 unless
``INFERENCE_ADDRESS`` is set (containers, pods). The models are archive folders (``--archive name=folder``): the
default models, or the packages of ``MODELS=``/``MODELS_FILE=`` checkpoints, which the launcher resolves.

``serve`` supervises the server process until it is stopped (``stop``, SIGTERM, Ctrl-C: exit status 0) or ends by
itself (reported with its exit status or signal and its log: exit status 1); ``start`` runs that same ``serve`` in
the background (:mod:`supervise.supervisor`). The process mechanics are :mod:`supervise.processes`'.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from serving_core.registry import task_facts
from supervise.environment import bind_address, env_port
from supervise.processes import (
    Launch,
    http_get,
    loopback,
    python_env,
    refuse_if_running,
    spawn,
    stop_pid_file,
    wait_until,
)
from supervise.supervisor import Child, Supervisor, claimed, stop_supervisor, write_status
from supervise.watchdog import owner_pid, watch
from supervise.workdir import workdir

from .process import DOORS, DoorConfig

if TYPE_CHECKING:
    from doors.launch import LaunchOptions

logger = logging.getLogger(__name__)
PID_FILE = "doors.pid"
CONFIG_FILE = "doors.json"
LOG_FILE = "doors.log"
WATCHDOG_FILE = "doors-watchdog.pid"


@dataclass(frozen=True)
class Door:
    """A started door: where it listens and what it serves."""

    server: str
    run_dir: Path
    address: str
    http_port: int
    grpc_port: int
    pid: int
    models: tuple[str, ...]
    #: How the server process was started and the process itself (a child of the process that started it).
    launch: Launch | None = field(default=None, repr=False, compare=False)
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False, compare=False)

    @property
    def url(self) -> str:
        """Base URL of the REST API."""
        return f"http://{self.address}:{self.http_port}"

    @property
    def grpc_target(self) -> str:
        """``host:port`` of the gRPC API."""
        return f"{self.address}:{self.grpc_port}"


def start(
    server: str,
    models: Mapping[str, str | Path],
    run_dir: Path,
    http_port: int,
    grpc_port: int,
    address: str = "127.0.0.1",
    replicas: int | Mapping[str, int] | None = None,
    ray_address: str | None = None,
    timeout: float = 240.0,
    env: Mapping[str, str] | None = None,
    metrics: tuple[str, int] | None = None,
    attach: bool = False,
) -> Door:
    """Start a door in the background and wait until every model is ready.

    Args:
        server: ``kserve`` or ``ray``.
        models: served name → archive folder.
        run_dir: folder of the pid file, the config and the log (created).
        http_port: REST port.
        grpc_port: gRPC port.
        address: address both bind to.
        replicas: Ray Serve replicas of every model, or per model name (``None``: each model's ``minWorkers``).
        ray_address: an existing Ray cluster to deploy on (``None``: a local one).
        timeout: seconds to wait for readiness.
        env: extra environment variables of the server process.
        metrics: (address, port) of a separate ``/metrics`` endpoint for Prometheus (``None``: only on REST).
        attach: Ray: use the Serve applications already deployed on ``ray_address`` (a KubeRay RayService).

    Raises:
        RuntimeError: if a door already runs from ``run_dir``, or it exits or is not ready in time (it is stopped
            then; the message names the log).
    """
    if server not in DOORS:
        raise ValueError(f"SERVER must be one of torchserve, {', '.join(DOORS)}; got {server!r}")
    models = servable(models)
    run_dir = run_dir.resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    refuse_if_running([run_dir / PID_FILE], f"the {server} door")
    per_model = dict(replicas) if isinstance(replicas, Mapping) else {}
    config = DoorConfig(
        server, {name: str(Path(path).resolve()) for name, path in models.items()}, address, http_port, grpc_port,
        replicas if isinstance(replicas, int) else None, per_model, ray_address, attach=attach,
        metrics_port=metrics[1] if metrics else None, metrics_address=metrics[0] if metrics else "127.0.0.1",
    )  # fmt: skip
    config_path = run_dir / CONFIG_FILE
    config_path.write_text(json.dumps(asdict(config), indent=2), encoding="utf-8")
    process_env = python_env({"RAY_USAGE_STATS_ENABLED": "0", **(env or {})})
    process_env.pop("PROMETHEUS_MULTIPROC_DIR", None)  # the door's metrics live in its own process
    launch = Launch(
        f"the {server} door", (sys.executable, "-m", "doors.kserve.process", str(config_path)), workdir(), process_env,
        run_dir / LOG_FILE, run_dir / PID_FILE,
    )  # fmt: skip
    process = spawn(launch)
    owner = owner_pid()
    if owner is not None:  # EXPLAIN_OWNER_PID (the test suite): the door ends with that process, however it ends
        (run_dir / WATCHDOG_FILE).write_text(str(watch(owner, groups=[process.pid], env=process_env).pid))
    door = Door(server, run_dir, address, http_port, grpc_port, process.pid, tuple(models), launch, process)
    pending = set(door.models)

    def ready() -> bool:
        for name in sorted(pending):
            if http_get(f"http://{loopback(address)}:{http_port}/v2/models/{name}/ready")[0] == 200:
                pending.discard(name)
        return not pending

    try:
        if not wait_until(ready, timeout, [(process, launch)]):
            raise RuntimeError(
                f"the {server} door is not ready after {timeout:.0f} s (waiting for {sorted(pending)}); "
                f"see {launch.log}"
            )
    except BaseException:
        stop(run_dir)
        raise
    return door


def servable(models: Mapping[str, str | Path]) -> dict[str, str | Path]:
    """The models the OIP doors serve: every model whose archive settings read (each task has an OIP codec, its own
    or the generic one of JSON documents, :func:`doors.kserve.oip.codec_for`).

    Raises:
        FileNotFoundError: if a folder has no ``model-config.yaml``.
        ValueError: if a model's setting is invalid.
        RuntimeError: if there is no model.
    """
    from .settings import read_settings

    for name, path in models.items():
        read_settings(name, Path(path))
    if not models:
        raise RuntimeError("no model to serve on the KServe/Ray doors")
    return dict(models)


def stop(run_dir: Path, timeout: float = 30.0) -> bool:
    """Stop the door started from ``run_dir``: its supervisor first, if another process supervises it, then the
    server process by its pid file (SIGTERM to its process group, SIGKILL after ``timeout``) and its watchdog;
    returns whether a door was running."""
    stopped = stop_supervisor(run_dir)
    stopped = stop_pid_file(run_dir / PID_FILE, timeout) or stopped
    stop_pid_file(run_dir / WATCHDOG_FILE, 5.0)
    return stopped


def usage(door: Door, example: tuple[str, str] = ("sentiment", "text")) -> str:
    """How to call the running door (printed by ``make serve SERVER=...``): ``example`` is the (model, task) the
    commands show, with the task's example requests (:attr:`serving_core.registry.TaskFacts.examples`)."""
    model, task = example
    url = door.url
    facts = task_facts(task)
    body, v1_body = facts.examples.oip, facts.examples.v1
    door_name = "KServe model server" if door.server == "kserve" else "KServe door in front of Ray Serve replicas"
    openai = f"  OpenAI API: {url}/v1 (chat/completions, completions, models; any API key)\n" if facts.chat else ""
    return f"""
The explanation service is up on the {door_name} (models: {", ".join(door.models)}); no token on loopback.
  OIP v2 REST (explain extension):
  curl -s -H 'Content-Type: application/json' {url}/v2/models/{model}/infer \\
       -d '{body}'
  KServe v1:  curl -s -H 'Content-Type: application/json' {url}/v1/models/{model}:explain -d '{v1_body}'
{openai}  gRPC (OIP GRPCInferenceService/ModelInfer): {door.grpc_target}
  Health: {url}/v2/health/ready   Metadata: {url}/v2/models/{model}   Metrics: {url}/metrics (and on EXPORTER_PORT)
Log: {door.run_dir / LOG_FILE}. Docs: docs/SERVING.md ("Other doors: KServe and Ray Serve").
"""


def serve(options: LaunchOptions, models: Mapping[str, str], example: tuple[str, str]) -> int:
    """Serve the ``options.server`` door (``kserve`` or ``ray``) with ``models`` (name → archive folder, relative to
    ``options.model_store`` or absolute) on the ports of the environment (``INFERENCE_PORT``,
    ``GRPC_INFERENCE_PORT``, ``EXPORTER_PORT``), print how to call it, and supervise it (:mod:`supervise.supervisor`)
    until it is stopped (returns 0) or its server process ends by itself (says how, returns 1)."""
    run_dir = options.run_dir
    archives = {name: options.model_store / path for name, path in models.items()}
    http_port, grpc_port = env_port("inference", 8080), env_port("grpc_inference", 7070)
    metrics = (bind_address("METRICS_ADDRESS"), env_port("exporter", 8083))
    with claimed(run_dir):
        try:
            door = start(
                options.server, archives, run_dir, http_port, grpc_port, bind_address("INFERENCE_ADDRESS"),
                options.replicas, options.ray_address, metrics=metrics, attach=options.attach,
            )  # fmt: skip
        except Exception as error:
            logger.error("the %s door did not start: %s", options.server, error,
                         exc_info=not isinstance(error, RuntimeError))  # fmt: skip
            write_status(run_dir, "failed", f"the {options.server} door did not start: {error}")
            return 1
        text = usage(door, example)
        print(text, flush=True)
        write_status(run_dir, "ready", text)
        assert door.launch is not None and door.process is not None
        child = Child("door", door.launch, door.process)
        return Supervisor(run_dir, [child], lambda: stop(run_dir), owner=owner_pid()).run()
