"""One model's monitor: what the serving core hands it per served row, read off the request path.

:meth:`Monitor.observe` only puts ``(row, outcome)`` on a bounded queue (a full queue drops the row and counts it in
``explain_monitor_dropped_rows``); the monitor's daemon thread reads each row (:mod:`monitoring.readers`), adds its
explanations' health numbers to the histograms, their shares to the drift window of their (method, label)
(:class:`~monitoring.drift.DriftTracker`), and keeps the coverage of the last ``window`` rows it was handed
(:meth:`Monitor.coverage`, in process; the exported coverage is taken across workers, :mod:`monitoring.metrics`).
Canaries run on their own thread (:meth:`Monitor.start_canaries`). Memory per model: the queue, one window per
(method, label) — at most ``5 × capacity`` counters each, and methods and labels are the registry's and the
model's — and the coverage window of ``window`` method names.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from typing import Any

from . import metrics
from .baseline import Baseline, read_baseline
from .canaries import Canary, CanaryReading, CanaryRunner, Explain, read_canaries
from .config import MonitorConfig
from .drift import DriftReading, DriftTracker
from .readers import Reader, Reading

logger = logging.getLogger(__name__)


class Monitor:
    """The monitor of one served model (see the module docstring)."""

    def __init__(
        self,
        model: str,
        config: MonitorConfig,
        reader: Reader,
        *,
        baseline: Baseline | None = None,
        canaries: list[Canary] | None = None,
        clock: Callable[[], float] = time.monotonic,
        start: bool = True,
    ) -> None:
        """A monitor of ``model``.

        Args:
            model: the served model's name (the ``model`` label).
            config: its ``monitor:`` settings.
            reader: reads one served row (:mod:`monitoring.readers`, the model's task's).
            baseline: the baseline (``None``: each (method, label)'s first full window).
            canaries: the canary set (``None``: none); :meth:`start_canaries` runs it.
            clock: seconds, monotonic (a time window's clock).
            start: start the thread now (tests drive :meth:`process` themselves with ``False``).
        """
        self.model = model
        self.config = config
        self.reader = reader
        self.baseline = baseline
        self.canaries = canaries
        self.clock = clock
        self.trackers: dict[tuple[str, str], DriftTracker] = {}
        self.readings: dict[tuple[str, str], DriftReading] = {}
        self.canary_runner: CanaryRunner | None = None
        self.dropped = 0
        self._served: deque[str | None] = deque(maxlen=config.window or 500)
        self._explained: Counter[str] = Counter()
        self._queue: queue.Queue[tuple[Any, Any] | None] = queue.Queue(maxsize=config.queue)
        self._thread: threading.Thread | None = None
        if start:
            self._thread = threading.Thread(target=self._loop, name=f"monitor-{model}", daemon=True)
            self._thread.start()

    def observe(self, row: Any, outcome: Any) -> None:
        """Hand over one served row and its outcome (never blocks: a full queue drops the row, counted)."""
        try:
            self._queue.put_nowait((row, outcome))
        except queue.Full:
            self.dropped += 1
            metrics.DROPPED.labels(self.model).inc()

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until every row handed over so far is processed (tests, benchmarks).

        Raises:
            TimeoutError: if the thread has not caught up within ``timeout`` seconds.
        """
        if self._thread is None:
            while not self._queue.empty():
                item = self._queue.get_nowait()
                if item is not None:
                    self.process(*item)
            return
        deadline = time.monotonic() + timeout
        with self._queue.all_tasks_done:
            while self._queue.unfinished_tasks:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"the monitor of {self.model} did not catch up in {timeout} s")
                self._queue.all_tasks_done.wait(left)

    def close(self) -> None:
        """Stop the threads (rows still queued are dropped)."""
        if self.canary_runner is not None:
            self.canary_runner.stop()
        if self._thread is not None:
            with contextlib.suppress(queue.Full):
                self._queue.put(None, timeout=1.0)
            self._thread.join(5.0)
            self._thread = None

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                self.process(*item)
            except Exception:
                logger.exception("the monitor of %s could not read a row", self.model)
            finally:
                self._queue.task_done()

    def process(self, row: Any, outcome: Any) -> Reading:
        """Read one served row and update the windows and metrics (the monitor's thread calls it)."""
        reading = self.reader(row, outcome)
        if not reading.predicted:
            return reading
        self._count(reading.method)
        now = self.clock()
        for observation in reading.explained:
            shares = observation.shares
            metrics.SPECIAL_SHARE.labels(self.model, observation.method).observe(shares.special_share)
            metrics.ENTROPY.labels(self.model, observation.method).observe(shares.entropy)
            metrics.NEGATIVE_SHARE.labels(self.model, observation.method).observe(shares.negative_share)
            if not observation.drift or not shares.shares:
                continue
            key = (observation.method, observation.label)
            tracker = self.trackers.get(key) or self._tracker(key, patches=isinstance(next(iter(shares.shares)), tuple))
            drift = tracker.add(shares.shares, now)
            labels = (self.model, *key)
            metrics.WINDOW_ROWS.labels(*labels).set(tracker.window.rows)
            if tracker.baseline is not None:
                metrics.BASELINE_ROWS.labels(*labels).set(tracker.baseline_rows)
            if drift is not None:
                self.readings[key] = drift
                metrics.NDCG.labels(*labels).set(drift.ndcg)
                metrics.RANK_CORRELATION.labels(*labels).set(drift.rank_correlation)
                if drift.mass_cosine is not None:
                    metrics.MASS_COSINE.labels(*labels).set(drift.mass_cosine)
        return reading

    def _tracker(self, key: tuple[str, str], patches: bool) -> DriftTracker:
        entry = self.baseline.entries.get(key) if self.baseline is not None else None
        tracker = DriftTracker(
            entry.shares if entry is not None else None,
            entry.rows if entry is not None else 0,
            patches=patches,
            size=self.config.window,
            seconds=self.config.window_s,
            k=self.config.k,
            capacity=self.config.capacity,
        )
        self.trackers[key] = tracker
        return tracker

    def _count(self, method: str | None) -> None:
        """The coverage window: one served row, explained by ``method`` or not (``None``)."""
        if len(self._served) == self._served.maxlen:
            oldest = self._served[0]
            if oldest is not None:
                self._explained[oldest] -= 1
        self._served.append(method)
        if method is not None:
            self._explained[method] += 1

    def coverage(self) -> dict[str, float]:
        """Each method's explained rows over the served rows of the coverage window (this monitor's rows: the
        exported coverage is Prometheus's ratio of every worker's ``explain_explanations_total``,
        :mod:`monitoring.metrics`)."""
        return {name: count / len(self._served) for name, count in self._explained.items() if self._served}

    def start_canaries(self, explain: Explain, is_idle: Callable[[], bool] = lambda: True) -> CanaryRunner | None:
        """Run the canary set (if any) at start and every ``interval_s`` in idle time; its readings are published.

        Args:
            explain: explains a batch of probes on the model (serialized with its serving).
            is_idle: whether the model is idle now.
        """
        if not self.canaries:
            return None
        self.canary_runner = CanaryRunner(
            self.canaries, explain, interval_s=self.config.interval_s, is_idle=is_idle, on_reading=self.publish_canaries
        )
        self.canary_runner.start()
        return self.canary_runner

    def publish_canaries(self, readings: dict[str, CanaryReading]) -> None:
        """Set the canary gauges from one run's readings."""
        for method, reading in readings.items():
            metrics.CANARY_AGREEMENT.labels(self.model, method).set(reading.agreement)
            metrics.CANARY_PREDICTION_AGREEMENT.labels(self.model, method).set(reading.prediction_agreement)


def load_monitor(model: str, config: MonitorConfig | None, reader: Reader, **options: Any) -> Monitor | None:
    """The model's monitor with its baseline and canary files read (``None`` when ``config`` is ``None``: off).

    Raises:
        ValueError: one message naming the model and what is wrong with its baseline or canary file.
    """
    if config is None:
        return None
    try:
        baseline = read_baseline(config.baseline) if config.baseline is not None else None
        canaries = read_canaries(config.canaries) if config.canaries is not None else None
    except ValueError as error:
        raise ValueError(f"model {model}: monitor: {error}") from None
    return Monitor(model, config, reader, baseline=baseline, canaries=canaries, **options)
