"""The seam between a served model and its monitor: what a door (or the serving core) calls when a model loads and
per served row.

At load, after ``service = task.load(config, model_dir, device)``::

    monitor = start_monitor(name, task, config, service, setting, base=archive_dir, is_idle=idle, lock=lock)

(``setting``: the model's ``monitor:`` value; ``None`` when absent, which means on). It refuses a bad setting or a
bad baseline or canary file with one ``ValueError``, and returns ``None`` when monitoring is off. Per served row,
after ``task.observe(...)``::

    if monitor is not None:
        monitor.observe(row, outcome)

``lock``: the lock the door holds around ``service.run`` (the canaries run on the same model object, one batch at a
time); ``is_idle``: whether no batch is running or waiting.
"""

from __future__ import annotations

import contextlib
import copy
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from serving_core.config import HandlerConfig
from serving_core.task import Task
from serving_core.wire import Encoding

from .canaries import Explain, Probe, ProbeAnswer
from .config import parse_monitor
from .monitor import Monitor, load_monitor
from .readers import ClassificationReader, GenerationReader, Reader, TokenReader


def start_monitor(
    name: str,
    task: Task[Any, Any],
    config: HandlerConfig,
    service: Any,
    setting: Any = None,
    *,
    base: Path | None = None,
    is_idle: Callable[[], bool] = lambda: True,
    lock: threading.Lock | None = None,
) -> Monitor | None:
    """The monitor of a loaded model, its canaries started (``None``: ``monitor: false``).

    Args:
        name: the served model's name.
        task: its task.
        config: its handler config.
        service: the loaded service (``task.load``).
        setting: the ``monitor:`` value (``None``: absent, on with the defaults).
        base: the folder relative file paths are resolved against (the archive's).
        is_idle: whether the model is idle now (canaries wait for it).
        lock: held around every canary batch (the lock the door holds around ``service.run``).

    Raises:
        ValueError: one message for a bad setting, baseline file or canary file.
    """
    monitor = load_monitor(name, parse_monitor(setting, base), reader_for(config, service))
    if monitor is not None:
        monitor.start_canaries(service_explainer(task, config, service, lock), is_idle)
    return monitor


def reader_for(config: HandlerConfig, service: Any) -> Reader:
    """The reader of a loaded service's task (a text classifier's gets a copy of its tokenizer)."""
    if config.task in ("text", "image"):
        tokenizer = getattr(service, "tokenizer", None)
        own = copy.deepcopy(tokenizer) if tokenizer is not None and getattr(tokenizer, "is_fast", False) else None
        return ClassificationReader(config.labels, own, config.max_length)
    if config.task == "token_classification":
        return TokenReader(config.labels)
    return GenerationReader()


def probe_answer(outcome: Any) -> ProbeAnswer:
    """A served outcome as a canary answer: its prediction and its explanation's scores, flattened.

    Classifiers: the label index (multi-label: the predicted indices) and the scores; token classifiers: the
    entities' ``(label, start, end)`` and their scores one after the other; generation: the text and the explained
    steps' scores one after the other.
    """
    if outcome.error is not None:
        return ProbeAnswer(f"error: {outcome.error.code}", [])
    if hasattr(outcome, "entities"):
        prediction: Any = [[entity.tag, entity.start, entity.end] for entity in outcome.entities]
        scores = [value for entity in outcome.entities for value in (entity.scores or [])]
    elif hasattr(outcome, "steps"):
        prediction = outcome.text
        scores = [value for step in outcome.steps if step.scores for value in step.scores]
    else:
        prediction = list(outcome.predicted) if outcome.head_type == "multi_label" else int(outcome.label_id)
        scores = list(outcome.scores or [])
    return ProbeAnswer(prediction, [float(value) for value in scores])


def decode_documents(
    task: Task[Any, Any], config: HandlerConfig, documents: Sequence[Mapping[str, Any]], method: str | None
) -> list[Any]:
    """Each request document (``{"text": ...}``) decoded as its door would, asking for ``method`` (``None``: no
    explanation), token granularity."""
    rows = []
    for document in documents:
        body = dict(document)
        body["explain"] = {"method": method} if method is not None else False
        rows.append(task.decode_row({"body": body}, False, config))
    return rows


def service_explainer(
    task: Task[Any, Any], config: HandlerConfig, service: Any, lock: threading.Lock | None = None
) -> Explain:
    """The canary runner's ``explain`` on a loaded service: the probes as one batch, each with its method, run while
    holding ``lock`` (``None``: the caller serializes it with the service's serving)."""

    def explain(probes: Sequence[Probe]) -> list[ProbeAnswer]:
        rows = [decode_documents(task, config, [probe.document], probe.method)[0] for probe in probes]
        with lock if lock is not None else contextlib.nullcontext():
            outcomes, _ = service.run(rows, [Encoding.JSON] * len(rows))
        return [probe_answer(outcome) for outcome in outcomes]

    return explain
