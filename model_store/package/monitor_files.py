"""A model's ``monitor:`` setting in its archive (docs/MONITORING.md): the setting checked, its baseline and canary
files validated at package time and copied into the archive, and the setting written into ``model-config.yaml``
(``handler.monitor``) naming the copies, which the monitor reads relative to the archive (the served archive is
self-contained).

::

    monitor: {window: 500, k: 20, baseline: FILE, canaries: FILE, interval_s: 600}   # absent or true: on; false: off

The copies have fixed names at the archive's root (:data:`ARCHIVE_NAMES`), so the same files give the same
``model-config.yaml``; their content is hashed into the archive's fingerprint (a changed baseline is a new version).

The same setting comes from command-line flags (:func:`add_monitor_arguments`: ``python -m model_store.package``'s,
``explain-serve``'s, which apply to every model served) and is laid over a model's own key by key
(:func:`overlay`).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from model_store.package.settings import NAME_PATTERN, PackageError

#: Where each monitor file is copied in the archive (its root), by the setting's key.
ARCHIVE_NAMES = {"baseline": "monitor-baseline.json", "canaries": "monitor-canaries.json"}

#: The setting's keys that name a file.
FILE_KEYS = tuple(ARCHIVE_NAMES)

#: The key of a flags' override that turns monitoring on where a model's own setting is ``false`` (``--monitor``).
ON = "on"


def check_setting(value: Any, where: str) -> None:
    """Check a ``monitor:`` value's keys and numbers (not its files: :func:`monitor_files` reads them).

    Raises:
        PackageError: ``WHERE: monitor...`` naming the key and what it must be.
    """
    from monitoring.config import MonitorConfigError, parse_monitor

    try:
        parse_monitor(value)
    except MonitorConfigError as error:
        raise PackageError(f"{where}: {error}") from None


def monitor_files(value: Any, name: str) -> dict[str, Path]:
    """The monitor files of model ``name``'s setting, validated: archive name → the file (resolved).

    Relative paths are relative to the current directory (a models file's are made absolute when it is read).

    Raises:
        PackageError: one message naming the model, the file and what is wrong with it (missing, not JSON, not
            the format ``explain-monitor`` writes).
    """
    from monitoring.baseline import read_baseline
    from monitoring.canaries import read_canaries
    from monitoring.config import MonitorConfigError, parse_monitor

    try:
        config = parse_monitor(value)
    except MonitorConfigError as error:
        raise PackageError(f"model {name}: {error}") from None
    if config is None:
        return {}
    files: dict[str, Path] = {}
    for key, read in (("baseline", read_baseline), ("canaries", read_canaries)):
        path: Path | None = getattr(config, key)
        if path is None:
            continue
        path = path.expanduser()
        try:
            read(path)
        except ValueError as error:  # "bad baseline file PATH: REASON"
            raise PackageError(f"model {name}: monitor.{key}: {error}") from None
        files[ARCHIVE_NAMES[key]] = path.resolve()
    return files


def check_baseline_fits(path: Path, name: str, task: str, labels: Sequence[str]) -> None:
    """Refuse a baseline (already read once by :func:`monitor_files`) that the model's monitor could never compare:
    an entry of a method that is not registered, of a label the monitor never keeps (the model's labels, entity
    types for a token classifier, ``all`` for generation, or ``other``), or of words for an image model (patches for
    a text one).

    Raises:
        PackageError: ``model NAME: monitor.baseline: bad baseline file PATH: entry METHOD / LABEL: REASON``.
    """
    from explainers import available_methods, label_scheme
    from monitoring.baseline import read_baseline
    from monitoring.readers import ALL, OTHER

    if task == "generation":
        allowed = {ALL}
    elif task == "token_classification":
        allowed = {tag.type for tag in label_scheme(list(labels)).tags if not tag.outside}
    else:
        allowed = set(labels)
    allowed.add(OTHER)
    kind = "patches" if task == "image" else "words"
    methods = set(available_methods())
    for (method, label), entry in read_baseline(path).entries.items():
        if method not in methods:
            problem = f"{method!r} is not a registered method"
        elif label not in allowed:
            problem = f"label {label!r} is none of this model's: {', '.join(sorted(allowed))}"
        elif entry.kind != kind:
            problem = f"its shares are over {entry.kind}, a {task} model's are over {kind}"
        else:
            continue
        raise PackageError(
            f"model {name}: monitor.baseline: bad baseline file {path}: entry {method} / {label}: {problem}"
        )


def archived_setting(value: Any) -> Any:
    """The ``handler.monitor`` value of the archive: ``None`` (absent: on) and booleans as they are, a mapping with
    its files replaced by their names in the archive (:data:`ARCHIVE_NAMES`)."""
    if not isinstance(value, Mapping):
        return value
    return {key: ARCHIVE_NAMES.get(key, item) for key, item in value.items()}


def resolve_files(value: Any, base: Path) -> Any:
    """``value`` with its relative file paths made relative to ``base`` (a models file's folder)."""
    if not isinstance(value, Mapping):
        return value
    resolved = dict(value)
    for key in FILE_KEYS:
        path = resolved.get(key)
        if isinstance(path, str) and path and not Path(path).expanduser().is_absolute():
            resolved[key] = str(base / path)
    return resolved


def overlay(own: Any, override: Any) -> Any:
    """A model's ``monitor:`` value (``own``) with ``override`` laid over it (flags that apply to every model).

    ``override`` ``None``: ``own``; ``False``: off; ``True``: on (``own``'s keys kept, ``false`` turned on); a
    mapping: its keys replace ``own``'s (``window`` and ``window_s`` replace each other) where the model is monitored
    (a model's ``monitor: false`` stays off unless the mapping has ``on: true``, as ``--monitor`` gives).
    """
    if override is None:
        return own
    if override is False:
        return False
    base = dict(own) if isinstance(own, Mapping) else {}
    if override is True:
        return base or True
    keys = {key: value for key, value in override.items() if key != ON}
    if own is False and not override.get(ON):
        return False
    if "window" in keys:
        base.pop("window_s", None)
    if "window_s" in keys:
        base.pop("window", None)
    return {**base, **keys}


def add_monitor_arguments(parser: argparse.ArgumentParser, per_model: bool) -> None:
    """The ``--monitor*`` flags (the ``monitor:`` keys).

    Args:
        parser: the command line to add them to.
        per_model: several models are served: ``--monitor-baseline``/``--monitor-canaries`` take ``NAME=FILE``
            (repeatable; a bare ``FILE`` when one model is served).
    """
    group = parser.add_argument_group(
        "monitoring (docs/MONITORING.md; each flag replaces that key of a model's own monitor: setting)"
    )
    group.add_argument(
        "--monitor",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="monitor what the explanations say: drift, canaries, health (default: on, unless a model's setting "
        "says monitor: false); --no-monitor turns it off",
    )
    group.add_argument("--monitor-window", type=int, metavar="ROWS", help="the drift window in explained rows (500)")
    group.add_argument("--monitor-k", type=int, metavar="K", help="nDCG@k and the rank correlation's top-k (20)")
    target = "[NAME=]FILE" if per_model else "FILE"
    which = " (NAME=FILE for each model when several are served; repeat)" if per_model else ""
    group.add_argument(
        "--monitor-baseline",
        action="append" if per_model else "store",
        metavar=target,
        help="the baseline file (explain-monitor baseline) the drift is measured against, copied into the archive "
        f"(default: each label's first full window){which}",
    )
    group.add_argument(
        "--monitor-canaries",
        action="append" if per_model else "store",
        metavar=target,
        help=f"the canary file (explain-monitor canaries record), copied into the archive (default: none){which}",
    )
    group.add_argument(
        "--monitor-interval", type=float, metavar="SECONDS", help="seconds between canary runs (default: 600)"
    )


def monitor_override(args: argparse.Namespace) -> Any:
    """The ``monitor:`` value the ``--monitor*`` flags give (``None``: no flag given): ``False``, ``True``, or a
    mapping of the keys given (and ``on: true`` with ``--monitor``: :func:`overlay`), file paths made absolute; with
    several models, ``baseline``/``canaries`` are mappings of model name (``""``: a bare file, for the one model
    served) to file.

    Raises:
        ValueError: for ``--no-monitor`` with other monitor flags, a value out of range (checked as the setting is),
            or ``NAME=FILE`` given twice for one model.
    """
    from monitoring.config import parse_monitor

    keys: dict[str, Any] = {}
    if args.monitor_window is not None:
        keys["window"] = args.monitor_window
    if args.monitor_k is not None:
        keys["k"] = args.monitor_k
    if args.monitor_interval is not None:
        keys["interval_s"] = args.monitor_interval
    parse_monitor(keys)  # the numbers, checked as a models file's
    for key in FILE_KEYS:
        given = getattr(args, f"monitor_{key}")
        if given is None:
            continue
        if isinstance(given, str):
            keys[key] = str(Path(given).expanduser().resolve())
        else:
            keys[key] = _per_model_files(given, f"--monitor-{key}")
    if args.monitor is False:
        if keys:
            raise ValueError(f"--no-monitor turns monitoring off: drop {', '.join(_flags(keys))}")
        return False
    if keys:
        return {**keys, ON: True} if args.monitor else keys
    return True if args.monitor else None


def _flags(keys: Mapping[str, Any]) -> list[str]:
    names = {"window": "window", "k": "k", "interval_s": "interval", "baseline": "baseline", "canaries": "canaries"}
    return [f"--monitor-{names[key]}" for key in keys]


def _per_model_files(values: Sequence[str], flag: str) -> dict[str, str]:
    """``[NAME=]FILE`` values as model name (``""``: none given) → absolute path."""
    files: dict[str, str] = {}
    for value in values:
        name, separator, path = value.partition("=")
        if not separator or NAME_PATTERN.fullmatch(name) is None or not path:
            name, path = "", value
        if name in files:
            raise ValueError(f"{flag} names {name or 'a bare FILE'} twice")
        files[name] = str(Path(path).expanduser().resolve())
    return files


def override_for(override: Any, name: str, names: Sequence[str], where: str) -> Any:
    """The part of a flags' ``override`` (:func:`monitor_override`, possibly read back from JSON) for model
    ``name`` among the served ``names``: a per-model file mapping reduced to that model's file.

    Raises:
        PackageError: a bare file with several models served, or a file for a model that is not served.
    """
    if not isinstance(override, Mapping):
        return override
    chosen = {key: value for key, value in override.items() if key not in FILE_KEYS}
    for key in FILE_KEYS:
        value = override.get(key)
        if value is None:
            continue
        files = {"": value} if isinstance(value, str) else dict(value)
        unknown = sorted(model for model in files if model and model not in names)
        if unknown:
            raise PackageError(f"{where}: {key} for {unknown}, which is not served (served: {', '.join(names)})")
        if "" in files and len(names) > 1:
            raise PackageError(
                f"{where}: one {key} file for {len(names)} models: give NAME=FILE for each model it belongs to"
            )
        path = files.get(name, files.get(""))
        if path is not None:
            chosen[key] = path
    return chosen
