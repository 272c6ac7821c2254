"""Start and stop the KServe and Ray Serve doors (``make serve SERVER=kserve``, ``SERVER=ray REPLICAS=2``).

The door runs as one process (:mod:`servers.process`) in its own session, its pid in ``RUN_DIR/doors.pid``; for
``ray`` that process also starts (and stops) a local Ray, or joins ``RAY_ADDRESS``. REST listens on
``INFERENCE_PORT`` and gRPC on ``GRPC_INFERENCE_PORT`` (8080 and 7070 as on TorchServe), on 127.0.0.1 unless
``INFERENCE_ADDRESS`` is set (containers, pods). The models are the same archive folders TorchServe serves: the
default models, or the packages of ``MODELS=``/``MODELS_FILE=`` checkpoints.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from .process import DOORS, DoorConfig

REPO_ROOT = Path(__file__).resolve().parent.parent
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

    @property
    def url(self) -> str:
        """Base URL of the REST API."""
        return f"http://{self.address}:{self.http_port}"

    @property
    def grpc_target(self) -> str:
        """``host:port`` of the gRPC API."""
        return f"{self.address}:{self.grpc_port}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
    pid_file = run_dir / PID_FILE
    if pid_file.is_file() and pid_file.read_text().strip().isdigit() and _alive(int(pid_file.read_text())):
        raise RuntimeError(f"a door already runs from {run_dir} (pid file {pid_file}); stop it first")
    per_model = dict(replicas) if isinstance(replicas, Mapping) else {}
    config = DoorConfig(
        server, {name: str(Path(path).resolve()) for name, path in models.items()}, address, http_port, grpc_port,
        replicas if isinstance(replicas, int) else None, per_model, ray_address, attach=attach,
        metrics_port=metrics[1] if metrics else None, metrics_address=metrics[0] if metrics else "127.0.0.1",
    )  # fmt: skip
    config_path = run_dir / CONFIG_FILE
    config_path.write_text(json.dumps(asdict(config), indent=2), encoding="utf-8")
    process_env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "RAY_USAGE_STATS_ENABLED": "0",
        **(env or {}),
    }
    process_env.pop("PROMETHEUS_MULTIPROC_DIR", None)  # the door's metrics live in its own process
    with (run_dir / LOG_FILE).open("ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "servers.process", str(config_path)],
            cwd=REPO_ROOT, env=process_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    pid_file.write_text(str(process.pid))
    from model_store.serving.watchdog import owner_pid, watch

    owner = owner_pid()
    if owner is not None:  # EXPLAIN_OWNER_PID (the test suite): the door ends with that process, however it ends
        (run_dir / WATCHDOG_FILE).write_text(str(watch(owner, groups=[process.pid], env=process_env).pid))
    door = Door(server, run_dir, address, http_port, grpc_port, process.pid, tuple(models))
    try:
        _wait_ready(door, process, timeout)
    except BaseException:
        stop(run_dir)
        raise
    return door


def servable(models: Mapping[str, str | Path]) -> dict[str, str | Path]:
    """The models whose task the OIP doors speak (:data:`servers.oip.CODECS`); the others are left out with a
    warning (serve them on TorchServe).

    Raises:
        RuntimeError: if none is left.
    """
    from .oip import CODECS
    from .settings import read_settings

    kept: dict[str, str | Path] = {}
    for name, path in models.items():
        task = read_settings(name, Path(path)).config.task
        if task in CODECS:
            kept[name] = path
        else:
            logger.warning("%s: the KServe/Ray doors have no OIP codec for task %r yet: not served here (TorchServe "
                           "serves it)", name, task)  # fmt: skip
    if not kept:
        raise RuntimeError(f"none of {sorted(models)} has a task the KServe/Ray doors serve ({sorted(CODECS)})")
    return kept


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)
    except OSError:
        return 0


def _wait_ready(door: Door, process: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    pending = set(door.models)
    host = "127.0.0.1" if door.address in ("0.0.0.0", "::") else door.address
    while time.monotonic() < deadline:
        if process.poll() is not None:
            log = door.run_dir / LOG_FILE
            raise RuntimeError(f"the {door.server} door exited with {process.returncode}; see {log}")
        for name in sorted(pending):
            if _get(f"http://{host}:{door.http_port}/v2/models/{name}/ready") == 200:
                pending.discard(name)
        if not pending:
            return
        time.sleep(0.5)
    raise RuntimeError(
        f"the {door.server} door is not ready after {timeout:.0f} s (waiting for {sorted(pending)}); "
        f"see {door.run_dir / LOG_FILE}"
    )


def stop(run_dir: Path, timeout: float = 30.0) -> bool:
    """Stop the door started from ``run_dir`` (SIGTERM to its process group, SIGKILL after ``timeout``) and its
    watchdog; returns whether a door was running."""
    from model_store.serving.process import terminate

    stopped = False
    for name, wait in ((PID_FILE, timeout), (WATCHDOG_FILE, 5.0)):
        pid_file = run_dir / name
        text = pid_file.read_text().strip() if pid_file.is_file() else ""
        pid_file.unlink(missing_ok=True)
        if text.isdigit() and _alive(int(text)):
            terminate(int(text), wait)
            stopped = stopped or name == PID_FILE
    return stopped


def usage(door: Door, example: tuple[str, str] = ("sentiment", "text")) -> str:
    """How to call the running door (printed by ``make serve SERVER=...``)."""
    model, task = example
    url = door.url
    if task == "text":
        body = (
            '{"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["what a lovely day"]}], '
            '"parameters": {"explain_method": "attnlrp"}}'
        )
        v1_body = '{"instances": ["what a lovely day"]}'
    else:
        body = (
            '{"inputs": [{"name": "image", "datatype": "BYTES", "shape": [1], "data": ["<base64 PNG>"]}], '
            '"parameters": {"explain_method": "default"}}'
        )
        v1_body = '{"instances": [{"image": {"b64": "<base64 PNG>"}}]}'
    door_name = "KServe model server" if door.server == "kserve" else "KServe door in front of Ray Serve replicas"
    return f"""
The explanation service is up on the {door_name} (models: {", ".join(door.models)}); no token on loopback.
  OIP v2 REST (explain extension):
  curl -s -H 'Content-Type: application/json' {url}/v2/models/{model}/infer \\
       -d '{body}'
  KServe v1:  curl -s -H 'Content-Type: application/json' {url}/v1/models/{model}:explain -d '{v1_body}'
  gRPC (OIP GRPCInferenceService/ModelInfer): {door.grpc_target}
  Health: {url}/v2/health/ready   Metadata: {url}/v2/models/{model}   Metrics: {url}/metrics (and on EXPORTER_PORT)
Log: {door.run_dir / LOG_FILE}. Docs: docs/SERVING.md ("Other doors: KServe and Ray Serve").
"""


def _models(args: argparse.Namespace) -> tuple[dict[str, Path], tuple[str, str]] | None:
    """The archives to serve: the packages of ``--models``/``--models-file``, else the default models (built or
    refreshed first); ``None`` if a checkpoint is refused (the message is printed)."""
    from model_store.serving.archives import DEFAULT_MODELS, ensure_models, package_own_models

    store: Path = args.model_store
    if args.models or args.models_file:
        from model_store.package import PackageError

        try:
            packaged, example = package_own_models(args.models, args.models_file, store)
        except PackageError as error:
            print(f"error: {error}", file=sys.stderr)
            return None
        return {name: store / path for name, path in packaged.items()}, example
    ensure_models(store, dict(DEFAULT_MODELS))
    return {name: store / path for name, path in DEFAULT_MODELS.items()}, ("sentiment", "text")


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m servers`` (defaults from the environment ``make serve`` sets)."""
    from model_store.serving.config import DEFAULT_MODEL_STORE, DEFAULT_RUN_DIR

    parser = argparse.ArgumentParser(prog="python -m servers", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("serve", "start", "stop"))
    server = os.environ.get("SERVER") if os.environ.get("SERVER") in DOORS else "kserve"
    parser.add_argument("--server", default=server, choices=DOORS)
    replicas = int(os.environ["REPLICAS"]) if os.environ.get("REPLICAS") else None
    parser.add_argument("--replicas", type=int, default=replicas, help="Ray Serve replicas per model")
    parser.add_argument("--ray-address", default=os.environ.get("RAY_ADDRESS") or None)
    parser.add_argument("--attach", action="store_true", default=os.environ.get("RAY_ATTACH") == "1",
                        help="Ray: serve the applications already on --ray-address (a RayService)")  # fmt: skip
    parser.add_argument("--run-dir", type=Path, default=Path(os.environ.get("RUN_DIR") or DEFAULT_RUN_DIR))
    parser.add_argument("--model-store", type=Path, default=Path(os.environ.get("MODEL_STORE") or DEFAULT_MODEL_STORE))
    parser.add_argument("--models", default=os.environ.get("MODELS") or None)
    parser.add_argument("--models-file", type=Path,
                        default=Path(os.environ["MODELS_FILE"]) if os.environ.get("MODELS_FILE") else None)  # fmt: skip
    return parser


def run_door(
    command: str,
    server: str,
    models: Mapping[str, Path],
    example: tuple[str, str],
    run_dir: Path,
    replicas: int | None = None,
    ray_address: str | None = None,
    attach: bool = False,
) -> int:
    """``serve`` (foreground until SIGTERM/Ctrl-C) or ``start`` (background) a door on the ports of the environment
    (``INFERENCE_PORT``, ``GRPC_INFERENCE_PORT``, ``EXPORTER_PORT``), printing how to call it; ``python -m
    model_store.serving --server kserve|ray`` (``make serve SERVER=...``) and ``python -m servers`` both end here."""
    from model_store.serving.config import Ports, bind_address

    ports = Ports.from_env()
    door = start(server, models, run_dir, ports.inference, ports.grpc_inference, bind_address("INFERENCE_ADDRESS"),
                 replicas, ray_address, metrics=(bind_address("METRICS_ADDRESS"), ports.exporter),
                 attach=attach)  # fmt: skip
    print(usage(door, example), flush=True)
    if command == "start":
        return 0
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        while _alive(door.pid):
            time.sleep(1.0)
        print(f"the door exited; see {door.run_dir / LOG_FILE}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        stop(run_dir)


def main(argv: list[str] | None = None) -> int:
    """``python -m servers serve|start|stop``: the KServe or Ray Serve door in the foreground or background."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    if args.command == "stop":
        print("stopped" if stop(args.run_dir) else "not running")
        return 0
    chosen = _models(args)
    if chosen is None:
        return 2
    models, example = chosen
    return run_door(args.command, args.server, models, example, args.run_dir, args.replicas, args.ray_address,
                    args.attach)  # fmt: skip
