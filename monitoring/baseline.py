"""The baseline file: each (method, label)'s mean shares over a reference set, as ``explain-monitor baseline``
writes it, packaged with the model (``monitor: {baseline: FILE}``).

A JSON document::

    {"format": "explain-monitor-baseline", "version": 1, "model": "sentiment", "capacity": 1000,
     "entries": [{"method": "attnlrp", "label": "positive", "kind": "words", "rows": 812,
                  "shares": [["great", 0.031], ["love", 0.027], ...]}, ...]}

``kind`` is ``words`` (keys are case-folded words) or ``patches`` (keys are ``[row, column]`` of the patch grid);
``shares`` are the mean shares of the keys the baseline kept (at most ``capacity``, largest first; a key not kept
had a mean share of at most ``1 / capacity``). :func:`read_baseline` refuses a file that is not exactly this with one
:class:`BaselineError` naming the file and what is wrong.
"""

from __future__ import annotations

import json
import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .shares import mean_shares

FORMAT = "explain-monitor-baseline"
VERSION = 1
KINDS = ("words", "patches")


class BaselineError(ValueError):
    """A baseline file that cannot be used (the message names the file and the reason)."""


@dataclass(frozen=True)
class BaselineEntry:
    """The baseline of one (method, label).

    Attributes:
        method: the method.
        label: the label (a class, an entity type, ``all``).
        kind: ``words`` or ``patches``.
        rows: the reference rows it was built from.
        shares: each kept key's mean share.
    """

    method: str
    label: str
    kind: str
    rows: int
    shares: Mapping[Hashable, float]


@dataclass(frozen=True)
class Baseline:
    """A model's baseline: its entries by ``(method, label)``."""

    model: str
    entries: Mapping[tuple[str, str], BaselineEntry]
    capacity: int = 1000


def key_kind(key: Hashable) -> str:
    """``patches`` for a ``(row, column)`` key, else ``words``."""
    return "patches" if isinstance(key, tuple) else "words"


def baseline_document(baseline: Baseline) -> dict[str, Any]:
    """The JSON document of a baseline (shares largest first)."""
    entries = []
    for entry in baseline.entries.values():
        ordered = sorted(entry.shares.items(), key=lambda item: -item[1])[: baseline.capacity]
        shares = [[list(key) if isinstance(key, tuple) else key, share] for key, share in ordered]
        entries.append(
            {"method": entry.method, "label": entry.label, "kind": entry.kind, "rows": entry.rows, "shares": shares}
        )
    return {"format": FORMAT, "version": VERSION, "model": baseline.model, "capacity": baseline.capacity,
            "entries": entries}  # fmt: skip


def write_baseline(baseline: Baseline, path: Path) -> None:
    """Write ``baseline`` to ``path`` as JSON."""
    path.write_text(json.dumps(baseline_document(baseline), ensure_ascii=False, indent=1) + "\n", encoding="utf-8")


def read_baseline(path: Path) -> Baseline:
    """Read and validate a baseline file.

    Raises:
        BaselineError: ``bad baseline file PATH: REASON``, for a file that is missing, not JSON, or not the format.
    """
    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
        return parse_baseline(document)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, ValueError) as error:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        raise BaselineError(f"bad baseline file {path}: {reason}") from None


def parse_baseline(document: Any) -> Baseline:
    """A baseline from its parsed JSON document.

    Raises:
        ValueError: saying what is wrong.
    """
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise ValueError(f"not an {FORMAT} document (its 'format' must be {FORMAT!r})")
    if document.get("version") != VERSION:
        raise ValueError(f"version {document.get('version')!r} is not {VERSION}")
    model = document.get("model")
    capacity = document.get("capacity")
    entries = document.get("entries")
    if not isinstance(model, str):
        raise ValueError("'model' must be a string")
    if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 1:
        raise ValueError("'capacity' must be a positive integer")
    if not isinstance(entries, list):
        raise ValueError("'entries' must be a list")
    parsed: dict[tuple[str, str], BaselineEntry] = {}
    for position, entry in enumerate(entries):
        item = _entry(entry, position)
        if (item.method, item.label) in parsed:
            raise ValueError(f"entries[{position}]: a second entry for {item.method} / {item.label}")
        parsed[item.method, item.label] = item
    return Baseline(model, parsed, capacity)


def _entry(entry: Any, position: int) -> BaselineEntry:
    where = f"entries[{position}]"
    if not isinstance(entry, dict) or set(entry) != {"method", "label", "kind", "rows", "shares"}:
        raise ValueError(f"{where} must have exactly the keys method, label, kind, rows, shares")
    method, label, kind, rows, shares = (entry[key] for key in ("method", "label", "kind", "rows", "shares"))
    if not (isinstance(method, str) and method and isinstance(label, str) and label):
        raise ValueError(f"{where}: method and label must be non-empty strings")
    if kind not in KINDS:
        raise ValueError(f"{where}: kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if not isinstance(rows, int) or isinstance(rows, bool) or rows < 1:
        raise ValueError(f"{where}: rows must be a positive integer")
    if not isinstance(shares, list):
        raise ValueError(f"{where}: shares must be a list of [key, share]")
    parsed: dict[Hashable, float] = {}
    for pair in shares:
        key = _key(pair, kind, where)
        share = pair[1]
        if not isinstance(share, int | float) or isinstance(share, bool) or not math.isfinite(share) or share < 0:
            raise ValueError(f"{where}: share of {key!r} must be a finite non-negative number")
        parsed[key] = float(share)
    if sum(parsed.values()) > 1.0 + 1e-6:
        raise ValueError(f"{where}: mean shares sum to more than 1")
    return BaselineEntry(method, label, kind, rows, parsed)


def _key(pair: Any, kind: str, where: str) -> Hashable:
    if not isinstance(pair, list) or len(pair) != 2:
        raise ValueError(f"{where}: each share must be a [key, share] pair")
    key = pair[0]
    if kind == "words":
        if not isinstance(key, str):
            raise ValueError(f"{where}: a word key must be a string, got {key!r}")
        return key
    if not (isinstance(key, list) and len(key) == 2 and all(isinstance(v, int) and v >= 0 for v in key)):
        raise ValueError(f"{where}: a patch key must be [row, column], got {key!r}")
    return (int(key[0]), int(key[1]))


def entries_from_windows(
    shares: Mapping[tuple[str, str], Sequence[dict[Hashable, float]]],
) -> dict[tuple[str, str], BaselineEntry]:
    """Exact baseline entries from each (method, label)'s rows of shares (the reference set, in memory)."""
    entries = {}
    for (method, label), rows in shares.items():
        means = mean_shares(list(rows))
        kind = key_kind(next(iter(means))) if means else "words"
        entries[method, label] = BaselineEntry(method, label, kind, len(rows), means)
    return entries
