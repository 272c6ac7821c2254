"""The one launcher of the explanation service: ``python -m doors serve|start|stop|package``.

What ``make serve|start|stop``, ``explain-serve`` and the container's ``CMD`` run, for every door of
:data:`doors.DOORS` (``--server``, ``make serve SERVER=...``; default ``torchserve``):

1. resolve the models: the default models (built into the model store if missing or stale), or your own checkpoint
   folders (``--models name=path,...``, ``make serve MODELS=...``, or ``--models-file models.yaml``: each validated and
   packaged by :mod:`model_store.package`, reused while unchanged), or archive folders as they are (``--archive``);
   :mod:`doors.models` does it;
2. refuse, before anything starts, a default method (``EXPLAIN_DEFAULT_METHOD``, ``explain-serve --default-method``)
   that a model's family cannot run (exit status 2);
3. ``serve``: run the door in the foreground (its module's ``serve``) and supervise it until it is stopped (exit 0),
   or until a process it started ends by itself (exit 1, saying which and how); ``start``: that same ``serve`` in the
   background (:mod:`supervise.supervisor`), returning once the service is ready; ``stop``: stop whichever door runs
   from the run folder; ``package``: package ``--models`` only.

Nothing here re-executes another launcher: the door's module is imported and called in this process.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from doors import DEFAULT_DOOR, DOORS, get_door
from doors.models import DEFAULT_MODELS, check_served_default, default_model_store, ensure_models, package_own_models
from supervise.environment import name_value, run_dir_from_env
from supervise.supervisor import start_in_background

logger = logging.getLogger(__name__)

#: The variable that sets every served model's default method (:data:`serving_core.config.DEFAULT_METHOD_ENV`).
DEFAULT_METHOD_ENV = "EXPLAIN_DEFAULT_METHOD"


@dataclass(frozen=True)
class LaunchOptions:
    """What a door's ``serve`` needs beside its models.

    Attributes:
        server: the door's name (:data:`doors.DOORS`).
        run_dir: the run folder (pid files, logs, configs, tokens).
        model_store: where archives are built and packaged; relative archive folders are read from here.
        profile: TorchServe's batching/device profile (``archive``: each archive's own settings).
        replicas: Ray: replicas per model (``None``: each model's workers setting).
        ray_address: Ray: the cluster to deploy on (``None``: a local one).
        attach: Ray: serve the applications already deployed on ``ray_address`` (a KubeRay RayService).
    """

    server: str
    run_dir: Path
    model_store: Path
    profile: str = "archive"
    replicas: int | None = None
    ray_address: str | None = None
    attach: bool = False


def build_parser() -> argparse.ArgumentParser:
    """The command line (defaults from the environment ``make serve`` sets)."""
    parser = argparse.ArgumentParser(prog="python -m doors", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("serve", "start", "stop", "package"))
    parser.add_argument(
        "--server",
        default=os.environ.get("SERVER") or DEFAULT_DOOR,
        choices=tuple(DOORS),
        help="the door: " + "; ".join(f"{door.name}: {door.summary}" for door in DOORS.values()),
    )
    parser.add_argument(
        "--replicas",
        type=int,
        default=int(os.environ["REPLICAS"]) if os.environ.get("REPLICAS") else None,
        help="--server ray: replicas per model (default: each model's workers setting)",
    )
    parser.add_argument("--ray-address", default=os.environ.get("RAY_ADDRESS") or None, help="--server ray: a cluster")
    parser.add_argument(
        "--attach",
        action="store_true",
        default=os.environ.get("RAY_ATTACH") == "1",
        help="--server ray: serve the applications already on --ray-address (a RayService)",
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


def options_of(args: argparse.Namespace) -> LaunchOptions:
    """The door options of a parsed command line."""
    return LaunchOptions(
        args.server, args.run_dir, args.model_store, args.profile, args.replicas, args.ray_address, args.attach
    )


def background_command(options: LaunchOptions, models: Mapping[str, str], example: tuple[str, str]) -> list[str]:
    """The ``serve`` command line that ``start`` runs in the background: ``models`` (name → archive folder) served
    as they are, on the same door with the same options."""
    line = [sys.executable, "-m", "doors", "serve", "--server", options.server]
    line += ["--run-dir", str(options.run_dir), "--model-store", str(options.model_store)]
    line += ["--profile", options.profile, "--example", "=".join(example)]
    line += [*(["--replicas", str(options.replicas)] if options.replicas is not None else [])]
    line += [*(["--ray-address", options.ray_address] if options.ray_address else [])]
    line += [*(["--attach"] if options.attach else [])]
    for name, path in models.items():
        line += ["--archive", f"{name}={path}"]
    return line


def stop(run_dir: Path) -> bool:
    """Stop whichever door runs from ``run_dir`` (each door's module is asked); whether one was running."""
    stopped = False
    for module in dict.fromkeys(door.module for door in DOORS.values()):
        stopped = importlib.import_module(module).stop(run_dir) or stopped
    return stopped


def resolve_models(args: argparse.Namespace) -> tuple[dict[str, str], tuple[str, str]]:
    """The models to serve (name → archive folder, relative to the model store or absolute) and the example the
    usage shows: the ``--archive`` folders as they are, else ``--models``/``--models-file`` packaged, else the
    default models, built where missing or stale.

    Raises:
        model_store.package.PackageError: if a checkpoint folder is refused.
    """
    if args.archive:
        return dict(args.archive), args.example
    if args.models or args.models_file:
        return package_own_models(args.models, args.models_file, args.model_store)
    models = dict(DEFAULT_MODELS)
    ensure_models(args.model_store, models)
    return models, ("sentiment", "text")


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point: 0 stopped (or started, or packaged), 1 the service failed, 2 a checkpoint or
    setting was refused (nothing started)."""
    args = build_parser().parse_args(argv)
    args.run_dir, args.model_store = args.run_dir.resolve(), args.model_store.resolve()  # children run elsewhere
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    if args.command == "stop":
        print("stopped" if stop(args.run_dir) else "not running")
        return 0
    if args.command == "package" and not (args.models or args.models_file):
        print("error: `package` needs --models name=path,... or --models-file FILE (MODELS=/MODELS_FILE=)")
        return 2
    from doors.torchserve.protos import generate
    from model_store.package import PackageError

    generate()
    try:
        models, example = resolve_models(args)
    except PackageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.command == "package":
        for name, path in models.items():
            print(f"{name}: {args.model_store / path}")
        return 0
    method = os.environ.get(DEFAULT_METHOD_ENV, "").strip()
    if method:  # the default method of every model: refused here, before anything starts, where it cannot apply
        try:
            check_served_default(args.model_store, models, method)
        except ValueError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
    options = options_of(args)
    if args.command == "start":  # the same `serve`, in the background, supervising
        code, message = start_in_background(background_command(options, models, example), args.run_dir)
        print(message, flush=True, file=sys.stdout if code == 0 else sys.stderr)
        return code
    door = importlib.import_module(get_door(args.server).module)
    return int(door.serve(options, models, example))
