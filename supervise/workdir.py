"""The working directory: where the service keeps what it writes, never where its code is installed.

Models and archives go to ``WORKDIR/model_store/build/`` (the default models' builds, ``packages/`` for your own
checkpoints), run state to ``WORKDIR/run/`` (configs, tokens in ``key_file.json``, logs, pid files), TorchServe's
generated gRPC stubs to ``WORKDIR/build/protos/``. ``WORKDIR`` is ``$EXPLAIN_WORKDIR`` where it is set
(``explain-serve --workdir DIR`` sets it; in a clone the Makefile sets it to the repository, so ``make serve`` keeps
``model_store/build/`` and ``run/`` there), else the current directory. ``MODEL_STORE`` and ``RUN_DIR`` still name
either folder on its own.

The code reads its own files (handlers, ``profiles.yaml``, ``metrics.yaml``, the config template) from the installed
packages, and every process a launcher starts runs in the working directory with its modules found by ``-m``.

Standard library only (the watchdog's mechanics import it).
"""

from __future__ import annotations

import os
from pathlib import Path

#: The environment variable that names the working directory.
WORKDIR_ENV = "EXPLAIN_WORKDIR"


def workdir() -> Path:
    """The working directory: ``$EXPLAIN_WORKDIR`` (``~`` expanded, made absolute), else the current directory."""
    value = os.environ.get(WORKDIR_ENV, "").strip()
    return Path(value).expanduser().resolve() if value else Path.cwd()


def model_store_dir() -> Path:
    """Where models and archives are built and packaged: ``WORKDIR/model_store/build``."""
    return workdir() / "model_store" / "build"


def run_dir() -> Path:
    """Where the running service keeps its state: ``WORKDIR/run``."""
    return workdir() / "run"


def protos_dir() -> Path:
    """Where TorchServe's management stubs are generated: ``WORKDIR/build/protos``."""
    return workdir() / "build" / "protos"


__all__ = ["WORKDIR_ENV", "model_store_dir", "protos_dir", "run_dir", "workdir"]
