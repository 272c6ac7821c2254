"""The ``monitor:`` setting of a model (the models file, an archive's settings, ``explain-serve``'s flags).

::

    monitor: {window: 500, k: 20, baseline: FILE, canaries: FILE, interval_s: 600}

- ``window``: the sliding window in explained rows (default 500), or ``window_s``: in seconds (give one);
- ``k``: nDCG@k and the top-k lists of the rank correlation (default 20);
- ``baseline``: a baseline file (``explain-monitor baseline``; absent: the first full window);
- ``canaries``: a canary file (``explain-monitor canaries record``; absent: no canaries);
- ``interval_s``: seconds between canary runs (default 600);
- ``capacity``: counters of each heavy-hitters sketch (default 1000: mean shares within 0.001);
- ``queue``: rows waiting for the monitor's thread before new ones are dropped (default 1024).

Absent, ``true`` or ``{}``: on, with the defaults; ``false``: off. :func:`parse_monitor` is pure (it checks the
values, not the files: :func:`monitoring.monitor.load_monitor` reads them).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .ranking import DEFAULT_K
from .sketch import DEFAULT_CAPACITY


class MonitorConfigError(ValueError):
    """A ``monitor:`` setting that is not valid (the message names the key)."""


@dataclass(frozen=True)
class MonitorConfig:
    """A model's monitoring settings (see the module docstring)."""

    window: int | None = 500
    window_s: float | None = None
    k: int = DEFAULT_K
    baseline: Path | None = None
    canaries: Path | None = None
    interval_s: float = 600.0
    capacity: int = DEFAULT_CAPACITY
    queue: int = 1024


_KEYS = ("window", "window_s", "k", "baseline", "canaries", "interval_s", "capacity", "queue")


def parse_monitor(value: Any, base: Path | None = None) -> MonitorConfig | None:
    """The monitoring settings of ``value`` (``None`` when monitoring is off).

    Args:
        value: the ``monitor:`` value: absent (``None``), a boolean, or a mapping of the keys above.
        base: the folder relative file paths are resolved against (the archive's, the models file's).

    Raises:
        MonitorConfigError: naming the key that is wrong and what it should be.
    """
    if value is None or value is True:
        return MonitorConfig()
    if value is False:
        return None
    if not isinstance(value, Mapping):
        raise MonitorConfigError(f"monitor must be true, false or a mapping of {', '.join(_KEYS)}; got {value!r}")
    unknown = sorted(str(key) for key in value if key not in _KEYS)
    if unknown:
        raise MonitorConfigError(f"unknown monitor key(s) {unknown}; known: {', '.join(_KEYS)}")
    window_s = _positive_number(value, "window_s")
    if window_s is not None and "window" in value:
        raise MonitorConfigError("monitor: give window (rows) or window_s (seconds), not both")
    window = None if window_s is not None else _positive_int(value, "window", 500)
    if window is not None and window < 5:
        raise MonitorConfigError(f"monitor.window must be at least 5 rows (it slides by a fifth), got {window}")
    return MonitorConfig(
        window=window,
        window_s=window_s,
        k=_positive_int(value, "k", DEFAULT_K),
        baseline=_path(value, "baseline", base),
        canaries=_path(value, "canaries", base),
        interval_s=_positive_number(value, "interval_s") or 600.0,
        capacity=_positive_int(value, "capacity", DEFAULT_CAPACITY),
        queue=_positive_int(value, "queue", 1024),
    )


def _positive_int(value: Mapping[str, Any], key: str, default: int) -> int:
    number = value.get(key, default)
    if not isinstance(number, int) or isinstance(number, bool) or number < 1:
        raise MonitorConfigError(f"monitor.{key} must be a positive integer, got {number!r}")
    return number


def _positive_number(value: Mapping[str, Any], key: str) -> float | None:
    number = value.get(key)
    if number is None:
        return None
    if not isinstance(number, int | float) or isinstance(number, bool) or not number > 0:
        raise MonitorConfigError(f"monitor.{key} must be a positive number of seconds, got {number!r}")
    return float(number)


def _path(value: Mapping[str, Any], key: str, base: Path | None) -> Path | None:
    path = value.get(key)
    if path is None:
        return None
    if not isinstance(path, str) or not path:
        raise MonitorConfigError(f"monitor.{key} must be a file path, got {path!r}")
    resolved = Path(path)
    return resolved if resolved.is_absolute() or base is None else base / resolved
