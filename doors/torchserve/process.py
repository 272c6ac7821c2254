"""Process control: start the explanation-metrics exporter, TorchServe's Java frontend and, when a model is a
generation model (the OpenAI API) or has an explanation pool, or the deployment keeps records (``EXPLAIN_RECORDS``:
the router answers ``/v1/records``), the router in front of it (the public inference ports;
TorchServe listens on loopback behind it) in the background, wait until every model has a ready worker, and stop them
by their pid files (the mechanics are :mod:`supervise.processes`; :mod:`doors.torchserve.supervision` watches them
under ``serve``).

TorchServe's own ``torchserve`` command keeps one pid file per machine (``$TMPDIR/.model_server.pid``) and refuses
to start a second server, so the Java frontend is run here directly (the same command line) with a private temp
folder, which lets tests start servers on free ports beside a running one. Runtime state lives in the run folder
(default ``run/`` of the working directory, :mod:`supervise.workdir`; git-ignored in a clone): ``config.properties``,
``key_file.json`` (tokens), ``logs/``, the pid files, ``prometheus/`` (the workers' metric files) and, with the Batch
API on, ``batch_api/`` (its files and batches, kept across restarts).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from doors.models import DEFAULT_MODELS, default_model_store, missing_archives
from doors.torchserve.config import MAX_REQUEST_SIZE, Ports, link_store, write_config
from records import records_settings
from records.keys import ensure_records_key
from serving_core.recording import served_version
from supervise.environment import bind_address, run_dir_from_env
from supervise.processes import (
    Launch,
    accepting,
    http_get,
    python_env,
    refuse_if_running,
    spawn,
    stop_pid_file,
    wait_until,
)
from supervise.supervisor import stop_supervisor
from supervise.watchdog import owner_pid, watch
from supervise.workdir import workdir

TS_PID = "torchserve.pid"
EXPORTER_PID = "exporter.pid"
ROUTER_PID = "router.pid"
PORTS_FILE = "ports.json"
WATCHDOG_PID = "watchdog.pid"
#: The Batch API's state folder (:mod:`doors.torchserve.batch_door`), in the run folder.
BATCH_STATE = "batch_api"

__all__ = ["Server", "java_command", "start", "stop", "wait_ready"]


@dataclass
class Server:
    """A started service: pids, ports and where its state lives."""

    run_dir: Path
    ports: Ports
    torchserve_pid: int
    exporter_pid: int
    models: tuple[str, ...]
    #: The models served with an explanation pool (``<name>.explain``), behind the router.
    pools: tuple[str, ...] = ()
    #: The router's pid, when it takes the public inference ports.
    router_pid: int | None = None
    #: How each process was started (``torchserve``, ``exporter``, ``router``), to start it again.
    launches: Mapping[str, Launch] = field(default_factory=dict, repr=False, compare=False)
    #: The processes, where this process started them (children of this process).
    processes: Mapping[str, subprocess.Popen[bytes]] = field(default_factory=dict, repr=False, compare=False)
    #: The generation models, which the router's OpenAI API serves.
    generation: tuple[str, ...] = ()

    @property
    def keys(self) -> dict[str, str]:
        """The tokens TorchServe wrote to ``key_file.json``: ``inference``, ``management``, ``API``."""
        document = json.loads((self.run_dir / "key_file.json").read_text(encoding="utf-8"))
        return {name: entry["key"] for name, entry in document.items()}

    @property
    def inference_url(self) -> str:
        """Base URL of the REST inference API."""
        return f"http://127.0.0.1:{self.ports.inference}"

    @property
    def log_dir(self) -> Path:
        """TorchServe's log folder."""
        return self.run_dir / "logs"


def java_command(config: Path, model_store: Path, tmp_dir: Path, models: list[str]) -> list[str]:
    """The command line ``torchserve --start`` would run for the Java frontend, with its own temp folder.

    Raises:
        FileNotFoundError: if no ``java`` is found (the message says what to install).
    """
    import ts

    ts_home = Path(ts.__file__).resolve().parent.parent
    java_home = os.environ.get("JAVA_HOME")
    java = str(Path(java_home) / "bin" / "java") if java_home else "java"
    if shutil.which(java) is None:
        raise FileNotFoundError("java not found: install a Java 17 runtime (openjdk-17-jre-headless) or set JAVA_HOME")
    command = [java, f"-Dmodel_server_home={ts_home}", f"-Djava.io.tmpdir={tmp_dir}"]
    command += ["-cp", f".:{ts_home / 'ts' / 'frontend' / '*'}"]
    command += ["org.pytorch.serve.ModelServer", "--python", sys.executable, "-f", str(config)]
    command += ["-s", str(model_store.resolve()), "-ncs", "-m", *[f"{name}={name}" for name in models]]
    return command


def start(
    run_dir: Path | None = None,
    model_store: Path | None = None,
    models: Mapping[str, str] | None = None,
    ports: Ports | None = None,
    timeout: float = 180.0,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
    router: bool | None = None,
    batches: bool | None = None,
) -> Server:
    """Start the exporter and TorchServe in the background and wait until every model's worker is ready.

    With ``EXPLAIN_OWNER_PID`` set (the test suite sets it to the pytest process), a
    :mod:`~supervise.watchdog` ends both process groups when that process ends, however it ends.

    Args:
        run_dir: Folder for runtime state (created; the previous metric files are cleared). Default:
            :func:`~supervise.environment.run_dir_from_env` (``RUN_DIR``, else ``run/`` of the working directory).
        model_store: TorchServe model store; ``models`` paths are relative to it. Default:
            :func:`~doors.torchserve.config.default_model_store`.
        models: Model name → archive folder (default: the two default models).
        ports: Ports (default: :meth:`Ports.from_env`).
        timeout: Seconds to wait for readiness.
        overrides: Per served name, ``model-config.yaml`` keys to change (see :func:`load_profile`).
        router: Put the router on the public inference ports (``None``: when it has work, a generation model to answer
            the OpenAI API for or an explanation pool to route to; it costs plain predictions a few per cent of
            latency under concurrency, docs/SERVING.md "OpenAI API").
        batches: Answer the OpenAI Batch API on the inference port (the router then runs; state in
            ``run_dir/batch_api``, docs/BATCH.md "The Batch API"). ``None``: when ``EXPLAIN_BATCHES`` is ``1``.

    Raises:
        RuntimeError: if a server is already running from ``run_dir`` or TorchServe does not become ready (the
            processes are stopped and the message names the log folder).
    """
    models = dict(models or DEFAULT_MODELS)
    ports = ports or Ports.from_env()
    run_dir = (run_dir or run_dir_from_env()).resolve()
    model_store = model_store or default_model_store()
    cwd = workdir()
    run_dir.mkdir(parents=True, exist_ok=True)
    refuse_if_running([run_dir / name for name in (TS_PID, EXPORTER_PID, ROUTER_PID)], "TorchServe")
    missing = missing_archives(model_store, models)
    if missing:
        raise FileNotFoundError(f"no archive for {missing} under {model_store}: run `python -m model_store.build`")
    metrics_dir = run_dir / "prometheus"
    shutil.rmtree(metrics_dir, ignore_errors=True)
    metrics_dir.mkdir()
    tmp_dir = run_dir / "tmp"
    tmp_dir.mkdir(exist_ok=True)
    (run_dir / "key_file.json").unlink(missing_ok=True)
    env = python_env(
        {
            "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
            "TMPDIR": str(tmp_dir),
            "TEMP": str(tmp_dir),
            "LOG_LOCATION": str(run_dir / "logs"),
            "METRICS_LOCATION": str(run_dir / "logs"),
        }
    )
    store = link_store(run_dir, model_store, models, overrides or {})
    if batches is None:
        batches = os.environ.get("EXPLAIN_BATCHES", "").lower() in ("1", "true", "yes")
    keeps_records = records_settings(None, None, "EXPLAIN_RECORDS") is not None
    routed = bool(store.pools or store.generation or batches or keeps_records) if router is None else router or batches
    config = write_config(run_dir, ports, store.path, behind_router=routed)
    launches = {
        "exporter": Launch(
            "the metrics exporter", tuple(exporter_command(ports, metrics_dir)), cwd, env,
            run_dir / "exporter.log", run_dir / EXPORTER_PID,
        ),
        "torchserve": Launch(
            "TorchServe", tuple(java_command(config, store.path, tmp_dir, list(store.served))), run_dir, env,
            run_dir / "torchserve.out", run_dir / TS_PID,
        ),
    }  # fmt: skip
    if routed:  # the router takes the public inference ports
        batch_models = {name: store.path / name for name in models} if batches else None
        command = tuple(router_command(ports, store.pools, store.generation, batch_models, run_dir / BATCH_STATE))
        if keeps_records:
            command += tuple(records_arguments(run_dir, model_store, models))
        launches["router"] = Launch("the router", command, cwd, env, run_dir / "router.log", run_dir / ROUTER_PID)
    processes = {name: spawn(launch) for name, launch in launches.items()}
    owner = owner_pid()
    if owner is not None:  # EXPLAIN_OWNER_PID: the servers end with that process, even if it is SIGKILLed
        guard = watch(owner, groups=[process.pid for process in processes.values()], env=env)
        (run_dir / WATCHDOG_PID).write_text(str(guard.pid))
    (run_dir / PORTS_FILE).write_text(json.dumps(asdict(ports)))
    front = processes.get("router")
    server = Server(
        run_dir, ports, processes["torchserve"].pid, processes["exporter"].pid, tuple(models), store.pools,
        front.pid if front is not None else None, launches, processes, store.generation,
    )  # fmt: skip
    try:
        wait_ready(server, timeout, served=store.served)
    except BaseException:
        stop(run_dir)
        raise
    if keeps_records:  # beside the keys TorchServe wrote when it started
        ensure_records_key(run_dir / "key_file.json")
    return server


def exporter_command(ports: Ports, metrics_dir: Path) -> list[str]:
    """The command line of the explanation-metrics exporter (``doors.torchserve.exporter``), serving ``metrics_dir``."""
    command = [
        sys.executable,
        "-m",
        "doors.torchserve.exporter",
        "--dir",
        str(metrics_dir),
        "--port",
        str(ports.exporter),
    ]
    return [*command, "--address", bind_address("METRICS_ADDRESS")]


def router_command(
    ports: Ports, pools: tuple[str, ...], generation: tuple[str, ...] = (),
    batch_models: Mapping[str, Path] | None = None, batch_root: Path | None = None,
) -> list[str]:  # fmt: skip
    """The command line of the router (:mod:`doors.torchserve.router`): the public inference ports, TorchServe's
    behind it; explanation pools for ``pools``, the OpenAI API for ``generation``, the Batch API (state in
    ``batch_root``) for ``batch_models`` (name → archive folder) unless ``None``."""
    command = [sys.executable, "-m", "doors.torchserve.router", "--listen", bind_address("INFERENCE_ADDRESS")]
    command += ["--rest-port", str(ports.inference), "--grpc-port", str(ports.grpc_inference)]
    command += ["--upstream-rest-port", str(ports.upstream_inference)]
    command += ["--upstream-grpc-port", str(ports.upstream_grpc_inference)]
    command += ["--max-body", str(MAX_REQUEST_SIZE)]  # TorchServe's own bound, refused before it is read
    for name in pools:
        command += ["--pool", name]
    for name in generation:
        command += ["--generation", name]
    if batch_models is not None and batch_root is not None:
        command += ["--batch-root", str(batch_root)]
        for name, path in batch_models.items():
            command += ["--batch-model", f"{name}={path}"]
    return command


def records_arguments(run_dir: Path, model_store: Path, models: Mapping[str, str]) -> list[str]:
    """The router's records arguments (:mod:`doors.torchserve.records_door`): the key file, and each model's version
    (its archive's fingerprint, :func:`serving_core.recording.served_version`; empty when it has none)."""
    arguments = ["--records-key-file", str(run_dir / "key_file.json")]
    for name, archive in models.items():
        arguments += ["--model-version", f"{name}={served_version(model_store / archive) or ''}"]
    return arguments


def wait_ready(server: Server, timeout: float, served: tuple[str, ...] | None = None) -> None:
    """Wait until each of ``served`` (default: the server's models) has a READY worker and the router, if any, is
    accepting connections.

    Raises:
        RuntimeError: if TorchServe or the router exits (:class:`~supervise.processes.ExitedEarlyError`), or ``timeout``
            seconds pass.
    """
    management = f"http://127.0.0.1:{server.ports.management}"
    pending = set(served or server.models)
    router = "router" in server.launches

    def ready() -> bool:
        if pending and (server.run_dir / "key_file.json").is_file():
            with contextlib.suppress(OSError, ValueError, KeyError):
                headers = {"Authorization": f"Bearer {server.keys['management']}"}
                for name in sorted(pending):
                    status, body = http_get(f"{management}/models/{name}", headers)
                    workers = json.loads(body)[0].get("workers", []) if status == 200 else []
                    if any(worker.get("status") == "READY" for worker in workers):
                        pending.discard(name)
        return not pending and (not router or accepting(bind_address("INFERENCE_ADDRESS"), server.ports.inference))

    watched = [
        (server.processes[name], server.launches[name]) for name in ("torchserve", "router") if name in server.processes
    ]
    if not wait_until(ready, timeout, watched):
        waiting = sorted(pending)
        raise RuntimeError(f"TorchServe not ready after {timeout:.0f} s (waiting for {waiting}); see {server.run_dir}")


def stop(run_dir: Path | None = None) -> bool:
    """Stop the service started from ``run_dir`` (default: :func:`~supervise.environment.run_dir_from_env`): its
    supervisor first, if another process supervises it (so that nothing is restarted or reported as a failure), then
    what is left by its pid files; returns whether anything was running."""
    run_dir = run_dir or run_dir_from_env()
    stopped = stop_supervisor(run_dir)
    for pid_name in (ROUTER_PID, TS_PID, EXPORTER_PID):
        stopped = stop_pid_file(run_dir / pid_name) or stopped
    stop_pid_file(run_dir / WATCHDOG_PID)  # nothing left to guard
    return stopped
