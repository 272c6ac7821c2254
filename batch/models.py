"""The models of a batch job: ``--model NAME=PATH``, each PATH an archive folder or a checkpoint folder, and the
version each one is answered with.

- An **archive folder** (``model-config.yaml`` beside the checkpoint folder ``model/``: the default models' archives
  ``model_store/build/<name>/archive``, the packages ``model_store/build/packages/<name>``) is served with its own
  settings, as every door serves it;
- a **checkpoint folder** (what ``save_pretrained`` wrote) is validated and given the settings ``explain-serve`` would
  package it with (:func:`model_store.package.validate`, :func:`model_store.package.serving_config`), nothing written.

A model's :attr:`BatchModel.version` is the SHA-256 of its settings (the ``model-config.yaml`` document) and of every
checkpoint file's name and content: the same weights and settings give the same version on any machine, and any change
to either gives another one (a job's manifest, :mod:`batch.manifest`, holds it). Its
:attr:`BatchModel.served_version` is the version the doors' records name (:mod:`records`): an archive's
``handler.model_version`` or fingerprint (:func:`serving_core.recording.served_version`), a checkpoint folder's the
fingerprint ``explain-serve`` gives its package with the default settings (:func:`model_store.package.fingerprint`);
a re-explanation of stored records (:mod:`batch.records_source`) compares it with theirs.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from model_store.files import file_sha256
from model_store.package import Settings, fingerprint, serving_config, validate
from serving_core.config import HandlerConfig
from serving_core.recording import served_version

#: The settings file of an archive folder.
MODEL_CONFIG = "model-config.yaml"


@dataclass(frozen=True)
class BatchModel:
    """One model of a job, not loaded yet.

    Attributes:
        name: the name lines ask for (``/predictions/<name>``, an OpenAI body's ``model``).
        path: the folder given (archive or checkpoint).
        config: the handler config it is served with.
        model_dir: the checkpoint folder.
        batch_size: rows per batch by default (the archive's ``batchSize``).
        version: the fingerprint of its settings and checkpoint files (module docstring).
        served_version: the version the doors' records of it name (module docstring; ``None``: an archive packaged
            elsewhere, which names none).
    """

    name: str
    path: Path
    config: HandlerConfig
    model_dir: Path
    batch_size: int
    version: str
    served_version: str | None = None


def parse_model_spec(spec: str) -> tuple[str, Path]:
    """``NAME=PATH`` → ``(NAME, PATH)``.

    Raises:
        ValueError: if the spec has no ``=``, an empty name or an empty path.
    """
    name, sep, path = spec.partition("=")
    if not sep or not name.strip() or not path.strip():
        raise ValueError(f"--model {spec!r}: expected NAME=PATH (an archive folder or a checkpoint folder)")
    return name.strip(), Path(path.strip()).expanduser()


def open_model(name: str, path: Path) -> BatchModel:
    """The model ``name`` served from the folder ``path`` (module docstring): its settings and version.

    Raises:
        FileNotFoundError: if ``path`` is not a folder.
        ValueError: if the settings are invalid or the checkpoint cannot be served (the message says why).
    """
    if not path.is_dir():
        raise FileNotFoundError(f"model {name}: {path} is not a folder (pass an archive or a checkpoint folder)")
    if (path / MODEL_CONFIG).is_file():
        document = yaml.safe_load((path / MODEL_CONFIG).read_text(encoding="utf-8")) or {}
        config = HandlerConfig.from_model_yaml(document)
        model_dir = path / config.model_dir
        served = served_version(path)
    else:
        document, served = _checkpoint_settings(name, path)
        config = HandlerConfig.from_model_yaml(document)
        model_dir = path
    batch_size = document.get("batchSize", 8)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"model {name}: batchSize must be a positive integer, got {batch_size!r}")
    version = model_version(document, model_dir)
    return BatchModel(name, path.resolve(), config, model_dir.resolve(), batch_size, version, served)


def _checkpoint_settings(name: str, path: Path) -> tuple[dict[str, Any], str]:
    """The ``model-config.yaml`` document ``explain-serve`` would package the checkpoint folder with, and the
    fingerprint its package would have (the version the package's records name).

    Raises:
        ValueError: (``PackageError``) if the folder cannot be served, with the fix.
    """
    checkpoint = validate(path, name)
    settings = Settings()
    document: dict[str, Any] = serving_config(checkpoint, settings).to_dict()
    document["handler"]["model_dir"] = "."
    return document, fingerprint(checkpoint, settings, name)[0]


def model_version(document: Any, model_dir: Path) -> str:
    """SHA-256 of the settings document and of each checkpoint file (name and content), in name order."""
    digest = hashlib.sha256()
    digest.update(json.dumps(document, sort_keys=True, default=str).encode("utf-8"))
    for file in sorted(item for item in model_dir.iterdir() if item.is_file()):
        digest.update(f"\n{file.name}:{file_sha256(file)}".encode())
    return digest.hexdigest()
