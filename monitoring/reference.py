"""A model's reference answers from a file of inputs: its baseline (:func:`build_baseline`) and its canary set
(:func:`record_canaries`), computed by the serving core in this process (:mod:`monitoring.inprocess`).

An input file is JSON Lines (``.jsonl``: one request document per line, ``{"text": ...}``, or a JSON string) or
plain text (one text per line); blank lines are skipped.
"""

from __future__ import annotations

import json
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .baseline import Baseline, entries_from_windows
from .canaries import Canary, Probe, record
from .inprocess import InProcessModel
from .readers import Reader


def read_inputs(path: Path) -> list[dict[str, Any]]:
    """The request documents of an input file (see the module docstring).

    Raises:
        ValueError: naming the line that is not a JSON object or string, or for a file without inputs.
    """
    documents: list[dict[str, Any]] = []
    jsonl = Path(path).suffix == ".jsonl"
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        if not jsonl:
            documents.append({"text": line})
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}:{number}: not JSON ({error.msg})") from None
        if isinstance(value, str):
            value = {"text": value}
        if not isinstance(value, dict):
            raise ValueError(f"{path}:{number}: a request document must be a JSON object or string")
        value.pop("explain", None)
        documents.append(value)
    if not documents:
        raise ValueError(f"{path}: no inputs")
    return documents


def build_baseline(
    model: InProcessModel, documents: Sequence[Mapping[str, Any]], methods: Sequence[str], capacity: int = 1000,
    batch_size: int = 16,
) -> Baseline:  # fmt: skip
    """Each (method, label)'s exact mean shares over ``documents``, explained by each of ``methods``."""
    served = [pair for method in methods for pair in model.run(documents, method, batch_size)]
    return baseline_from_served(model.name, model.reader, served, capacity)


def baseline_from_served(
    name: str, reader: Reader, served: Sequence[tuple[Any, Any]], capacity: int = 1000
) -> Baseline:
    """The baseline of rows already served: each ``(row, outcome)`` read by the model's reader."""
    rows: dict[tuple[str, str], list[dict[Hashable, float]]] = {}
    for row, outcome in served:
        for observation in reader(row, outcome).explained:
            if observation.drift and observation.shares.shares:
                rows.setdefault((observation.method, observation.label), []).append(observation.shares.shares)
    return Baseline(name, entries_from_windows(rows), capacity)


def record_canaries(
    model: InProcessModel, documents: Sequence[Mapping[str, Any]], methods: Sequence[str]
) -> list[Canary]:
    """Every document as a probe of each of ``methods``, with its answer now as the reference."""
    probes = [Probe(dict(document), method) for method in methods for document in documents]
    return record(probes, model.explainer())
