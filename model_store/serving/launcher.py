"""Start and stop the explanation service: ``python -m model_store.serving serve|start|stop|package``.

Commands: ``serve`` (foreground, Ctrl-C stops), ``start`` (background), ``stop``, ``package`` (package only).
``--models name=path,...`` (``make serve MODELS=...``) or ``--models-file models.yaml`` serve your own checkpoint
folders instead of the two default models: each is validated and packaged by :mod:`model_store.package` (reused
while unchanged) first.

``--server kserve|ray`` (``make serve SERVER=...``): the archives are resolved here, then this process becomes
``python -m servers`` (the other doors' launcher, :mod:`servers.launcher`) with them; the two launchers share their
process mechanics (:mod:`supervise`) and import nothing of each other.

This module is the command line only; the work is done by :mod:`model_store.serving.config` (ports, config files,
profiles), :mod:`model_store.serving.archives` (building the default models, packaging own checkpoints) and
:mod:`model_store.serving.process` (starting, waiting for and stopping TorchServe and the metrics exporter).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from model_store.serving.archives import DEFAULT_MODELS, ensure_models, package_own_models
from model_store.serving.config import DEFAULT_MODEL_STORE, load_profile
from model_store.serving.process import Server, start, stop
from supervise.environment import run_dir_from_env
from supervise.processes import REPO_ROOT, pid_alive, python_env

logger = logging.getLogger(__name__)

#: The doors ``--server`` (``make serve SERVER=...``) chooses from.
SERVERS = ("torchserve", "kserve", "ray")


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
            f'       {url}/explanations/{model} -d \'{{"text": "what a lovely day"}}\'   # the default method\n'
            f"  curl -s -H \"Authorization: Bearer $TOKEN\" -H 'Content-Type: application/json' \\\n"
            f'       {url}/predictions/{model} -d \'{{"text": "what a lovely day", "explain": '
            f'{{"below": 0.8}}}}\'   # explained only if unsure\n'
        )
    elif task == "generation":
        calls = (
            f"  curl -s -H \"Authorization: Bearer $TOKEN\" -H 'Content-Type: application/json' \\\n"
            f'       {url}/predictions/{model} -d \'{{"prompt": "the flight was", "max_new_tokens": 8, '
            f'"explain": {{"method": "attnlrp"}}}}\'   # each generated token explained\n'
        )
    else:
        calls = (
            f"  curl -s -H \"Authorization: Bearer $TOKEN\" -H 'Content-Type: image/png' \\\n"
            f"       {url}/explanations/{model} --data-binary @picture.png\n"
        )
    pools = ""
    if server.pools:
        pools = (
            f"Explanation pools: {', '.join(server.pools)} (requests asking for an explanation are served by "
            f"<name>.explain's own workers; the router on :{ports.inference}/:{ports.grpc_inference} chooses).\n"
        )
    return f"""
The explanation service is up (models: {", ".join(server.models)}); tokens are in {server.run_dir}/key_file.json.
{pools}  TOKEN=$(python -c 'import json;print(json.load(open("{server.run_dir}/key_file.json"))["inference"]["key"])')
{calls}gRPC: 127.0.0.1:{ports.grpc_inference} (Predictions; input key "body" = the JSON, "request" = ExplainRequest;
      metadata authorization: Bearer $TOKEN). Management 127.0.0.1:{ports.management} (loopback only).
Metrics: TorchServe http://127.0.0.1:{ports.metrics}/metrics, explanations http://127.0.0.1:{ports.exporter}/metrics
Logs: {server.log_dir}. Docs: docs/SERVING.md.
"""


def door_command(
    command: str,
    server: str,
    archives: Mapping[str, Path],
    example: tuple[str, str],
    run_dir: Path,
    replicas: int | None = None,
) -> list[str]:
    """The ``python -m servers`` command line that serves ``archives`` (name → folder) on the ``server`` door."""
    line = [sys.executable, "-m", "servers", command, "--server", server, "--run-dir", str(run_dir)]
    for name, folder in archives.items():
        line += ["--archive", f"{name}={folder.resolve()}"]
    line += ["--example", "=".join(example)]
    return line + (["--replicas", str(replicas)] if replicas is not None else [])


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(prog="python -m model_store.serving", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("serve", "start", "stop", "package"))
    parser.add_argument(
        "--server",
        default=os.environ.get("SERVER") or "torchserve",
        choices=SERVERS,
        help="the door: torchserve (default), kserve (KServe's model server, OIP v2 + explain) or ray (Ray Serve "
        "replicas behind that door); docs/SERVING.md, 'Other doors'",
    )
    parser.add_argument(
        "--replicas",
        type=int,
        default=int(os.environ["REPLICAS"]) if os.environ.get("REPLICAS") else None,
        help="--server ray: replicas per model (default: each model's workers setting)",
    )
    parser.add_argument("--run-dir", type=Path, default=run_dir_from_env())
    parser.add_argument("--model-store", type=Path, default=Path(os.environ.get("MODEL_STORE") or DEFAULT_MODEL_STORE))
    parser.add_argument(
        "--profile", default=os.environ.get("PROFILE") or "archive", help="archive (default), cpu, cpu-pooled or gpu"
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
        stopped = stop(args.run_dir)
        if (args.run_dir / "doors.pid").is_file():  # a KServe/Ray door: its own launcher stops it
            door = [sys.executable, "-m", "servers", "stop", "--run-dir", str(args.run_dir)]
            result = subprocess.run(door, cwd=REPO_ROOT, env=python_env(), capture_output=True, text=True, check=False)
            stopped = stopped or result.stdout.strip() == "stopped"
        print("stopped" if stopped else "not running")
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
        ensure_models(args.model_store, models)
    if args.server != "torchserve":
        archives = {name: args.model_store / path for name, path in models.items()}
        command = door_command(args.command, args.server, archives, example, args.run_dir, args.replicas)
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(command[0], command, python_env())
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
