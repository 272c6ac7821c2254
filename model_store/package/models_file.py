"""The models to package, named on the command line (``make serve MODELS="name=path,..."``) or in a YAML models file
(``make serve MODELS_FILE=models.yaml``, ``python -m model_store.package --config models.yaml``) with per-model
settings and shared defaults."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from model_store.package.monitor_files import resolve_files
from model_store.package.settings import PackageError, Settings, check_name


@dataclass(frozen=True)
class ModelEntry:
    """One model to package: its name, checkpoint folder and settings."""

    name: str
    path: Path | str
    settings: Settings


def parse_models(spec: str, defaults: Settings | None = None) -> list[ModelEntry]:
    """Parse ``name=path[,name=path...]`` (``make serve MODELS=...``).

    Raises:
        PackageError: for an entry without ``=``, an unsafe name or a name given twice.
    """
    entries: list[ModelEntry] = []
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, separator, path = item.partition("=")
        if not separator or not path.strip():
            raise PackageError(f'MODELS entry {item!r} is not name=path, e.g. MODELS="reviews=/models/reviews"')
        entries.append(ModelEntry(check_name(name.strip()), path.strip(), defaults or Settings()))
    return _distinct(entries, "MODELS")


def read_models_file(path: Path) -> list[ModelEntry]:
    """Read a YAML file of several models::

        defaults:            # optional, applies to every model
          device: cpu
        models:
          reviews:
            path: /models/reviews          # relative paths are relative to the YAML file
            default_method: rollout
            max_length: 256
          tickets: {path: /models/tickets, threshold: 0.4}
          writer: {path: /models/writer, chat_template: templates/chatml.jinja}   # a file, or the template itself
          news:                            # the monitor's files are copied into the archive
            path: /models/news
            monitor: {window: 500, k: 20, baseline: news-baseline.json, canaries: news-canaries.json}

    Raises:
        PackageError: if the file is unreadable or a key is unknown or wrong.
    """
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as error:
        raise PackageError(f"cannot read the models file {path}: {error}") from None
    if not isinstance(document, Mapping) or not isinstance(document.get("models"), Mapping):
        raise PackageError(f"{path}: expected a mapping with a `models:` section of name: {{path: ..., ...}}")
    unknown = sorted(set(document) - {"models", "defaults"})
    if unknown:
        raise PackageError(f"{path}: unknown top-level key(s) {unknown}; allowed: defaults, models")
    defaults = document.get("defaults") or {}
    if not isinstance(defaults, Mapping):
        raise PackageError(f"{path}: `defaults:` must be a mapping of settings")
    entries: list[ModelEntry] = []
    for name, values in document["models"].items():
        where = f"{path}: models.{name}"
        if not isinstance(values, Mapping) or not isinstance(values.get("path"), str):
            raise PackageError(f"{where} must be a mapping with a `path:` to the checkpoint folder")
        model_path = Path(values["path"]).expanduser()
        if not model_path.is_absolute():
            model_path = path.parent / model_path
        own = {key: value for key, value in values.items() if key != "path"}
        settings = Settings.from_mapping({**defaults, **own}, where)
        if settings.chat_template is not None:  # a file named relative to the models file: read it here
            settings = replace(settings, chat_template=settings.chat_template_text(path.parent))
        if isinstance(settings.monitor, Mapping):  # its baseline and canary files: relative to the models file
            settings = replace(settings, monitor=resolve_files(settings.monitor, path.parent.resolve()))
        entries.append(ModelEntry(check_name(str(name)), model_path, settings))
    return _distinct(entries, str(path))


def _distinct(entries: list[ModelEntry], where: str) -> list[ModelEntry]:
    names = [entry.name for entry in entries]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise PackageError(f"{where}: model name(s) {repeated} given more than once")
    if not entries:
        raise PackageError(f"{where}: no model given")
    return entries
