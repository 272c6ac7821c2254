"""Start and stop the explanation service: ``python -m model_store.serving serve|start|stop|package``.

Commands: ``serve`` (foreground, Ctrl-C stops), ``start`` (background), ``stop``, ``package`` (package only).
``serve`` supervises what it started until it is stopped (:mod:`model_store.serving.supervision`): it exits 0 after
``stop``, and 1, saying which process ended and how, if TorchServe ends by itself; ``start`` runs that same
``serve`` in the background and returns once the service is ready.
``--models name=path,...`` (``make serve MODELS=...``) or ``--models-file models.yaml`` serve your own checkpoint
folders instead of the two default models: each is validated and packaged by :mod:`model_store.package` (reused
while unchanged) first.

``EXPLAIN_DEFAULT_METHOD`` (``explain-serve --default-method``) sets the default method of every model served; one
that a model's family refuses stops the launcher before anything starts (exit status 2).

``--server kserve|ray`` (``make serve SERVER=...``): the archives are resolved here, then this process becomes
``python -m servers`` (the other doors' launcher, :mod:`servers.launcher`) with them; the two launchers share their
process mechanics (:mod:`supervise`) and import nothing of each other.

This module is the command line only; the work is done by :mod:`model_store.serving.config` (ports, config files,
profiles), :mod:`model_store.serving.archives` (building the default models, packaging own checkpoints),
:mod:`model_store.serving.process` (starting, waiting for and stopping TorchServe, the metrics exporter and the
router) and :mod:`model_store.serving.supervision` (watching them).
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from model_store.serving.archives import DEFAULT_MODELS, check_served_default, ensure_models, package_own_models
from model_store.serving.config import default_model_store, load_profile
from model_store.serving.process import Server, start, stop
from model_store.serving.supervision import supervise
from supervise.environment import name_value, run_dir_from_env
from supervise.processes import python_env
from supervise.supervisor import claimed, start_in_background, write_status
from supervise.workdir import workdir

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
    if server.generation:
        pools += (
            f"OpenAI API: {url}/v1 (chat/completions, completions, models) for {', '.join(server.generation)}; the "
            "API key is $TOKEN (docs/SERVING.md, 'OpenAI API').\n"
        )
    return f"""
The explanation service is up (models: {", ".join(server.models)}); tokens are in {server.run_dir}/key_file.json.
{pools}  TOKEN=$(python3 -c 'import json;print(json.load(open("{server.run_dir}/key_file.json"))["inference"]["key"])')
{calls}gRPC: 127.0.0.1:{ports.grpc_inference} (Predictions; input key "body" = the JSON, "request" = ExplainRequest;
      metadata authorization: Bearer $TOKEN). Management 127.0.0.1:{ports.management} (loopback only).
Metrics: TorchServe http://127.0.0.1:{ports.metrics}/metrics, explanations http://127.0.0.1:{ports.exporter}/metrics
Logs: {server.log_dir}. Docs: docs/SERVING.md.
"""


def door_command(args: argparse.Namespace, archives: Mapping[str, Path], example: tuple[str, str]) -> list[str]:
    """The ``python -m servers`` command line that runs ``args.command`` on the ``args.server`` door for
    ``archives`` (name → folder)."""
    line = [sys.executable, "-m", "servers", args.command, "--server", args.server, "--run-dir", str(args.run_dir)]
    for name, folder in archives.items():
        line += ["--archive", f"{name}={folder.resolve()}"]
    line += ["--example", "=".join(example)]
    return line + (["--replicas", str(args.replicas)] if args.replicas is not None else [])


def build_parser() -> argparse.ArgumentParser:
    """The command line (defaults from the environment ``make serve`` sets)."""
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
    parser.add_argument(
        "--model-store",
        type=Path,
        default=default_model_store(),
        help="where archives are built and packaged (default: $MODEL_STORE, else model_store/build of the working "
        "directory)",
    )
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
    parser.add_argument(
        "--archive",
        type=name_value,
        action="append",
        default=[],
        metavar="NAME=FOLDER",
        help="serve this archive folder (relative to --model-store) as it is, with no build or packaging step "
        "(repeat; what `start` gives its background `serve`)",
    )
    parser.add_argument(
        "--example",
        type=name_value,
        default=("sentiment", "text"),
        metavar="NAME=TASK",
        help="the model the usage shows",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    args = build_parser().parse_args(argv)
    args.run_dir, args.model_store = args.run_dir.resolve(), args.model_store.resolve()  # children run elsewhere
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    if args.command == "stop":
        stopped = stop(args.run_dir)
        if (args.run_dir / "doors.pid").is_file():  # a KServe/Ray door left by its launcher: that launcher stops it
            door = [sys.executable, "-m", "servers", "stop", "--run-dir", str(args.run_dir)]
            result = subprocess.run(door, cwd=workdir(), env=python_env(), capture_output=True, text=True, check=False)
            stopped = stopped or result.stdout.strip() == "stopped"
        print("stopped" if stopped else "not running")
        return 0
    from handlers.protos import generate

    generate()
    if args.archive:
        models, example = dict(args.archive), args.example
    elif args.models or args.models_file:
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
        models, example = dict(DEFAULT_MODELS), ("sentiment", "text")
        ensure_models(args.model_store, models)
    method = os.environ.get("EXPLAIN_DEFAULT_METHOD", "").strip()  # serving_core.config.DEFAULT_METHOD_ENV
    if method:  # the default method of every model: refused here, before anything starts, where it cannot apply
        try:
            check_served_default(args.model_store, models, method)
        except ValueError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
    if args.server != "torchserve":
        archives = {name: args.model_store / path for name, path in models.items()}
        command = door_command(args, archives, example)
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(command[0], command, python_env())
    if args.command == "start":  # the same `serve`, in the background, supervising
        code, message = start_in_background(serve_command(args, models, example), args.run_dir)
        print(message, flush=True, file=sys.stdout if code == 0 else sys.stderr)
        return code
    return serve(args, models, example)


def serve_command(args: argparse.Namespace, models: Mapping[str, str], example: tuple[str, str]) -> list[str]:
    """The ``serve`` command line that serves ``models`` (name → archive folder in the model store) as they are."""
    line = [sys.executable, "-m", "model_store.serving", "serve", "--server", "torchserve"]
    line += ["--run-dir", str(args.run_dir.resolve()), "--model-store", str(args.model_store.resolve())]
    line += ["--profile", args.profile, "--example", "=".join(example)]
    for name, path in models.items():
        line += ["--archive", f"{name}={path}"]
    return line


def serve(args: argparse.Namespace, models: Mapping[str, str], example: tuple[str, str]) -> int:
    """Start TorchServe, say how to call it, and supervise it until it is stopped (0) or fails (1):
    :mod:`model_store.serving.supervision`."""
    with claimed(args.run_dir):
        try:
            profile = load_profile(args.profile)
            server = start(args.run_dir, args.model_store, models, overrides={name: profile for name in models})
        except Exception as error:
            logger.error("the service did not start: %s", error, exc_info=not isinstance(error, RuntimeError))
            write_status(args.run_dir, "failed", f"the service did not start: {error}")
            return 1
        text = usage(server, example)
        print(text, flush=True)
        write_status(args.run_dir, "ready", text)
        return supervise(server)
