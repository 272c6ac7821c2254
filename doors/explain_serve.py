"""``explain-serve``: serve Hugging Face checkpoint folders with their explanations, from any directory.

::

    explain-serve --models reviews=/models/reviews [topics=/models/topics ...] [--workdir DIR]
                  [--server torchserve|kserve|ray] [--port 8080] [--grpc-port 7070] [--default-method attnlrp]
                  [--records sqlite|sqlite:///path|postgresql://...|http(s)://...] [--records-payload full|hash|none]
                  [--monitor|--no-monitor] [--monitor-window ROWS] [--monitor-k K] [--monitor-interval SECONDS]
                  [--monitor-baseline [NAME=]FILE ...] [--monitor-canaries [NAME=]FILE ...]

Each folder (``config.json``, safetensors weights, tokenizer or image-processor files, as ``save_pretrained`` writes
them) is validated and packaged into the working directory (``WORKDIR/model_store/build/packages/NAME``, reused while
unchanged), then the service starts in the foreground, prints how to call it (the tokens are in
``WORKDIR/run/key_file.json``) and runs until Ctrl-C or SIGTERM. ``WORKDIR`` is ``--workdir``, else
``$EXPLAIN_WORKDIR``, else the current directory (:mod:`supervise.workdir`); nothing is written where the package
is installed.

This is the launcher ``make serve MODELS=...`` runs (:mod:`doors.launch`), given the working
directory's folders. ``--records STORE`` keeps a record of every answered row in ``STORE`` (docs/RECORDS.md): it
sets ``EXPLAIN_RECORDS`` (and ``--records-payload`` ``EXPLAIN_RECORDS_PAYLOAD``) for every process started, as
``EXPLAIN_RECORDS=STORE make serve`` does. The ``--monitor*`` flags set the ``monitor:`` keys of every model served
(docs/MONITORING.md), over each model's own (a models file's): they reach each archive's ``model-config.yaml``
(``handler.monitor``) through ``EXPLAIN_MONITOR`` (:func:`doors.models.monitor_from_environment`), and the baseline
and canary files are validated and copied into the archives. Exit status as the launcher's: 0 stopped, 1 the service
failed, 2 a checkpoint or setting was refused (nothing started).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from doors import DEFAULT_DOOR, DOORS
from doors.launch import DEFAULT_METHOD_ENV
from doors.models import MONITOR_ENV
from model_store.package.monitor_files import add_monitor_arguments, monitor_override
from supervise.workdir import WORKDIR_ENV
from supervise.workdir import workdir as current_workdir


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    parser = argparse.ArgumentParser(
        prog="explain-serve",
        description="Serve Hugging Face checkpoint folders (safetensors) with their explanations: package them into "
        "the working directory, start the service in the foreground (Ctrl-C stops it), print how to call it.",
    )
    parser.add_argument(
        "--models",
        nargs="+",
        metavar="NAME=PATH",
        help="checkpoint folders to serve, each as name=path (repeat, or separate with commas)",
    )
    parser.add_argument(
        "--models-file", type=Path, help="a YAML file of checkpoint folders and their settings (docs/SERVING.md)"
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help=f"where models, archives and run state go (default: ${WORKDIR_ENV}, else the current directory)",
    )
    parser.add_argument(
        "--server",
        choices=tuple(DOORS),
        default=DEFAULT_DOOR,
        help="the door: " + "; ".join(f"{door.name}: {door.summary}" for door in DOORS.values()),
    )
    parser.add_argument("--port", type=int, help="REST inference port (default: $INFERENCE_PORT, else 8080)")
    parser.add_argument("--grpc-port", type=int, help="gRPC inference port (default: $GRPC_INFERENCE_PORT, else 7070)")
    parser.add_argument(
        "--default-method",
        help=f"the method a request that names none gets, for every model (default: ${DEFAULT_METHOD_ENV}, else each "
        "model's default_method, else attnlrp)",
    )
    parser.add_argument(
        "--profile", default="archive", help="batching profile: archive (default), cpu, cpu-pooled, gpu"
    )
    parser.add_argument("--replicas", type=int, help="--server ray: replicas per model")
    parser.add_argument(
        "--records",
        metavar="STORE",
        help="keep a record of every answered row: sqlite (a file in the working directory), sqlite:///path, "
        "postgresql://..., http(s)://... (default: $EXPLAIN_RECORDS, else none)",
    )
    parser.add_argument(
        "--records-payload",
        choices=("full", "hash", "none"),
        help="how much of each input a record keeps (default: $EXPLAIN_RECORDS_PAYLOAD, else hash)",
    )
    add_monitor_arguments(parser, per_model=True)
    return parser


def monitor_environment(args: argparse.Namespace) -> dict[str, str]:
    """The ``EXPLAIN_MONITOR`` variable the ``--monitor*`` flags set (none when no flag is given: then
    ``$EXPLAIN_MONITOR`` applies, else each model's own setting).

    Raises:
        ValueError: for ``--no-monitor`` with other monitor flags, or a value out of range.
    """
    override = monitor_override(args)
    return {} if override is None else {MONITOR_ENV: json.dumps(override)}


def records_environment(args: argparse.Namespace) -> dict[str, str]:
    """The ``EXPLAIN_RECORDS*`` variables ``--records`` and ``--records-payload`` set (checked, so that a bad store
    is refused before anything starts).

    Raises:
        SettingsError: the store URL or payload is not one the records package can use.
    """
    from records import records_settings
    from records.settings import ENV_PAYLOAD, ENV_STORE

    settings: dict[str, str] = {}
    if args.records:
        settings[ENV_STORE] = args.records
    if args.records_payload:
        settings[ENV_PAYLOAD] = args.records_payload
    if settings:
        records_settings(None, {**os.environ, **settings}, "--records")
    return settings


def launcher_arguments(args: argparse.Namespace, workdir: Path) -> list[str]:
    """The launcher's ``serve`` command line (:mod:`doors.launch`) for ``args`` in ``workdir``."""
    line = ["serve", "--server", args.server, "--profile", args.profile]
    line += ["--run-dir", str(workdir / "run"), "--model-store", str(workdir / "model_store" / "build")]
    if args.models:
        entries = [item.strip() for value in args.models for item in value.split(",") if item.strip()]
        line += ["--models", ",".join(_absolute(entry) for entry in entries)]
    if args.models_file is not None:
        line += ["--models-file", str(args.models_file.resolve())]
    if args.replicas is not None:
        line += ["--replicas", str(args.replicas)]
    return line


def _absolute(entry: str) -> str:
    """``name=path`` with the path made absolute (the launcher's children run in the working directory)."""
    name, separator, path = entry.partition("=")
    return f"{name}={Path(path).expanduser().resolve()}" if separator and path else entry


def _stop_on_sigterm(number: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # before the supervisor takes over: what was started is stopped on the way out


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point: the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.models and args.models_file is None:
        parser.error("give the checkpoint folders to serve: --models name=/path/to/checkpoint (or --models-file)")
    if args.workdir is not None:
        os.environ[WORKDIR_ENV] = str(args.workdir.expanduser().resolve())
    if args.port is not None:
        os.environ["INFERENCE_PORT"] = str(args.port)
    if args.grpc_port is not None:
        os.environ["GRPC_INFERENCE_PORT"] = str(args.grpc_port)
    if args.default_method:
        os.environ[DEFAULT_METHOD_ENV] = args.default_method
    from records import SettingsError

    try:
        os.environ.update(records_environment(args))
        os.environ.update(monitor_environment(args))
    except (SettingsError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for variable in ("MODEL_STORE", "RUN_DIR", "SERVER", "MODELS", "MODELS_FILE"):  # the launcher's make settings
        os.environ.pop(variable, None)
    workdir = current_workdir()
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        os.environ[WORKDIR_ENV] = str(workdir)  # the same folder for every process started from here
    except OSError as error:
        print(f"error: cannot use {workdir} as the working directory: {error}", file=sys.stderr)
        return 2
    if not os.access(workdir, os.W_OK):
        print(f"error: the working directory {workdir} is not writable: give another with --workdir", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    from doors.launch import main as launch

    try:
        return launch(launcher_arguments(args, workdir))
    except KeyboardInterrupt:
        return 0


def entry_point() -> None:
    """The ``explain-serve`` console script."""
    sys.exit(main())


if __name__ == "__main__":
    entry_point()
