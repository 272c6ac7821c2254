"""Package your own Hugging Face checkpoint folder as a TorchServe archive of the explanation service.

``python -m model_store.package PATH --name NAME [--out DIR] [options]`` validates the folder, then writes the
TorchServe ``no-archive`` folder ``DIR/NAME/`` (default ``DIR``: ``model_store/build/packages`` of the working
directory, :mod:`supervise.workdir`), which any
TorchServe 0.12 with this project installed serves: ``torchserve --model-store DIR --models NAME=NAME``.
``python -m model_store.package --config models.yaml`` packages every model of a YAML file (docs/SERVING.md,
"Serve your own model"). ``make serve MODELS="name=path,..."`` calls the same code.

One job per module, each readable alone:

- :mod:`~model_store.package.settings`: :class:`PackageError`, the per-model :class:`Settings`, the name rule.
- :mod:`~model_store.package.checkpoint_files`: which files of the folder are copied; ``config.json`` and the
  safetensors headers read without running anything (pickle weights are refused, with the conversion command).
- :mod:`~model_store.package.validate`: :func:`validate`, every check before anything is written, giving a
  :class:`Checkpoint`.
- :mod:`~model_store.package.packaging`: :func:`package` writes (or, while its fingerprint is unchanged, reuses) the
  archive.
- :mod:`~model_store.package.monitor_files`: the ``monitor:`` setting, its baseline and canary files validated and
  copied into the archive, and the ``--monitor*`` flags.
- :mod:`~model_store.package.models_file`: ``MODELS="name=path,..."`` and the YAML models file.
- :mod:`~model_store.package.cli`: the command line.

This module is the public surface: import from ``model_store.package``.
"""

from model_store.package.checkpoint_files import PICKLE_SUFFIXES, SAFE_SUFFIXES
from model_store.package.cli import main
from model_store.package.limits import DEFAULT_MAX_LENGTH
from model_store.package.models_file import ModelEntry, parse_models, read_models_file
from model_store.package.packaging import FINGERPRINTS_DIR, Packaged, default_out, fingerprint, package, serving_config
from model_store.package.settings import NAME_PATTERN, PackageError, Settings, Task, check_name
from model_store.package.validate import Checkpoint, validate

__all__ = [
    "DEFAULT_MAX_LENGTH",
    "FINGERPRINTS_DIR",
    "NAME_PATTERN",
    "PICKLE_SUFFIXES",
    "SAFE_SUFFIXES",
    "Checkpoint",
    "ModelEntry",
    "PackageError",
    "Packaged",
    "Settings",
    "Task",
    "check_name",
    "default_out",
    "fingerprint",
    "main",
    "package",
    "parse_models",
    "read_models_file",
    "serving_config",
    "validate",
]
