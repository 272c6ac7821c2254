"""The monitor of a model served by TorchServe: the handler hands each served row to the model's monitor (its
``monitor:`` setting absent: on with the defaults), and after a few explained rows the exporter's ``/metrics`` shows
the model's drift window (``explain_attribution_window_rows``) and its explanation-health histograms."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from doors.torchserve.config import Ports
from doors.torchserve.process import Server
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


def _predict(server: Server, document: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        f"{server.inference_url}/predictions/sentiment",
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
    total = 0.0
    for line in text.splitlines():
        if line.startswith("explain_attribution_window_rows{") and 'model="sentiment"' in line:
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
