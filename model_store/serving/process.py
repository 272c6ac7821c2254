"""Process control: start the explanation-metrics exporter and TorchServe's Java frontend in the background, wait
until every model has a ready worker, and stop both by their pid files.

TorchServe's own ``torchserve`` command keeps one pid file per machine (``$TMPDIR/.model_server.pid``) and refuses
to start a second server, so the Java frontend is run here directly (the same command line) with a private temp
folder, which lets tests start servers on free ports beside a running one. Runtime state lives in the run folder
(default ``run/``, git-ignored): ``config.properties``, ``key_file.json`` (tokens), ``logs/``, the pid files and
``prometheus/`` (the workers' metric files).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from model_store.serving.archives import DEFAULT_MODELS, missing_archives
from model_store.serving.config import (
    DEFAULT_MODEL_STORE,
    DEFAULT_RUN_DIR,
    REPO_ROOT,
    Ports,
    bind_address,
    link_store,
    write_config,
)
from model_store.serving.watchdog import owner_pid, pid_alive, watch

TS_PID = "torchserve.pid"
EXPORTER_PID = "exporter.pid"
ROUTER_PID = "router.pid"
PORTS_FILE = "ports.json"
WATCHDOG_PID = "watchdog.pid"

__all__ = ["Server", "java_command", "pid_alive", "spawn", "start", "stop", "terminate", "wait_ready"]


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
    router_pid: int | None = None

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


def spawn(command: list[str], cwd: Path, env: dict[str, str], log: Path, pid_file: Path) -> subprocess.Popen[bytes]:
    """Start ``command`` in its own session (so ``stop`` can kill its whole group), appending its output to ``log``
    and recording its pid in ``pid_file``."""
    with log.open("ab") as output:
        process = subprocess.Popen(
            command, cwd=cwd, env=env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True
        )
    pid_file.write_text(str(process.pid))
    return process


def start(
    run_dir: Path = DEFAULT_RUN_DIR,
    model_store: Path = DEFAULT_MODEL_STORE,
    models: Mapping[str, str] | None = None,
    ports: Ports | None = None,
    timeout: float = 180.0,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
) -> Server:
    """Start the exporter and TorchServe in the background and wait until every model's worker is ready.

    With ``EXPLAIN_OWNER_PID`` set (the test suite sets it to the pytest process), a
    :mod:`~model_store.serving.watchdog` ends both process groups when that process ends, however it ends.

    Args:
        run_dir: Folder for runtime state (created; the previous metric files are cleared).
        model_store: TorchServe model store; ``models`` paths are relative to it.
        models: Model name → archive folder (default: the two default models).
        ports: Ports (default: :meth:`Ports.from_env`).
        timeout: Seconds to wait for readiness.
        overrides: Per served name, ``model-config.yaml`` keys to change (see :func:`load_profile`).

    Raises:
        RuntimeError: if a server is already running from ``run_dir`` or TorchServe does not become ready (the
            processes are stopped and the message names the log folder).
    """
    models = dict(models or DEFAULT_MODELS)
    ports = ports or Ports.from_env()
    run_dir = run_dir.resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    for pid_name in (TS_PID, EXPORTER_PID, ROUTER_PID):
        pid_file = run_dir / pid_name
        if pid_file.is_file() and pid_alive(int(pid_file.read_text().strip() or 0)):
            raise RuntimeError(f"already running from {run_dir} (pid file {pid_file}); run `make stop` first")
    missing = missing_archives(model_store, models)
    if missing:
        raise FileNotFoundError(f"no archive for {missing} under {model_store}: run `python -m model_store.build`")
    metrics_dir = run_dir / "prometheus"
    shutil.rmtree(metrics_dir, ignore_errors=True)
    metrics_dir.mkdir()
    tmp_dir = run_dir / "tmp"
    tmp_dir.mkdir(exist_ok=True)
    (run_dir / "key_file.json").unlink(missing_ok=True)
    env = {
        **os.environ,
        "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
        "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "TMPDIR": str(tmp_dir),
        "TEMP": str(tmp_dir),
        "LOG_LOCATION": str(run_dir / "logs"),
        "METRICS_LOCATION": str(run_dir / "logs"),
    }
    store = link_store(run_dir, model_store, models, overrides or {})
    config = write_config(run_dir, ports, store.path, behind_router=bool(store.pools))
    exporter = spawn(
        [
            *(sys.executable, "-m", "handlers.exporter", "--dir", str(metrics_dir)),
            *("--port", str(ports.exporter), "--address", bind_address("METRICS_ADDRESS")),
        ],
        REPO_ROOT,
        env,
        run_dir / "exporter.log",
        run_dir / EXPORTER_PID,
    )
    java = spawn(
        java_command(config, store.path, tmp_dir, list(store.served)),
        run_dir,
        env,
        run_dir / "torchserve.out",
        run_dir / TS_PID,
    )
    router = None
    if store.pools:  # explanation pools: the router takes the public inference ports
        router = spawn(router_command(ports, store.pools), REPO_ROOT, env, run_dir / "router.log", run_dir / ROUTER_PID)
    owner = owner_pid()
    if owner is not None:  # EXPLAIN_OWNER_PID: the servers end with that process, even if it is SIGKILLed
        groups = [java.pid, exporter.pid, *([router.pid] if router is not None else [])]
        guard = watch(owner, groups=groups, env=env)
        (run_dir / WATCHDOG_PID).write_text(str(guard.pid))
    (run_dir / PORTS_FILE).write_text(json.dumps(asdict(ports)))
    server = Server(
        run_dir, ports, java.pid, exporter.pid, tuple(models), store.pools, router.pid if router is not None else None
    )
    try:
        wait_ready(server, java, timeout, served=store.served, router=router)
    except BaseException:
        stop(run_dir)
        raise
    return server


def router_command(ports: Ports, pools: tuple[str, ...]) -> list[str]:
    """The command line of the explanation-pool router (:mod:`model_store.serving.router`): the public inference
    ports, TorchServe's behind it."""
    command = [sys.executable, "-m", "model_store.serving.router", "--listen", bind_address("INFERENCE_ADDRESS")]
    command += ["--rest-port", str(ports.inference), "--grpc-port", str(ports.grpc_inference)]
    command += ["--upstream-rest-port", str(ports.upstream_inference)]
    command += ["--upstream-grpc-port", str(ports.upstream_grpc_inference)]
    for name in pools:
        command += ["--pool", name]
    return command


def _get(url: str, token: str | None, timeout: float = 5.0) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def wait_ready(
    server: Server,
    process: subprocess.Popen[bytes],
    timeout: float,
    served: tuple[str, ...] | None = None,
    router: subprocess.Popen[bytes] | None = None,
) -> None:
    """Wait until each of ``served`` (default: the server's models) has a READY worker and ``router``, if any, is
    accepting connections.

    Raises:
        RuntimeError: if TorchServe or the router exits, or ``timeout`` seconds pass.
    """
    deadline = time.monotonic() + timeout
    management = f"http://127.0.0.1:{server.ports.management}"
    pending = set(served or server.models)
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"TorchServe exited with {process.returncode}; see {server.run_dir / 'torchserve.out'}")
        if router is not None and router.poll() is not None:
            raise RuntimeError(f"the router exited with {router.returncode}; see {server.run_dir / 'router.log'}")
        if pending and (server.run_dir / "key_file.json").is_file():
            with contextlib.suppress(OSError, ValueError, KeyError):
                token = server.keys["management"]
                for name in sorted(pending):
                    status, body = _get(f"{management}/models/{name}", token)
                    workers = json.loads(body)[0].get("workers", []) if status == 200 else []
                    if any(worker.get("status") == "READY" for worker in workers):
                        pending.discard(name)
        if not pending and (router is None or _accepting(server.ports.inference)):
            return
        time.sleep(0.5)
    waiting = sorted(pending)
    raise RuntimeError(f"TorchServe not ready after {timeout:.0f} s (waiting for {waiting}); see {server.run_dir}")


def _accepting(port: int) -> bool:
    host = bind_address("INFERENCE_ADDRESS")
    host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1.0):
        return True
    return False


def terminate(pid: int, timeout: float = 20.0) -> None:
    """SIGTERM the process group led by ``pid`` (its workers too), then SIGKILL after ``timeout``."""
    if not pid_alive(pid):
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done:
                break
        if not pid_alive(pid):
            break
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def stop(run_dir: Path = DEFAULT_RUN_DIR) -> bool:
    """Stop the service started from ``run_dir`` by its pid files; returns whether anything was running."""
    stopped = False
    for pid_name in (ROUTER_PID, TS_PID, EXPORTER_PID):
        pid_file = run_dir / pid_name
        if not pid_file.is_file():
            continue
        text = pid_file.read_text().strip()
        if text.isdigit() and pid_alive(int(text)):
            terminate(int(text))
            stopped = True
        pid_file.unlink(missing_ok=True)
    guard = run_dir / WATCHDOG_PID  # nothing left to guard
    text = guard.read_text().strip() if guard.is_file() else ""
    if text.isdigit() and pid_alive(int(text)):
        terminate(int(text))
    guard.unlink(missing_ok=True)
    return stopped
