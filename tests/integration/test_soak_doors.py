"""Every door under load and faults (tests/soak_support.py): the KServe door (its process killed, then started again
as a restart policy would), Ray Serve (one of the text model's two replicas killed) and TorchServe with an explanation
pool (the router killed, then a pool worker), each under the mixed REST/gRPC load of tests/test_reliability.py (good
requests of every method and prediction, text and image, 5 % bad ones). Passes when no good request failed outside a
kill's window, every failure in it was retryable (503 / ``UNAVAILABLE``, TorchServe's "Worker died.", or no
connection), every bad request got its error code, and the door answered again within its limit.

The default run is short enough for CI: about 10 s of load at concurrency 8 per door, the tiny text model alone.
``SOAK=1`` (``make soak SERVER=kserve``, ``SERVER=ray``, ``POOL=1``) runs 60 s at concurrency 32 with the text and image
models; ``SOAK_STORE=model_store/build`` serves the default models instead of the tiny ones. Figures are logged and
appended to ``build/ops-figures.jsonl``. One door runs at a time, each stopped by its pids at the end of its test.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.doors_support import EXTRAS
from tests.ops_support import log_figures, run_load
from tests.soak_support import (
    BACKOFF_S,
    FIGURES,
    GRACE_S,
    REQUEST_TIMEOUT_S,
    SOAK,
    DoorSoak,
    judge,
    kserve_soak,
    pool_soak,
    ray_soak,
    soak_models,
)

pytestmark = pytest.mark.slow

SECONDS = 60.0 if SOAK else 10.0
CONCURRENCY = 32 if SOAK else 8


def _started(door: str, run_dir: Path) -> DoorSoak:
    models = soak_models(text_only=not SOAK)  # CI: one model, one process fewer to start per door
    if door == "kserve":
        return kserve_soak(run_dir, models, kill_at=SECONDS / 3)
    if door == "ray":
        return ray_soak(run_dir, models, kill_at=SECONDS / 3)
    return pool_soak(run_dir, models, kill_at=(SECONDS / 4, SECONDS * 0.6))


@pytest.mark.timeout(1800 if SOAK else 900)
@pytest.mark.parametrize("door", [pytest.param("kserve", marks=EXTRAS), pytest.param("ray", marks=EXTRAS), "pool"])
def test_door_under_load_with_a_kill(door: str, tmp_path: Path) -> None:
    began = time.monotonic()
    soak = _started(door, tmp_path / "run")
    started_s = time.monotonic() - began
    try:
        report = run_load(soak.target, concurrency=CONCURRENCY, seconds=SECONDS + GRACE_S, max_requests=200_000,
                          seed=3, request_timeout=REQUEST_TIMEOUT_S, on_progress=soak.on_progress,
                          until=soak.done(SECONDS), backoff=BACKOFF_S)  # fmt: skip
    finally:
        soak.stop()
    # A TorchServe worker's death may leave the batch it was gathering unanswered (docs/OPERATIONS.md): one batch.
    figures, problems = judge(report, soak.kills, unanswered_limit=8 if door == "pool" else 0)
    store = os.environ.get("SOAK_STORE") or "tiny test archives"
    figures = {"door": door, "store": store, "concurrency": CONCURRENCY, "start_s": round(started_s, 1), **soak.setup,
               **figures, "load_average": [round(value, 2) for value in os.getloadavg()]}  # fmt: skip
    log_figures(f"door_soak_{door}_{int(SECONDS)}s_c{CONCURRENCY}", figures, FIGURES)
    assert figures["requests"] >= CONCURRENCY, f"too few requests to mean anything: {figures}"
    assert figures["rest"] > 0 and figures["grpc"] > 0 and figures["bad"] > 0, figures
    assert not problems, (problems, figures)
