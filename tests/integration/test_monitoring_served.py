"""The monitor of a model served by TorchServe: the handler hands each served row to the model's monitor (its
``monitor:`` setting absent: on with the defaults), and after a few explained rows the exporter's ``/metrics`` shows
the model's drift window (``explain_attribution_window_rows``) and its explanation-health histograms. A packaged
model with an explanation pool and a baseline file: the pool's monitor reads the baseline copied into the archive,
and the rows of both pools are counted under the model's name, whose ratio is the model's coverage."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from doors.torchserve.config import Ports
from doors.torchserve.process import Server
from tests import checkpoints
from tests.serving_support import REPO_ROOT, tiny_archives, wait_for

pytestmark = pytest.mark.slow

TEXTS = ["a lovely film", "a dull film", "a fine and gentle film", "not good at all"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    from doors.torchserve.process import start, stop

    archive = tiny_archives()["sentiment"]
    run_dir = tmp_path_factory.mktemp("monitored-torchserve")
    served = start(run_dir, REPO_ROOT, {"sentiment": str(archive.resolve())}, Ports.free(), timeout=300)
    try:
        yield served
    finally:
        stop(run_dir)


def _predict(server: Server, document: dict[str, Any], model: str = "sentiment") -> dict[str, Any]:
    request = urllib.request.Request(
        f"{server.inference_url}/predictions/{model}",
        data=json.dumps(document).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {server.keys['inference']}"},
    )
    with urllib.request.urlopen(request, timeout=120) as reply:
        return dict(json.loads(reply.read()))


def _metrics(server: Server) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.ports.exporter}/metrics", timeout=10) as response:
        return str(response.read().decode())


def _window_rows(text: str) -> float:
    """The sum of the sentiment model's ``explain_attribution_window_rows`` samples."""
    return _total(text, "explain_attribution_window_rows", 'model="sentiment"')


def _total(text: str, name: str, *needles: str) -> float:
    """The sum of the samples of ``name`` whose labels hold every needle."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(needle in line.split("}")[0] for needle in needles):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_explained_rows_reach_the_monitor_s_metrics(server: Server) -> None:
    for text in TEXTS:
        answer = _predict(server, {"text": text, "explain": {"method": "grad_x_input"}})
        assert answer["explanation"]["method"] == "grad_x_input"
    assert wait_for(lambda: _window_rows(_metrics(server)) >= len(TEXTS), timeout=30), _metrics(server)
    text = _metrics(server)
    for histogram in ("explain_attribution_entropy", "explain_attribution_special_share"):
        counts = [
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith(f"{histogram}_count{{") and 'model="sentiment"' in line and "grad_x_input" in line
        ]
        assert sum(counts) >= len(TEXTS), histogram


@pytest.fixture(scope="module")
def pooled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """``reviews``: an own checkpoint packaged with an explanation pool and a baseline file (its labels' words)."""
    from doors.torchserve.process import start, stop
    from model_store.package import Settings, package
    from monitoring.baseline import Baseline, BaselineEntry, write_baseline

    folder = tmp_path_factory.mktemp("pooled")
    baseline = folder / "baseline.json"
    entries = {
        ("grad_x_input", label): BaselineEntry("grad_x_input", label, "words", 321, {"film": 0.2, "lovely": 0.1})
        for label in ("LABEL_0", "LABEL_1")
    }
    write_baseline(Baseline("reviews", entries), baseline)
    settings = Settings(device="cpu", explanation_workers=1, monitor={"window": 5, "baseline": str(baseline)})
    archive = package(checkpoints.generic_labels(folder / "reviews"), "reviews", folder / "store", settings).archive
    baseline.unlink()  # served from the archive's copy
    run_dir = folder / "run"
    served = start(run_dir, REPO_ROOT, {"reviews": str(archive.resolve())}, Ports.free(), timeout=300)
    try:
        yield served
    finally:
        stop(run_dir)


def test_a_pool_reads_its_packaged_baseline_and_every_worker_counts_towards_coverage(pooled: Server) -> None:
    assert pooled.pools == ("reviews",)
    for text in TEXTS:
        _predict(pooled, {"text": text}, "reviews")  # the model's own workers
        _predict(pooled, {"text": text + " again"}, "reviews")
        answer = _predict(pooled, {"text": text, "explain": {"method": "grad_x_input"}}, "reviews")  # the pool's
        assert answer["explanation"]["method"] == "grad_x_input"

    def counted() -> bool:
        text = _metrics(pooled)
        return _total(text, "explain_explanations_total", 'model="reviews"') >= 3 * len(TEXTS)

    assert wait_for(counted, timeout=30), _metrics(pooled)
    text = _metrics(pooled)
    explained = _total(text, "explain_explanations_total", 'model="reviews"', 'method="grad_x_input"')
    predicted = _total(text, "explain_explanations_total", 'model="reviews"')
    assert (explained, predicted) == (len(TEXTS), 3 * len(TEXTS))  # the coverage rule's ratio: 1/3
    assert "reviews.explain" not in text, "a pool's rows are counted under its model's name"
    assert "explain_coverage" not in text  # no worker's own ratio is exported
    assert wait_for(lambda: _total(_metrics(pooled), "explain_attribution_baseline_rows", 'model="reviews"') > 0, 30)
    rows = [
        float(line.rsplit(" ", 1)[1])
        for line in _metrics(pooled).splitlines()
        if line.startswith("explain_attribution_baseline_rows{") and 'model="reviews"' in line
    ]
    assert rows and set(rows) == {321.0}  # the packaged baseline's row count, read by the pool's monitor
