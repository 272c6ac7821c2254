"""The monitor's maths and bookkeeping (monitoring/): nDCG@k and Spearman against sklearn and scipy, the
heavy-hitters sketch's bound and memory, the sliding window, drift on a stream of known shift (and none on a shuffled
one), the ``monitor:`` setting, the baseline and canary files refused with one message, canary agreement, the queue
that drops when full, and metric label values that never come from request text."""

from __future__ import annotations

import json
import random
from collections.abc import Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client import REGISTRY
from scipy.stats import spearmanr
from sklearn.metrics import ndcg_score

from monitoring import metrics
from monitoring.baseline import Baseline, BaselineEntry, BaselineError, read_baseline, write_baseline
from monitoring.canaries import CanaryError, CanaryRunner, agreement, compare, read_canaries, write_canaries
from monitoring.config import MonitorConfig, MonitorConfigError, parse_monitor
from monitoring.drift import DriftTracker
from monitoring.monitor import Monitor, load_monitor
from monitoring.ranking import compared_keys, mass_cosine, ndcg_at_k, rank_correlation
from monitoring.readers import OTHER, ClassificationReader, TokenReader
from monitoring.shares import ScoredUnit, mean_shares, row_shares
from monitoring.sketch import SpaceSaving
from monitoring.window import SlidingWindow

# --- ranking against sklearn and scipy ---------------------------------------------------------------------------


def _random_maps(rng: random.Random, ties: bool) -> tuple[dict[Hashable, float], dict[Hashable, float]]:
    words = [f"w{i}" for i in range(60)]

    def draw() -> dict[Hashable, float]:
        chosen = rng.sample(words, rng.randint(3, 50))
        values = [round(rng.random(), 1) if ties else rng.random() for _ in chosen]
        return dict(zip(chosen, values, strict=True))

    return draw(), draw()


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("k", [1, 5, 20])
def test_ndcg_is_sklearns(ties: bool, k: int) -> None:
    rng = random.Random(k * 7 + ties)
    for _ in range(50):
        window, baseline = _random_maps(rng, ties)
        keys = compared_keys(window, baseline, k)
        if len(keys) < 2 or not any(baseline.get(key, 0.0) for key in keys):
            continue
        y_true = np.array([[baseline.get(key, 0.0) for key in keys]])
        y_score = np.array([[window.get(key, 0.0) for key in keys]])
        assert ndcg_at_k(window, baseline, k) == pytest.approx(ndcg_score(y_true, y_score, k=k), abs=1e-12)


def test_ndcg_over_the_top_k_union_is_ndcg_over_every_key() -> None:
    """A key outside both top-k lists cannot change nDCG@k (no ties in the window's shares)."""
    rng = random.Random(3)
    for _ in range(50):
        window, baseline = _random_maps(rng, ties=False)
        keys = list(dict.fromkeys([*window, *baseline]))
        y_true = np.array([[baseline.get(key, 0.0) for key in keys]])
        y_score = np.array([[window.get(key, 0.0) + 1e-9 * i for i, key in enumerate(keys)]])
        window_tied = {key: float(y_score[0, i]) for i, key in enumerate(keys)}
        assert ndcg_at_k(window_tied, baseline, 10) == pytest.approx(ndcg_score(y_true, y_score, k=10), abs=1e-9)


def test_ndcg_extremes() -> None:
    baseline = {f"w{i}": 1.0 / (i + 1) for i in range(30)}
    assert ndcg_at_k(dict(baseline), baseline) == pytest.approx(1.0)
    disjoint = {f"x{i}": 1.0 / (i + 1) for i in range(25)}
    assert ndcg_at_k(disjoint, baseline) == 0.0
    # fewer than k words in the window: the baseline's words it lacks tie at 0 and share the rest of the top-k's
    # discounts, as sklearn averages ties
    assert 0 < ndcg_at_k({"other": 1.0, "words": 0.5}, baseline) < 0.5
    with pytest.raises(ValueError):
        ndcg_at_k(baseline, baseline, k=0)


@pytest.mark.parametrize("ties", [False, True])
def test_rank_correlation_is_scipys(ties: bool) -> None:
    rng = random.Random(11 + ties)
    for _ in range(50):
        window, baseline = _random_maps(rng, ties)
        keys = compared_keys(window, baseline, 20)
        first = [window.get(key, 0.0) for key in keys]
        second = [baseline.get(key, 0.0) for key in keys]
        expected = spearmanr(first, second).statistic
        got = rank_correlation(window, baseline, 20)
        if np.isnan(expected):
            assert np.isnan(got)
        else:
            assert got == pytest.approx(expected, abs=1e-12)


def test_mass_cosine() -> None:
    window = {(0, 0): 0.5, (0, 1): 0.5}
    assert mass_cosine(window, window) == pytest.approx(1.0)
    assert mass_cosine(window, {(1, 1): 1.0}) == 0.0
    assert mass_cosine({(0, 0): 1.0}, {(0, 0): 1.0, (0, 1): 1.0}) == pytest.approx(2**-0.5)


# --- shares and health -------------------------------------------------------------------------------------------


def test_row_shares_keep_specials_apart() -> None:
    units = [
        ScoredUnit("[cls]", 2.0, special=True),
        ScoredUnit("good", 3.0),
        ScoredUnit("food", -1.0),
        ScoredUnit("good", 1.0),
        ScoredUnit("[sep]", 0.0, special=True),
    ]
    shares = row_shares(units)
    assert shares.shares == {"good": pytest.approx(0.8), "food": pytest.approx(0.2)}
    assert shares.special_share == pytest.approx(2 / 7)
    assert shares.negative_share == pytest.approx(1 / 7)
    assert shares.entropy == pytest.approx(-(0.8 * np.log2(0.8) + 0.2 * np.log2(0.2)))
    empty = row_shares([ScoredUnit("a", 0.0), ScoredUnit("b", float("nan"))])
    assert empty.shares == {} and empty.special_share == 0.0 and empty.entropy == 0.0


# --- the sketch and the window -----------------------------------------------------------------------------------


def test_sketch_error_is_within_its_bound() -> None:
    rng = np.random.default_rng(0)
    sketch = SpaceSaving(50)
    truth: dict[Hashable, float] = {}
    keys = rng.zipf(1.3, 20_000) % 2000
    weights = rng.random(20_000)
    for key, weight in zip(keys.tolist(), weights.tolist(), strict=True):
        sketch.add(key, weight)
        truth[key] = truth.get(key, 0.0) + weight
    assert len(sketch) == 50
    assert sketch.total == pytest.approx(sum(truth.values()))
    assert sum(count for _, count in sketch.items()) == pytest.approx(sketch.total)
    bound = sketch.bound()
    for key, true in truth.items():
        estimate = sketch.estimate(key)
        assert abs(estimate - true) <= bound + 1e-9
        if key in sketch:
            assert true <= estimate + 1e-9 and estimate - true <= sketch.error(key) + 1e-9
        else:
            assert true <= bound + 1e-9
    heaviest = max(truth, key=lambda key: truth[key])
    assert heaviest in sketch


def test_memory_is_bounded_whatever_the_vocabulary() -> None:
    """100k distinct words through a window: its counters stay at most panes × capacity, the sketch's heap bounded."""
    window = SlidingWindow(size=500, capacity=200)
    for index in range(100_000):
        window.add({f"word{index}": 0.5, "the": 0.5}, now=float(index))
    assert window.counters() <= 5 * 200
    assert all(len(pane.sketch._heap) <= 4 * 200 for pane in window._panes)
    shares = window.mean_shares()
    assert shares["the"] == pytest.approx(0.5, abs=1 / 200)
    assert max(share for key, share in shares.items() if key != "the") <= 0.5 / 100 + 1 / 200


def test_window_mean_is_within_one_over_capacity() -> None:
    rng = random.Random(5)
    window = SlidingWindow(size=100, capacity=20)
    rows = []
    for _ in range(437):
        chosen = rng.sample(range(300), 8)
        raw = [rng.random() for _ in chosen]
        shares = {key: value / sum(raw) for key, value in zip(chosen, raw, strict=True)}
        rows.append(shares)
        window.add(shares, 0.0)
    kept = rows[-window.rows :]
    exact = mean_shares(kept)
    estimate = window.mean_shares()
    for key in exact:
        assert abs(estimate.get(key, 0.0) - exact[key]) <= 1 / 20 + 1e-9
    assert 80 < window.rows <= 100


def test_a_window_in_time_slides_on_the_clock() -> None:
    window = SlidingWindow(size=None, seconds=10.0)
    for second in range(10):
        window.add({"a": 1.0}, float(second))
    assert window.rows == 10 and not window.completed
    assert window.add({"b": 1.0}, 30.0)  # two empty panes opened and the old ones dropped
    assert window.completed
    assert window.rows == 1 and set(window.mean_shares()) == {"b"}


# --- drift on a synthetic stream ---------------------------------------------------------------------------------


def _topic(prefix: str, size: int = 200) -> tuple[list[str], np.ndarray]:
    weights = 1.0 / np.arange(1, size + 1) ** 1.1
    return [f"{prefix}{i}" for i in range(size)], weights / weights.sum()


def _rows(rng: np.random.Generator, topic: tuple[list[str], np.ndarray], count: int) -> list[dict[Hashable, float]]:
    """Rows of 12 words drawn from the topic, each scored by the word's importance times noise; shared words
    ("the", "a") too."""
    words, weights = topic
    rows = []
    for _ in range(count):
        chosen = rng.choice(len(words), size=10, replace=False, p=weights)
        units = [ScoredUnit(words[i], float(weights[i] * 40 * rng.lognormal(0, 0.3))) for i in chosen]
        units += [ScoredUnit("the", 0.2), ScoredUnit("a", 0.1), ScoredUnit("[cls]", 1.0, special=True)]
        rows.append(row_shares(units).shares)
    return rows


def test_drift_shows_a_topic_switch_within_two_windows() -> None:
    rng = np.random.default_rng(1)
    airline, cars = _topic("air"), _topic("car")
    tracker = DriftTracker(size=200, capacity=500)
    readings = []
    for row in _rows(rng, airline, 600) + _rows(rng, cars, 600):
        reading = tracker.add(row, 0.0)
        if reading is not None:
            readings.append(reading)
    assert tracker.baseline_rows == 200
    per_pane = 200 // 5
    before = readings[: (600 - 200) // per_pane]
    assert min(reading.ndcg for reading in before) > 0.9
    after_switch = readings[(600 - 200) // per_pane :]
    first_low = next(i for i, reading in enumerate(after_switch) if reading.ndcg < 0.9)
    assert (first_low + 1) * per_pane <= 2 * 200  # within two windows of rows
    assert after_switch[-1].ndcg < 0.5
    assert after_switch[-1].rank_correlation < before[-1].rank_correlation


def test_no_false_alarm_on_a_shuffled_stream() -> None:
    rng = np.random.default_rng(2)
    rows = _rows(rng, _topic("air"), 600) + _rows(rng, _topic("car"), 600)
    order = rng.permutation(len(rows))
    tracker = DriftTracker(size=200, capacity=500)
    readings = [reading for i in order if (reading := tracker.add(rows[i], 0.0)) is not None]
    assert len(readings) > 10
    assert min(reading.ndcg for reading in readings) > 0.9


def test_a_baseline_file_is_read_from_the_first_full_window() -> None:
    rng = np.random.default_rng(4)
    baseline = mean_shares(_rows(rng, _topic("car"), 300))
    tracker = DriftTracker(baseline, 300, size=100)
    readings = [tracker.add(row, 0.0) for row in _rows(rng, _topic("air"), 120)]
    first = next(position for position, reading in enumerate(readings, start=1) if reading is not None)
    reading = readings[first - 1]
    assert first == 100  # no reading of a partial window
    assert reading is not None and reading.baseline_rows == 300 and reading.window_rows == 100 and reading.ndcg < 0.5


# --- settings and files ------------------------------------------------------------------------------------------


def test_parse_monitor() -> None:
    assert parse_monitor(None) == MonitorConfig()
    assert parse_monitor(True) == MonitorConfig()
    assert parse_monitor(False) is None
    parsed = parse_monitor({"window": 50, "k": 10, "baseline": "b.json", "interval_s": 30}, Path("/archive"))
    assert parsed == MonitorConfig(window=50, k=10, baseline=Path("/archive/b.json"), interval_s=30.0)
    timed = parse_monitor({"window_s": 60})
    assert timed is not None and timed.window is None and timed.window_s == 60.0


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("yes", "monitor must be true, false or a mapping"),
        ({"windw": 5}, "unknown monitor key(s) ['windw']"),
        ({"window": 0}, "monitor.window must be a positive integer"),
        ({"window": 3}, "at least 5 rows"),
        ({"k": True}, "monitor.k must be a positive integer"),
        ({"interval_s": -1}, "monitor.interval_s must be a positive number"),
        ({"window": 10, "window_s": 5}, "not both"),
        ({"baseline": 3}, "monitor.baseline must be a file path"),
    ],
)
def test_parse_monitor_refuses(value: Any, message: str) -> None:
    with pytest.raises(MonitorConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        parse_monitor(value)


def test_baseline_file_round_trip(tmp_path: Path) -> None:
    baseline = Baseline(
        "sentiment",
        {
            ("attnlrp", "positive"): BaselineEntry("attnlrp", "positive", "words", 12, {"great": 0.3, "the": 0.1}),
            ("saliency", "cat"): BaselineEntry("saliency", "cat", "patches", 4, {(0, 1): 0.6, (1, 1): 0.4}),
        },
    )
    write_baseline(baseline, tmp_path / "b.json")
    assert read_baseline(tmp_path / "b.json") == baseline


def _good_baseline() -> dict[str, Any]:
    return {"format": "explain-monitor-baseline", "version": 1, "model": "m", "capacity": 10,
            "entries": [{"method": "attnlrp", "label": "positive", "kind": "words", "rows": 3,
                         "shares": [["good", 0.5]]}]}  # fmt: skip


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda d: d.update(format="other"), "not an explain-monitor-baseline document"),
        (lambda d: d.update(version=2), "version 2 is not 1"),
        (lambda d: d["entries"][0].update(kind="pixels"), "kind must be one of words, patches"),
        (lambda d: d["entries"][0].update(rows=0), "rows must be a positive integer"),
        (lambda d: d["entries"][0].update(shares=[["good", -1]]), "must be a finite non-negative number"),
        (lambda d: d["entries"][0].update(shares=[["good", 0.9], ["bad", 0.9]]), "sum to more than 1"),
        (lambda d: d["entries"].append(dict(d["entries"][0])), "a second entry for attnlrp / positive"),
        (lambda d: d["entries"][0].pop("rows"), "must have exactly the keys"),
    ],
)
def test_bad_baseline_files_are_refused_with_one_message(tmp_path: Path, change: Any, reason: str) -> None:
    document = _good_baseline()
    change(document)
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps(document))
    with pytest.raises(BaselineError) as raised:
        read_baseline(path)
    assert str(raised.value).startswith(f"bad baseline file {path}: ") and reason in str(raised.value)


def test_unreadable_files_are_refused_at_load(tmp_path: Path) -> None:
    (tmp_path / "broken.json").write_text("{not json")
    for key, message in (("baseline", "bad baseline file"), ("canaries", "bad canary file")):
        for name in ("missing.json", "broken.json"):
            config = MonitorConfig(**{key: tmp_path / name})  # type: ignore[arg-type]
            with pytest.raises(ValueError, match=f"model m: monitor: {message} {tmp_path / name}: "):
                load_monitor("m", config, ClassificationReader(("a", "b")), start=False)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda d: d.update(probes=[]), "'probes' must be a non-empty list"),
        (lambda d: d["probes"][0].update(scores=[1.0, "x"]), "scores must be a list of finite numbers"),
        (lambda d: d["probes"][0].update(input={}), "input must be a non-empty request document"),
        (lambda d: d["probes"][0].pop("prediction"), "must have exactly the keys"),
    ],
)
def test_bad_canary_files_are_refused(tmp_path: Path, change: Any, reason: str) -> None:
    from monitoring.canaries import Canary, Probe, ProbeAnswer

    path = tmp_path / "canaries.json"
    write_canaries("m", [Canary(Probe({"text": "hi"}, "attnlrp"), ProbeAnswer(1, [0.5, -0.25]))], path)
    assert read_canaries(path)[0].reference.scores == [0.5, -0.25]
    document = json.loads(path.read_text())
    change(document)
    path.write_text(json.dumps(document))
    with pytest.raises(CanaryError, match=reason.replace("(", r"\(")):
        read_canaries(path)


# --- canary agreement and the runner -----------------------------------------------------------------------------


def test_agreement() -> None:
    reference = [0.5, -0.25, 0.125, 0.0]
    assert agreement(reference, reference) == 1.0
    noisy = [value * (1 + 1e-6) + 1e-8 for value in reference]
    assert agreement(noisy, reference) == 1.0
    assert agreement([2 * value for value in reference], reference) == pytest.approx(2 / 3, abs=1e-3)
    assert agreement([-value for value in reference], reference) == pytest.approx(0.0, abs=1e-4)
    assert agreement(reference[:3], reference) == 0.0
    assert 0.9 < agreement([0.5, -0.25, 0.13, 0.0], reference) < 1.0


def test_runner_waits_for_idleness_and_publishes() -> None:
    from monitoring.canaries import Canary, Probe, ProbeAnswer

    canaries = [
        Canary(Probe({"text": "a"}, "attnlrp"), ProbeAnswer(1, [0.5, 0.5])),
        Canary(Probe({"text": "b"}, "attnlrp"), ProbeAnswer(0, [1.0, 0.0])),
    ]
    answers = [ProbeAnswer(1, [0.5, 0.5]), ProbeAnswer(1, [0.5, 0.5])]
    idle = {"now": False}
    calls: list[int] = []
    monitor = Monitor("canary-test", MonitorConfig(interval_s=0.05), ClassificationReader(("a", "b")),
                      canaries=canaries, start=False)  # fmt: skip

    def explain(probes: Any) -> list[ProbeAnswer]:
        calls.append(len(probes))
        return answers

    runner = monitor.start_canaries(explain, lambda: idle["now"])
    assert runner is not None
    try:
        import time

        time.sleep(0.3)
        assert calls == []  # never idle: never run
        idle["now"] = True
        deadline = time.monotonic() + 5
        while runner.runs < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert runner.runs >= 2
    finally:
        monitor.close()
    reading = compare(canaries, answers)["attnlrp"]
    assert reading.agreement == pytest.approx(0.5, abs=1e-3) and reading.prediction_agreement == 0.5
    labels = {"model": "canary-test", "method": "attnlrp"}
    assert REGISTRY.get_sample_value("explain_canary_agreement", labels) == reading.agreement
    assert REGISTRY.get_sample_value("explain_canary_prediction_agreement", labels) == 0.5


def test_runner_refuses_an_empty_set() -> None:
    with pytest.raises(ValueError):
        CanaryRunner([], lambda probes: [])


# --- the monitor: queue, readers, labels -------------------------------------------------------------------------


@dataclass
class _Row:
    text: str | None = None
    text_pair: str | None = None


@dataclass
class _Outcome:
    error: Any = None
    method: str | None = "attnlrp"
    label_id: int = 0
    scores: list[float] | None = None
    grid: tuple[int, int] | None = None
    granularity: str = "word"
    context: list[Any] | None = None
    special_tokens: list[bool] | None = None
    tokens: list[str] | None = None
    head_type: str = "single_label"
    predicted: list[int] = field(default_factory=list)


@dataclass
class _Unit:
    text: str
    special: bool = False
    segment: int | None = None


def _outcome(words: list[str], label_id: int = 0, method: str | None = "attnlrp") -> _Outcome:
    context = [_Unit("[CLS]", special=True), *(_Unit(word) for word in words), _Unit("[SEP]", special=True)]
    scores = [0.1] + [1.0 + i for i in range(len(words))] + [0.1]
    return _Outcome(method=method, label_id=label_id, scores=scores, context=context)


def test_the_monitor_drops_when_its_queue_is_full() -> None:
    monitor = Monitor("drop-test", MonitorConfig(queue=3), ClassificationReader(("neg", "pos")), start=False)
    for _ in range(5):
        monitor.observe(_Row(), _outcome(["good"]))
    assert monitor.dropped == 2
    assert REGISTRY.get_sample_value("explain_monitor_dropped_rows_total", {"model": "drop-test"}) == 2
    monitor.flush()
    assert monitor.coverage() == {"attnlrp": 1.0}


def test_coverage_counts_predicted_rows() -> None:
    monitor = Monitor("coverage-test", MonitorConfig(window=10), ClassificationReader(("neg", "pos")))
    try:
        for index in range(20):
            monitor.observe(_Row(), _outcome(["good"], method="attnlrp" if index % 4 == 0 else None))
        monitor.observe(_Row(), _Outcome(error=object()))  # an error answer is no predicted row
        monitor.flush()
    finally:
        monitor.close()
    assert monitor.coverage() == {"attnlrp": pytest.approx(0.2)}


def test_metric_labels_never_come_from_request_text() -> None:
    """Words, entity labels and methods from requests never become label values: a label outside the model's set is
    ``other``; an unregistered method ``unknown``."""
    monitor = Monitor("labels-test", MonitorConfig(window=5), ClassificationReader(("neg", "pos")), start=False)
    secret = ["password123", "alice@example.com"]
    for index in range(30):
        outcome = _outcome([*secret, f"word{index}"], label_id=7 if index % 2 else 1)
        outcome.method = "attnlrp" if index % 3 else "my-injected-method"
        monitor.process(_Row(" ".join(secret)), outcome)
    tokens = TokenReader(("O", "B-PER", "I-PER"))
    assert tokens.types == {"PER"}
    allowed = {"labels-test", "attnlrp", "unknown", "pos", OTHER}
    seen: set[str] = set()
    for family in REGISTRY.collect():
        if family.name.removesuffix("_total") not in [name.removesuffix("_total") for name in metrics.METRIC_NAMES]:
            continue
        for sample in family.samples:
            if sample.labels.get("model") == "labels-test":
                values = {value for key, value in sample.labels.items() if key != "le"}
                seen |= values
    assert seen and seen <= allowed
    assert {"other", "pos", "unknown"} <= seen
    assert REGISTRY.get_sample_value(
        "explain_attribution_window_rows", {"model": "labels-test", "method": "attnlrp", "label": OTHER}
    )


def test_images_are_monitored_per_patch_position() -> None:
    monitor = Monitor("image-test", MonitorConfig(window=5), ClassificationReader(("cat", "dog")), start=False)
    for index in range(20):
        scores = [0.0, 1.0, 2.0, 1.0] if index < 10 else [2.0, 1.0, 0.0, 1.0]
        monitor.process(_Row(), _Outcome(label_id=1, scores=scores, grid=(2, 2), granularity="token"))
    reading = monitor.readings["attnlrp", "dog"]
    assert reading.mass_cosine is not None and reading.mass_cosine < 0.9
    labels = {"model": "image-test", "method": "attnlrp", "label": "dog"}
    assert REGISTRY.get_sample_value("explain_attribution_mass_cosine", labels) == pytest.approx(reading.mass_cosine)


# --- the exporter's view of several workers ----------------------------------------------------------------------

_WORKER = """
import sys
from monitoring import metrics
value = float(sys.argv[1])
metrics.NDCG.labels("m", "attnlrp", "pos").set(value)
metrics.CANARY_AGREEMENT.labels("m", "attnlrp").set(value)
metrics.WINDOW_ROWS.labels("m", "attnlrp", "pos").set(100)
metrics.BASELINE_ROWS.labels("m", "attnlrp", "pos").set(300)
metrics.ENTROPY.labels("m", "attnlrp").observe(value)
print("ready", flush=True)
sys.stdin.read()
"""


def test_the_exporter_shows_the_worst_live_worker(tmp_path: Path) -> None:
    """Two worker processes write to one multiprocess directory: the exporter shows the lowest nDCG and canary
    agreement, the sum of window rows, the baseline's rows once, and every histogram observation."""
    import os
    import subprocess
    import sys

    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    root = Path(__file__).resolve().parents[1]
    environment = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "PYTHONPATH": str(root)}
    workers = []
    for value in ("0.95", "0.7"):
        command = [sys.executable, "-c", _WORKER, value]
        pipe = subprocess.PIPE
        workers.append(subprocess.Popen(command, stdin=pipe, stdout=pipe, env=environment, text=True))
    try:
        for worker in workers:
            assert worker.stdout is not None and worker.stdout.readline().strip() == "ready"
        registry = CollectorRegistry()
        MultiProcessCollector(registry, str(tmp_path))
        drift = {"model": "m", "method": "attnlrp", "label": "pos"}
        assert registry.get_sample_value("explain_attribution_ndcg", drift) == 0.7
        assert registry.get_sample_value("explain_canary_agreement", {"model": "m", "method": "attnlrp"}) == 0.7
        assert registry.get_sample_value("explain_attribution_window_rows", drift) == 200
        assert registry.get_sample_value("explain_attribution_baseline_rows", drift) == 300
        assert registry.get_sample_value("explain_attribution_entropy_count", {"model": "m", "method": "attnlrp"}) == 2
    finally:
        for worker in workers:
            worker.communicate("", timeout=30)


def test_a_monitor_with_a_window_in_time() -> None:
    """``window_s``: the window holds the rows of the last seconds; the first full span becomes the baseline and a
    new topic then reads low."""
    now = {"t": 0.0}
    config = parse_monitor({"window_s": 10})
    assert config is not None
    monitor = Monitor("time-test", config, ClassificationReader(("neg", "pos")), clock=lambda: now["t"], start=False)
    for step in range(60):  # two rows a second; the topic changes at 15 s
        now["t"] = step * 0.5
        monitor.process(_Row(), _outcome(["good", "food", "staff"] if step < 30 else ["slow", "rude", "cold"]))
    reading = monitor.readings["attnlrp", "neg"]
    assert monitor.trackers["attnlrp", "neg"].baseline is not None
    assert reading.ndcg < 0.5 and reading.window_rows <= 21


def test_generation_words_need_the_tokens_characters() -> None:
    """A context in tokens is grouped into words from the tokens' characters; tokens without characters (a slow
    tokenizer) and sentences give no words (health only)."""
    from monitoring.readers import prompt_words
    from serving_core.tasks.chat_schema import ContextUnit

    text = "<s>Isn't it 3.5 km?"
    pieces = [("<s>", None, None), ("Is", 3, 5), ("n't", 5, 8), (" it", 8, 11), (" 3", 11, 13), (".5", 13, 15),
              (" km", 15, 18), ("?", 18, 19)]  # fmt: skip
    context = [ContextUnit(piece, start, end, template=start is None) for piece, start, end in pieces]
    context.append(ContextUnit("ok", 0, 2, generated=True))
    assert all(start is None or text[start:end] == piece for piece, start, end in pieces)
    words = prompt_words(context, "token")
    assert words is not None
    assert words.described == (("<s>", True), ("isn't", False), ("it", False), ("3.5", False), ("km", False),
                                ("?", False))  # fmt: skip
    assert words.scores([1.0, 0.5, 0.25, 2.0, 1.0, 1.0, -3.0, 0.5, 9.0]) == [1.0, 0.75, 2.0, 2.0, -3.0, 0.5]
    assert prompt_words([ContextUnit("<s>", None, None, template=True), ContextUnit("a", None, None)], "token") is None
    assert prompt_words([ContextUnit("Isn't it.", 0, 9)], "sentence") is None
