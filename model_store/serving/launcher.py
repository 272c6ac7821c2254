"""Start and stop the explanation service: TorchServe's Java frontend plus the explanation-metrics exporter.

TorchServe's own ``torchserve`` command keeps one pid file per machine (``$TMPDIR/.model_server.pid``) and refuses
to start a second server, so the launcher runs the Java frontend itself (the same command line) with a private
temp folder, which lets tests start servers on free ports beside a running one. Runtime state lives in the run
folder (default ``run/``, git-ignored): ``config.properties``, ``key_file.json`` (tokens), ``logs/``, the pid files
and ``prometheus/`` (the workers' metric files).

Commands: ``serve`` (foreground, Ctrl-C stops), ``start`` (background), ``stop``, ``package`` (package only).
``--models name=path,...`` (``make serve MODELS=...``) or ``--models-file models.yaml`` serve your own checkpoint
folders instead of the two default models: each is validated and packaged by :mod:`model_store.package` (reused
while unchanged) first.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import json
import logging
import os
import shutil
import signal
import socket
import string
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

logger = logging.getLogger(__name__)

SERVING_DIR = Path(__file__).resolve().parent
REPO_ROOT = SERVING_DIR.parent.parent
TEMPLATE = SERVING_DIR / "config.properties.template"
METRICS_YAML = SERVING_DIR / "metrics.yaml"
PROFILES = SERVING_DIR / "profiles.yaml"
DEFAULT_RUN_DIR = REPO_ROOT / "run"
DEFAULT_MODEL_STORE = REPO_ROOT / "model_store" / "build"
DEFAULT_MODELS = {"sentiment": "sentiment/archive", "digits": "digits/archive"}
TS_PID = "torchserve.pid"
EXPORTER_PID = "exporter.pid"
PORTS_FILE = "ports.json"


@dataclass(frozen=True)
class Ports:
    """The service's ports (all bound to 127.0.0.1)."""

    inference: int = 8080
    management: int = 8081
    metrics: int = 8082
    grpc_inference: int = 7070
    grpc_management: int = 7071
    exporter: int = 8083

    @classmethod
    def from_env(cls) -> Ports:
        """Defaults overridden by ``INFERENCE_PORT``, ``MANAGEMENT_PORT``, ``METRICS_PORT``, ``GRPC_INFERENCE_PORT``,
        ``GRPC_MANAGEMENT_PORT`` and ``EXPORTER_PORT``."""
        values = {name: int(os.environ.get(f"{name.upper()}_PORT", default)) for name, default in asdict(cls()).items()}
        return cls(**values)

    @classmethod
    def free(cls) -> Ports:
        """Six currently free loopback ports (for tests)."""
        sockets = []
        try:
            for _ in range(6):
                sock = socket.socket()
                sock.bind(("127.0.0.1", 0))
                sockets.append(sock)
            numbers = [sock.getsockname()[1] for sock in sockets]
        finally:
            for sock in sockets:
                sock.close()
        return cls(*numbers)


@dataclass
class Server:
    """A started service: pids, ports and where its state lives."""

    run_dir: Path
    ports: Ports
    torchserve_pid: int
    exporter_pid: int
    models: tuple[str, ...]

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


def bind_address(variable: str) -> str:
    """The address to bind named by the environment variable ``variable`` (``INFERENCE_ADDRESS`` or
    ``METRICS_ADDRESS``), 127.0.0.1 when unset. Only for containers and pods, where the port must be reachable from
    outside the container's loopback (docs/OPERATIONS.md); management is never configurable.

    Raises:
        ValueError: if the value is not an IP address literal.
    """
    value = os.environ.get(variable) or "127.0.0.1"
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        raise ValueError(f"{variable}={value!r} is not an IP address (e.g. 127.0.0.1 or 0.0.0.0)") from None


#: Default lifetime of TorchServe's inference and management keys, in minutes (365 days).
DEFAULT_TOKEN_EXPIRATION_MIN = 525_600
#: The longest lifetime accepted (100 years): TorchServe adds it to the current time and fails past Instant.MAX.
MAX_TOKEN_EXPIRATION_MIN = 52_560_000


def token_expiration_minutes() -> float:
    """Lifetime of the keys TorchServe generates, from ``$TOKEN_EXPIRATION_MIN`` (minutes), else
    :data:`DEFAULT_TOKEN_EXPIRATION_MIN`.

    Raises:
        ValueError: if the value is not a number of minutes in (0, :data:`MAX_TOKEN_EXPIRATION_MIN`].
    """
    value = os.environ.get("TOKEN_EXPIRATION_MIN") or str(DEFAULT_TOKEN_EXPIRATION_MIN)
    try:
        minutes = float(value)
    except ValueError:
        minutes = float("nan")
    if not 0 < minutes <= MAX_TOKEN_EXPIRATION_MIN:
        raise ValueError(
            f"TOKEN_EXPIRATION_MIN={value!r} is not a number of minutes in (0, {MAX_TOKEN_EXPIRATION_MIN}]"
        )
    return minutes


def write_config(run_dir: Path, ports: Ports, model_store: Path) -> Path:
    """Fill the template into ``run_dir/config.properties`` and return its path."""
    workflow_store = run_dir / "workflow-store"
    workflow_store.mkdir(parents=True, exist_ok=True)
    workflow_store.chmod(0o555)
    text = string.Template(TEMPLATE.read_text(encoding="utf-8")).substitute(
        inference_host=bind_address("INFERENCE_ADDRESS"),
        metrics_host=bind_address("METRICS_ADDRESS"),
        inference_port=ports.inference,
        management_port=ports.management,
        metrics_port=ports.metrics,
        grpc_inference_port=ports.grpc_inference,
        grpc_management_port=ports.grpc_management,
        model_store=model_store.resolve(),
        workflow_store=workflow_store.resolve(),
        metrics_config=METRICS_YAML,
        token_expiration_min=f"{token_expiration_minutes():g}",
    )
    path = run_dir / "config.properties"
    path.write_text(text, encoding="utf-8")
    return path


def _link_store(
    run_dir: Path, model_store: Path, models: Mapping[str, str], overrides: Mapping[str, Mapping[str, Any]]
) -> Path:
    """A model store ``run_dir/model-store/<name>/`` of symlinks to each archive's files (TorchServe 0.12 does not
    accept nested paths such as ``sentiment/archive`` in ``--models``), with ``model-config.yaml`` rewritten when
    ``overrides[name]`` sets keys (top-level TorchServe keys, and ``handler:`` keys merged into that section)."""
    store = run_dir / "model-store"
    shutil.rmtree(store, ignore_errors=True)
    store.mkdir(parents=True)
    for name, path in models.items():
        source = (model_store / path).resolve()
        target = store / name
        target.mkdir()
        for entry in source.iterdir():
            if entry.name != "model-config.yaml":
                (target / entry.name).symlink_to(entry)
        config = yaml.safe_load((source / "model-config.yaml").read_text(encoding="utf-8")) or {}
        extra = dict(overrides.get(name, {}))
        handler_extra = extra.pop("handler", {}) or {}
        config.update(extra)
        config["handler"] = {**config.get("handler", {}), **handler_extra}
        (target / "model-config.yaml").write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return store


def load_profile(name: str) -> dict[str, Any]:
    """A batching/device profile of ``profiles.yaml`` (``archive`` = no change).

    Raises:
        ValueError: naming the known profiles.
    """
    if name == "archive":
        return {}
    profiles = yaml.safe_load(PROFILES.read_text(encoding="utf-8"))
    if name not in profiles:
        raise ValueError(f"unknown profile {name!r}; known: archive, {', '.join(profiles)}")
    return dict(profiles[name])


def _java_command(config: Path, model_store: Path, tmp_dir: Path, models: list[str]) -> list[str]:
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


def _missing_archives(model_store: Path, models: Mapping[str, str]) -> list[str]:
    return [name for name, path in models.items() if not (model_store / path / "MAR-INF" / "MANIFEST.json").is_file()]


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (one owned by another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _spawn(command: list[str], cwd: Path, env: dict[str, str], log: Path, pid_file: Path) -> subprocess.Popen[bytes]:
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
    for pid_name in (TS_PID, EXPORTER_PID):
        pid_file = run_dir / pid_name
        if pid_file.is_file() and pid_alive(int(pid_file.read_text().strip() or 0)):
            raise RuntimeError(f"already running from {run_dir} (pid file {pid_file}); run `make stop` first")
    missing = _missing_archives(model_store, models)
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
    store = _link_store(run_dir, model_store, models, overrides or {})
    config = write_config(run_dir, ports, store)
    exporter = _spawn(
        [
            *(sys.executable, "-m", "handlers.exporter", "--dir", str(metrics_dir)),
            *("--port", str(ports.exporter), "--address", bind_address("METRICS_ADDRESS")),
        ],
        REPO_ROOT,
        env,
        run_dir / "exporter.log",
        run_dir / EXPORTER_PID,
    )
    java = _spawn(
        _java_command(config, store, tmp_dir, list(models)), run_dir, env, run_dir / "torchserve.out", run_dir / TS_PID
    )
    (run_dir / PORTS_FILE).write_text(json.dumps(asdict(ports)))
    server = Server(run_dir, ports, java.pid, exporter.pid, tuple(models))
    try:
        _wait_ready(server, java, timeout)
    except BaseException:
        stop(run_dir)
        raise
    return server


def _get(url: str, token: str | None, timeout: float = 5.0) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def _wait_ready(server: Server, process: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    management = f"http://127.0.0.1:{server.ports.management}"
    pending = set(server.models)
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"TorchServe exited with {process.returncode}; see {server.run_dir / 'torchserve.out'}")
        if (server.run_dir / "key_file.json").is_file():
            with contextlib.suppress(OSError, ValueError, KeyError):
                token = server.keys["management"]
                for name in sorted(pending):
                    status, body = _get(f"{management}/models/{name}", token)
                    workers = json.loads(body)[0].get("workers", []) if status == 200 else []
                    if any(worker.get("status") == "READY" for worker in workers):
                        pending.discard(name)
                if not pending:
                    return
        time.sleep(0.5)
    waiting = sorted(pending)
    raise RuntimeError(f"TorchServe not ready after {timeout:.0f} s (waiting for {waiting}); see {server.run_dir}")


def _terminate(pid: int, timeout: float = 20.0) -> None:
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
    for pid_name in (TS_PID, EXPORTER_PID):
        pid_file = run_dir / pid_name
        if not pid_file.is_file():
            continue
        text = pid_file.read_text().strip()
        if text.isdigit() and pid_alive(int(text)):
            _terminate(int(text))
            stopped = True
        pid_file.unlink(missing_ok=True)
    return stopped


def usage(server: Server, example: tuple[str, str] = ("sentiment", "text")) -> str:
    """How to call the running service (printed by ``serve``/``start``); ``example`` is the (model, task) the
    commands show."""
    ports = server.ports
    model, task = example
    url = f"http://127.0.0.1:{ports.inference}"
    if task == "text":
        calls = (
            f"  curl -s -H \"Authorization: Bearer $TOKEN\" -H 'Content-Type: application/json' \\\n"
            f'       {url}/predictions/{model} -d \'{{"text": "what a lovely day"}}\'\n'
            f"  curl -s -H \"Authorization: Bearer $TOKEN\" -H 'Content-Type: application/json' \\\n"
            f'       {url}/explanations/{model} -d \'{{"text": "what a lovely day", "explain": '
            f'{{"method": "relevance"}}}}\'\n'
        )
    else:
        calls = (
            f"  curl -s -H \"Authorization: Bearer $TOKEN\" -H 'Content-Type: image/png' \\\n"
            f"       {url}/explanations/{model} --data-binary @picture.png\n"
        )
    return f"""
The explanation service is up (models: {", ".join(server.models)}); tokens are in {server.run_dir}/key_file.json.
  TOKEN=$(python -c 'import json;print(json.load(open("{server.run_dir}/key_file.json"))["inference"]["key"])')
{calls}gRPC: 127.0.0.1:{ports.grpc_inference} (Predictions; input key "body" = the JSON, "request" = ExplainRequest;
      metadata authorization: Bearer $TOKEN). Management 127.0.0.1:{ports.management} (loopback only).
Metrics: TorchServe http://127.0.0.1:{ports.metrics}/metrics, explanations http://127.0.0.1:{ports.exporter}/metrics
Logs: {server.log_dir}. Docs: docs/SERVING.md.
"""


def _ensure_models(model_store: Path, models: Mapping[str, str]) -> None:
    """Build the default models' archives if missing, or refresh them if their fingerprints changed (a handler or
    recipe edit): ``model_store.build`` reuses what is up to date in a fraction of a second.

    A model store this process cannot write (a host folder mounted into the container, owned by another user or
    mounted read-only) is served as it is: a build would have to write its lock and fingerprint files there.

    Raises:
        FileNotFoundError: if such a read-only store lacks an archive (it cannot be built there).
    """
    missing = _missing_archives(model_store, models)
    if model_store.is_dir() and not os.access(model_store, os.W_OK):
        if missing:
            raise FileNotFoundError(
                f"no archive for {missing} under {model_store}, which this user (uid {os.getuid()}) cannot write, "
                "so they cannot be built here: build them where the folder is writable (on the host: "
                "python -m model_store.build --out <that folder>) or serve a folder that has them"
            )
        uid = os.getuid()
        logger.info("model store %s is not writable by uid %d: serving its archives as they are", model_store, uid)
        return
    if missing:
        logger.info("building the default models %s (first run only)", missing)
    command = [sys.executable, "-m", "model_store.build", "--out", str(model_store), "--no-progress"]
    for name in models:
        command += ["--only", name]
    subprocess.run(command, cwd=REPO_ROOT, check=True)


def package_own_models(
    spec: str | None, models_file: Path | None, model_store: Path
) -> tuple[dict[str, str], tuple[str, str]]:
    """Validate, then package (or reuse) the checkpoints of ``spec`` (``name=path,...``) and ``models_file`` into
    ``model_store/packages``; returns name → archive path relative to ``model_store``, and the (name, task) of the
    first text model, else of the first model (for the usage example).

    Raises:
        PackageError: if an entry or a checkpoint is refused (nothing is packaged then).
    """
    from model_store.package import PackageError, package, parse_models, read_models_file, validate

    entries = (parse_models(spec) if spec else []) + (read_models_file(models_file) if models_file else [])
    names = [entry.name for entry in entries]
    if len(set(names)) != len(names):
        raise PackageError(f"a model name is given twice in MODELS and MODELS_FILE: {names}")
    checked = [validate(entry.path, entry.name, entry.settings) for entry in entries]
    out = model_store / "packages"
    models: dict[str, str] = {}
    for entry, checkpoint in zip(entries, checked, strict=True):
        result = package(entry.path, entry.name, out, entry.settings, checkpoint)
        models[entry.name] = str(result.archive.relative_to(model_store))
    pairs = [(entry.name, checkpoint.task) for entry, checkpoint in zip(entries, checked, strict=True)]
    return models, next((pair for pair in pairs if pair[1] == "text"), pairs[0])


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(prog="python -m model_store.serving", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("serve", "start", "stop", "package"))
    parser.add_argument("--run-dir", type=Path, default=Path(os.environ.get("RUN_DIR") or DEFAULT_RUN_DIR))
    parser.add_argument("--model-store", type=Path, default=Path(os.environ.get("MODEL_STORE") or DEFAULT_MODEL_STORE))
    parser.add_argument(
        "--profile", default=os.environ.get("PROFILE") or "archive", help="archive (default), cpu or gpu"
    )
    parser.add_argument(
        "--models",
        default=os.environ.get("MODELS") or None,
        help="serve these checkpoint folders instead of the default models: name=path[,name=path...]",
    )
    parser.add_argument(
        "--models-file",
        type=Path,
        default=Path(os.environ["MODELS_FILE"]) if os.environ.get("MODELS_FILE") else None,
        help="a YAML file of checkpoint folders and their settings (docs/SERVING.md)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    if args.command == "stop":
        print("stopped" if stop(args.run_dir) else "not running")
        return 0
    from handlers.protos import generate

    generate()
    example = ("sentiment", "text")
    if args.models or args.models_file:
        from model_store.package import PackageError

        try:
            models, example = package_own_models(args.models, args.models_file, args.model_store)
        except PackageError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        if args.command == "package":
            for name, path in models.items():
                print(f"{name}: {args.model_store / path}")
            return 0
    elif args.command == "package":
        print("error: `package` needs --models name=path,... or --models-file FILE (MODELS=/MODELS_FILE=)")
        return 2
    else:
        models = dict(DEFAULT_MODELS)
        _ensure_models(args.model_store, models)
    profile = load_profile(args.profile)
    server = start(args.run_dir, args.model_store, models, overrides={name: profile for name in models})
    print(usage(server, example), flush=True)
    if args.command == "start":
        return 0
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        while pid_alive(server.torchserve_pid):
            time.sleep(1.0)
        logger.error("TorchServe exited; see %s", server.log_dir)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        stop(args.run_dir)
