"""The models the launcher serves (:mod:`doors.launch`, every door): the default models, built (or refreshed when their
fingerprint changed) by ``python -m model_store.build``, or the user's own checkpoint folders, validated and packaged
(or reused) by
:mod:`model_store.package`."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from supervise.workdir import model_store_dir, workdir

logger = logging.getLogger(__name__)

DEFAULT_MODELS = {"sentiment": "sentiment/archive", "digits": "digits/archive", "entities": "entities/archive"}

#: The monitor setting laid over every packaged model's own (``explain-serve --monitor*`` sets it): JSON, ``false``,
#: ``true`` or a mapping of ``monitor:`` keys whose ``baseline``/``canaries`` are a file or model name → file, and
#: ``on: true`` to turn on a model whose own setting is ``false`` (:mod:`model_store.package.monitor_files`).
MONITOR_ENV = "EXPLAIN_MONITOR"

__all__ = [
    "DEFAULT_MODELS",
    "MONITOR_ENV",
    "check_served_default",
    "default_model_store",
    "ensure_models",
    "missing_archives",
    "monitor_from_environment",
    "package_own_models",
]


def default_model_store() -> Path:
    """The model store served by default: ``MODEL_STORE`` where set, else ``model_store/build`` of the working
    directory (:mod:`supervise.workdir`)."""
    value = os.environ.get("MODEL_STORE")
    return Path(value).resolve() if value else model_store_dir()


def missing_archives(model_store: Path, models: Mapping[str, str]) -> list[str]:
    """The names of ``models`` (name → archive folder relative to ``model_store``) whose archive has no manifest."""
    return [name for name, path in models.items() if not (model_store / path / "MAR-INF" / "MANIFEST.json").is_file()]


def ensure_models(model_store: Path, models: Mapping[str, str]) -> None:
    """Build the default models' archives if missing, or refresh them if their fingerprints changed (a handler or
    recipe edit): ``model_store.build`` reuses what is up to date in a fraction of a second.

    A model store this process cannot write (a host folder mounted into the container, owned by another user or
    mounted read-only) is served as it is: a build would have to write its lock and fingerprint files there.

    Raises:
        FileNotFoundError: if such a read-only store lacks an archive (it cannot be built there).
    """
    missing = missing_archives(model_store, models)
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
        logger.info(
            "building the default models %s: first run only, about 15 minutes on 2 idle CPU cores (progress: bars on a "
            "terminal, a line at least every 15 s otherwise)",
            ", ".join(missing),
        )
    command = [sys.executable, "-m", "model_store.build", "--out", str(model_store)]
    for name in models:
        command += ["--only", name]
    subprocess.run(command, cwd=workdir(), check=True)


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
    entries = monitor_from_environment(entries, os.environ)
    checked = [validate(entry.path, entry.name, entry.settings) for entry in entries]
    out = model_store / "packages"
    models: dict[str, str] = {}
    for entry, checkpoint in zip(entries, checked, strict=True):
        result = package(entry.path, entry.name, out, entry.settings, checkpoint)
        models[entry.name] = str(result.archive.relative_to(model_store))
    pairs = [(entry.name, checkpoint.task) for entry, checkpoint in zip(entries, checked, strict=True)]
    return models, next((pair for pair in pairs if pair[1] == "text"), pairs[0])


def monitor_from_environment(entries: Sequence[Any], environ: Mapping[str, str]) -> list[Any]:
    """``entries`` (:class:`model_store.package.ModelEntry`) with :data:`MONITOR_ENV`'s setting laid over each
    model's own ``monitor:`` key by key (:func:`model_store.package.monitor_files.overlay`); as they are without it.

    Raises:
        PackageError: for a value that is not JSON or not a monitor setting, a bare file with several models, or a
            file for a model that is not served.
    """
    from model_store.package import PackageError
    from model_store.package.monitor_files import check_setting, overlay, override_for

    raw = environ.get(MONITOR_ENV, "").strip()
    if not raw:
        return list(entries)
    try:
        override = json.loads(raw)
    except ValueError:
        raise PackageError(f"{MONITOR_ENV} is not JSON (false, true or a mapping of monitor keys): {raw!r}") from None
    if override is not None and not isinstance(override, bool | dict):
        raise PackageError(f"{MONITOR_ENV} must be false, true or a mapping of monitor keys, got {raw!r}")
    names = [entry.name for entry in entries]
    laid = []
    for entry in entries:
        monitor = overlay(entry.settings.monitor, override_for(override, entry.name, names, MONITOR_ENV))
        check_setting(monitor, f"{MONITOR_ENV} for model {entry.name}")
        laid.append(replace(entry, settings=replace(entry.settings, monitor=monitor)))
    return laid


def check_served_default(model_store: Path, models: Mapping[str, str], method: str) -> None:
    """Refuse, before anything starts, a default method for every model (``EXPLAIN_DEFAULT_METHOD``,
    ``explain-serve --default-method``) that is not registered or that a served model's family refuses: the check each
    worker makes when it loads (:func:`serving_core.loading.check_default_method`), made here from the archives'
    ``model-config.yaml`` and ``config.json`` without loading a model.

    Raises:
        ConfigError: naming the model, the method and the methods that work on it.
    """
    import yaml

    from serving_core.config import DEFAULT_METHOD_ENV, ConfigError, default_method_setting
    from serving_core.loading import check_default_method

    default_method_setting({}, {DEFAULT_METHOD_ENV: method})  # a registered method
    for name, path in models.items():
        archive = model_store / path
        handler = (yaml.safe_load((archive / "model-config.yaml").read_text(encoding="utf-8")) or {}).get("handler", {})
        checkpoint = archive / str(handler.get("model_dir", "model")) / "config.json"
        model_type = str(json.loads(checkpoint.read_text(encoding="utf-8")).get("model_type", ""))
        try:
            check_default_method(method, model_type, str(handler.get("task", "text")))
        except ConfigError as error:
            raise ConfigError(f"model {name!r}: {error}") from None
