"""Explanation metrics, owned by ``prometheus-client`` rather than TorchServe's metrics.yaml.

Why: TorchServe histograms have fixed buckets from 5 ms to 10 s, too coarse for explanations that take 0.5–5 ms on
small models. ``prometheus-client`` lets us choose millisecond buckets. Each TorchServe worker is its own process,
so the metrics run in multiprocess mode: workers write to ``$PROMETHEUS_MULTIPROC_DIR`` (under ``run/``), and one
exporter process (:mod:`doors.torchserve.exporter`, port 8083 by default) serves their sum on ``/metrics``. Without that
variable the metrics stay in the worker process (nothing to scrape) and a warning is logged once.

Labels are bounded: ``model`` (served models), ``method`` (registered methods or ``none`` for a prediction),
``stage`` (generate, forward, backward, attribution, encode), ``code`` (the error table's codes) and ``outcome``
(explained, skipped).
"""

from __future__ import annotations

import logging
import os

from prometheus_client import Counter, Histogram

from explainers import available_methods, get_method

logger = logging.getLogger(__name__)

#: Seconds: 0.25 ms … 10 s, dense in the millisecond range.
LATENCY_BUCKETS = (
    0.00025, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04,
    0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64)
STAGES = ("generate", "forward", "backward", "attribution", "encode")
PREDICTION = "none"

EXPLANATION_SECONDS = Histogram(
    "explain_seconds",
    "Seconds one row's explanation took end to end in the worker (shared forward/backward + its attribution + encode)",
    ["model", "method"],
    buckets=LATENCY_BUCKETS,
)
STAGE_SECONDS = Histogram(
    "explain_stage_seconds",
    "Seconds of one stage of a row's explanation: forward, backward (shared by the batch), attribution, encode",
    ["model", "method", "stage"],
    buckets=LATENCY_BUCKETS,
)
EXPLANATIONS = Counter("explain_explanations", "Rows served, by method (none = prediction only)", ["model", "method"])
ERRORS = Counter("explain_errors", "Rows answered with an error, by method and error code", ["model", "method", "code"])
GENERATED_TOKENS = Counter(
    "explain_generated_tokens", "Tokens written by generation models (given continuations not counted)", ["model"]
)
UNSURE_ROWS = Counter(
    "explain_unsure_rows",
    "Rows that asked for an explanation only when unsure (below a confidence), by the method asked for and whether "
    "they were explained or skipped (confident: no backward, served as a prediction)",
    ["model", "method", "outcome"],
)
BATCH_SIZE = Histogram("explain_batch_size", "Rows per batch the worker received", ["model"], buckets=BATCH_BUCKETS)

_warned = False


def check_multiprocess() -> None:
    """Log once if the metrics cannot be exported (no ``PROMETHEUS_MULTIPROC_DIR``)."""
    global _warned
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR") and not _warned:
        _warned = True
        logger.warning("PROMETHEUS_MULTIPROC_DIR is not set: explanation metrics are not exported (docs/SERVING.md)")


def observe_row(model: str, method: str | None, stages: dict[str, float]) -> None:
    """Record one served row: its stage times and total."""
    name = method or PREDICTION
    for stage, seconds in stages.items():
        STAGE_SECONDS.labels(model, name, stage).observe(seconds)
    EXPLANATION_SECONDS.labels(model, name).observe(sum(stages.values()))
    EXPLANATIONS.labels(model, name).inc()


def observe_error(model: str, method: str | None, code: str) -> None:
    """Record one row answered with an error."""
    ERRORS.labels(model, method or PREDICTION, code).inc()


def metric_method(method: str | None) -> str:
    """A bounded ``method`` label: a registered name, ``none`` (prediction) or ``unknown``."""
    if method is None:
        return PREDICTION
    return method if method in available_methods() else "unknown"


def needs_gradients(method: str) -> bool:
    """Whether a registered method's attribution runs a backward pass (its rows share the batch's backward stage)."""
    return get_method(method).needs_gradients


def observe_generated_tokens(model: str, count: int) -> None:
    """Record the tokens a generation model wrote for one batch."""
    if count:
        GENERATED_TOKENS.labels(model).inc(count)


def observe_unsure(model: str, method: str, explained: bool) -> None:
    """Record one row that asked for an explanation only when unsure."""
    UNSURE_ROWS.labels(model, method, "explained" if explained else "skipped").inc()


def observe_batch(model: str, size: int) -> None:
    """Record the size of one batch."""
    BATCH_SIZE.labels(model).observe(size)
