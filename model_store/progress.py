"""Progress of long builds: bars on a terminal, plain lines elsewhere (logs, CI, containers).

The first ``make serve`` trains the default models for about ten minutes. On a terminal that shows tqdm bars; where
the output is not a terminal (``docker build``, CI logs, ``make serve > log``) redrawn bars are unreadable, so each
step is reported as log lines instead: one when it starts, one at least every :data:`INTERVAL_S` seconds while it
runs (from a heartbeat thread, so also during one slow step) with the step, how far it is and the time remaining,
and one when it ends::

    INFO sentiment: fine-tune: 412/1250 batches (33%), 2m05s elapsed, about 4m15s remaining (loss=0.612)

The mode is chosen once per process: ``EXPLAIN_PROGRESS=bars|lines|off`` (``python -m model_store.build
--progress``), else ``bars`` when standard error is a terminal and ``lines`` otherwise. Display only: nothing here
changes what is built, and this file is not part of any model's fingerprint.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

logger = logging.getLogger(__name__)

Mode = Literal["bars", "lines", "off"]
MODES: tuple[Mode, ...] = ("bars", "lines", "off")
#: The environment variable that forces a mode.
MODE_ENV = "EXPLAIN_PROGRESS"
#: Longest silence, in seconds, of the ``lines`` mode while a step runs.
INTERVAL_S = 15.0
#: What callers pass down: ``False`` (off), ``True`` (the environment or the terminal decides) or a mode.
ProgressSetting = bool | Mode


def progress_mode(enabled: ProgressSetting = True, environ: dict[str, str] | None = None, stream: Any = None) -> Mode:
    """The display mode: ``enabled`` itself when it names a mode, ``off`` when it is False, else
    ``$EXPLAIN_PROGRESS``, else ``bars`` on a terminal (``stream``, default standard error) and ``lines`` elsewhere.

    Raises:
        ValueError: if ``$EXPLAIN_PROGRESS`` is not one of :data:`MODES`.
    """
    if isinstance(enabled, str):
        if enabled not in MODES:
            raise ValueError(f"progress mode {enabled!r} is not one of {', '.join(MODES)}")
        return enabled
    if not enabled:
        return "off"
    value = (environ if environ is not None else os.environ).get(MODE_ENV, "").strip().lower()
    if value:
        if value not in MODES:
            raise ValueError(f"{MODE_ENV}={value!r} is not one of {', '.join(MODES)}")
        return value
    stream = stream if stream is not None else sys.stderr
    return "bars" if getattr(stream, "isatty", lambda: False)() else "lines"


def duration(seconds: float) -> str:
    """``75.4`` → ``1m15s``; ``3725`` → ``1h02m05s``; under a minute, whole seconds."""
    whole = max(0, round(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m{secs:02d}s"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def plural(unit: str) -> str:
    """``batch`` → ``batches``, ``image`` → ``images``."""
    return unit + ("es" if unit.endswith(("s", "x", "ch", "sh")) else "s")


@dataclass
class Step:
    """One reported step: a counted one (``total`` known) or an uncounted stage.

    The remaining time is the rate so far applied to what is left, measured from the first completed unit (the
    first one often includes warm-up, so the estimate waits for it).
    """

    desc: str
    total: int | None = None
    unit: str = "it"
    done: int = 0
    postfix: dict[str, Any] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)
    first_done_at: float | None = None
    first_done: int = 0

    def line(self, now: float | None = None) -> str:
        """The step's state as one line."""
        now = time.monotonic() if now is None else now
        elapsed = duration(now - self.started)
        if self.total is None:
            return f"{self.desc}: {elapsed} elapsed"
        percent = 100 * self.done / self.total if self.total else 100.0
        text = f"{self.desc}: {self.done}/{self.total} {plural(self.unit)} ({percent:.0f}%), {elapsed} elapsed"
        remaining = self.remaining(now)
        text += f", about {duration(remaining)} remaining" if remaining is not None else ", estimating time remaining"
        if self.postfix:
            text += " (" + ", ".join(f"{key}={value}" for key, value in self.postfix.items()) + ")"
        return text

    def remaining(self, now: float) -> float | None:
        """Seconds left at the rate so far, or None before there is a rate."""
        if self.total is None or self.first_done_at is None or self.done <= self.first_done:
            return None
        rate = (self.done - self.first_done) / max(now - self.first_done_at, 1e-9)
        return max(self.total - self.done, 0) / rate

    def advance(self, n: int = 1) -> None:
        """Count ``n`` more units done."""
        self.done += n
        if self.first_done_at is None:
            self.first_done_at, self.first_done = time.monotonic(), self.done


class Reporter:
    """The ``lines`` mode's heartbeat: logs the innermost running step every ``interval`` seconds of silence."""

    def __init__(self, interval: float = INTERVAL_S, log: logging.Logger = logger) -> None:
        self.interval = interval
        self.log = log
        self._steps: list[Step] = []
        self._lock = threading.Lock()
        self._last = time.monotonic()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def say(self, text: str) -> None:
        """Log one line now (and restart the silence clock)."""
        self._last = time.monotonic()
        self.log.info("%s", text)

    def push(self, step: Step, first_line: str) -> None:
        """Start reporting ``step`` (innermost from now on)."""
        with self._lock:
            self._steps.append(step)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._beat, name="progress-heartbeat", daemon=True)
                self._thread.start()
        self.say(first_line)

    def pop(self, step: Step, last_line: str | None) -> None:
        """Stop reporting ``step``."""
        with self._lock:
            if step in self._steps:
                self._steps.remove(step)
        if last_line:
            self.say(last_line)

    def _beat(self) -> None:
        while True:
            self._wake.wait(min(1.0, self.interval))
            with self._lock:
                if not self._steps:
                    self._thread = None
                    return
                step = self._steps[-1]
            if time.monotonic() - self._last >= self.interval:
                self.say(step.line())


_REPORTER = Reporter()


class LineProgress:
    """A counted step of the ``lines`` mode, with the part of tqdm's interface the recipes use."""

    def __init__(
        self,
        iterable: Iterable[Any] | None = None,
        *,
        total: int | None = None,
        desc: str = "",
        unit: str = "it",
        reporter: Reporter | None = None,
    ) -> None:
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            total = len(iterable)  # type: ignore[arg-type]
        self.iterable = iterable
        self.step = Step(desc, total, unit)
        self.reporter = reporter or _REPORTER
        self.closed = False
        counted = f"0/{total} {plural(unit)}, started" if total is not None else "started"
        self.reporter.push(self.step, f"{desc}: {counted}")

    def update(self, n: int = 1) -> None:
        """Count ``n`` more units done."""
        self.step.advance(n)

    def set_postfix(self, refresh: bool = False, **values: Any) -> None:
        """Values shown after the count (for example the running loss)."""
        self.step.postfix = dict(values)

    def close(self) -> None:
        """End the step with one line saying how long it took."""
        if self.closed:
            return
        self.closed = True
        took = duration(time.monotonic() - self.step.started)
        count = (
            f"{self.step.done}/{self.step.total} {plural(self.step.unit)}" if self.step.total is not None else "done"
        )
        self.reporter.pop(self.step, f"{self.step.desc}: {count} in {took}")

    def __iter__(self) -> Iterator[Any]:
        if self.iterable is None:
            raise TypeError("LineProgress without an iterable cannot be iterated")
        try:
            for item in self.iterable:
                yield item
                self.update()
        finally:
            self.close()

    def __enter__(self) -> LineProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def progress_bar(
    iterable: Iterable[Any] | None = None,
    *,
    total: int | None = None,
    desc: str = "",
    unit: str = "it",
    enabled: ProgressSetting = True,
    leave: bool = True,
) -> Any:
    """A tqdm bar (``bars``), a :class:`LineProgress` (``lines``) or a silent tqdm (``off``), per :func:`progress_mode`.

    All three take ``update(n)``, ``set_postfix(**values, refresh=False)``, ``close()`` and iterate over
    ``iterable`` when one is given.
    """
    mode = progress_mode(enabled)
    if mode == "lines":
        return LineProgress(iterable, total=total, desc=desc, unit=unit)
    from tqdm.auto import tqdm

    return tqdm(iterable, total=total, desc=desc, unit=unit, disable=mode == "off", leave=leave)


@contextlib.contextmanager
def stage(desc: str, enabled: ProgressSetting = True) -> Iterator[None]:
    """Report an uncounted step: its start (every mode but ``off``), and in ``lines`` mode a line every
    :data:`INTERVAL_S` seconds of silence and one at its end."""
    mode = progress_mode(enabled)
    if mode == "off":
        yield
        return
    if mode == "bars":
        logger.info("%s", desc)
        yield
        return
    step = Step(desc)
    _REPORTER.push(step, f"{desc}: started")
    try:
        yield
    finally:
        _REPORTER.pop(step, f"{desc}: done in {duration(time.monotonic() - step.started)}")
