"""Progress of the model build (model_store/progress.py): bars on a terminal, and elsewhere a line when each step
starts and ends and at least every interval while it runs, with the step, the count and the time remaining."""

from __future__ import annotations

import io
import itertools
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from doors import models as archives
from model_store import progress
from model_store.progress import LineProgress, Reporter, Step, duration, plural, progress_bar, progress_mode, stage
from tests.serving_support import REPO_ROOT


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class _Lines(logging.Handler):
    """Collects (time, message) of the records it sees."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[tuple[float, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append((record.created, record.getMessage()))

    @property
    def messages(self) -> list[str]:
        return [message for _, message in self.records]


@pytest.fixture
def lines() -> Any:
    handler = _Lines()
    log = logging.getLogger("tests.progress")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    try:
        yield handler, log
    finally:
        log.removeHandler(handler)


def test_the_mode_follows_the_setting_then_the_environment_then_the_terminal() -> None:
    assert progress_mode(False) == "off" and progress_mode("lines") == "lines" and progress_mode("bars") == "bars"
    assert progress_mode(True, environ={}, stream=_Terminal()) == "bars"
    assert progress_mode(True, environ={}, stream=io.StringIO()) == "lines", "logs, CI and containers get lines"
    assert progress_mode(True, environ={"EXPLAIN_PROGRESS": "off"}, stream=_Terminal()) == "off"
    assert progress_mode(True, environ={"EXPLAIN_PROGRESS": "LINES"}, stream=_Terminal()) == "lines"
    with pytest.raises(ValueError, match="EXPLAIN_PROGRESS='sparkles' is not one of bars, lines, off"):
        progress_mode(True, environ={"EXPLAIN_PROGRESS": "sparkles"})
    with pytest.raises(ValueError, match="is not one of"):
        progress_mode("sparkles")  # type: ignore[arg-type]


def test_durations_and_units_read_naturally() -> None:
    assert [duration(s) for s in (0, 9.6, 75.4, 600, 3725)] == ["0s", "10s", "1m15s", "10m00s", "1h02m05s"]
    assert (plural("batch"), plural("image"), plural("pass")) == ("batches", "images", "passes")


def test_the_remaining_time_is_the_rate_after_the_first_unit_applied_to_what_is_left() -> None:
    step = Step("sentiment: fine-tune", total=100, unit="batch", started=0.0)
    assert "estimating time remaining" in step.line(now=5.0)
    step.first_done_at, step.first_done, step.done = 10.0, 1, 1  # the first batch took 10 s (warm-up)
    assert step.remaining(10.0) is None
    step.done = 21  # 20 more in 40 s: 2 s each, 79 left
    step.postfix = {"loss": "0.612"}
    assert step.remaining(50.0) == pytest.approx(158.0)
    assert step.line(now=50.0) == (
        "sentiment: fine-tune: 21/100 batches (21%), 50s elapsed, about 2m38s remaining (loss=0.612)"
    )
    assert Step("digits: read", started=0.0).line(now=20.0) == "digits: read: 20s elapsed"


def test_lines_come_at_start_end_and_at_least_every_interval(lines: Any) -> None:
    handler, log = lines
    reporter = Reporter(interval=0.3, log=log)
    bar = LineProgress(total=4, desc="digits: train", unit="batch", reporter=reporter)
    for _ in range(4):
        time.sleep(0.5)  # each "batch" outlasts the interval
        bar.update()
        bar.set_postfix(loss="1.000")
    bar.close()
    bar.close()  # closing twice says nothing more
    messages = handler.messages
    assert messages[0] == "digits: train: 0/4 batches, started"
    assert messages[-1].startswith("digits: train: 4/4 batches in ")
    beats = messages[1:-1]
    assert len(beats) >= 4, messages
    assert all(beat.startswith("digits: train: ") and "elapsed" in beat for beat in beats)
    assert any("remaining" in beat and "estimating" not in beat and "(loss=1.000)" in beat for beat in beats)
    times = [created for created, _ in handler.records]
    assert max(b - a for a, b in itertools.pairwise(times)) < 0.3 + 1.0, "a silence longer than the interval"
    time.sleep(1.5)
    assert len(handler.records) == len(messages), "no heartbeat after the step ended"


def test_an_uncounted_stage_is_reported_too(monkeypatch: pytest.MonkeyPatch, lines: Any) -> None:
    handler, log = lines
    monkeypatch.setattr(progress, "_REPORTER", Reporter(interval=0.2, log=log))
    with stage("sentiment: read the corpus", "lines"):
        time.sleep(0.7)
    messages = handler.messages
    assert messages[0] == "sentiment: read the corpus: started"
    assert any(message.startswith("sentiment: read the corpus: ") and "elapsed" in message for message in messages)
    assert messages[-1].startswith("sentiment: read the corpus: done in ")
    with stage("quiet", False):
        pass
    assert handler.messages == messages, "off says nothing"


def test_progress_bar_gives_each_mode_its_display(monkeypatch: pytest.MonkeyPatch) -> None:
    from tqdm.auto import tqdm

    line = progress_bar(range(3), desc="x", unit="batch", enabled="lines")
    assert isinstance(line, LineProgress) and list(line) == [0, 1, 2] and line.step.done == 3 and line.closed
    bar = progress_bar(total=3, desc="x", enabled="bars")
    assert isinstance(bar, tqdm) and not bar.disable
    bar.close()
    silent = progress_bar(total=3, desc="x", enabled=False)
    assert isinstance(silent, tqdm) and silent.disable


def test_the_launcher_lets_the_build_show_its_progress(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls: list[list[str]] = []
    monkeypatch.setattr(archives.subprocess, "run", lambda command, **_: calls.append(command))
    archives.ensure_models(tmp_path, archives.DEFAULT_MODELS)
    assert calls and calls[0][1:3] == ["-m", "model_store.build"]
    assert not any("progress" in argument for argument in calls[0]), "the build chooses bars or lines itself"


@pytest.mark.slow
def test_a_build_outside_a_terminal_reports_its_steps_as_lines(tmp_path: Path) -> None:
    env = {key: value for key, value in os.environ.items() if key != "EXPLAIN_PROGRESS"}
    result = subprocess.run(
        [sys.executable, "-m", "model_store.build", "--tiny", "--only", "digits", "--out", str(tmp_path)],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    log = result.stderr
    assert "\r" not in log, "no redrawn bars in a log"
    for expected in (
        "INFO digits: first build of the model",
        "INFO digits: build the model: started",
        "INFO digits: train: 0/4 batches, started",
        "INFO digits: train: 4/4 batches in ",
        "INFO digits: build the model: done in ",
        "INFO digits: package the TorchServe archive: done in ",
    ):
        assert expected in log, log
