"""Reliability of the served service under load and faults (real TorchServe on free loopback ports, bounded runs).

- mixed load: REST and gRPC (JSON and protobuf), every method and plain prediction, text and image models, 5% bad
  requests, at concurrency 32: zero failed good requests, every bad request gets its 4xx error;
- a worker SIGKILLed mid-load: only the requests in flight at the kill fail, with a clear 5xx (no hang), and the
  service answers again within 10 s;
- worker memory over many explanations stays flat after warm-up.

The default run is short enough for CI (10 s of load, 300 explanations). ``SOAK=1`` (``make soak``) runs the full
versions: 60 s of load and 5,000 explanations. Figures are logged and appended to ``build/ops-figures.jsonl``.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from doors.torchserve.process import Server
from tests.ops_support import (
    NO_ANSWER,
    WORKERS,
    log_figures,
    management,
    ops_server,
    resident_bytes,
    rest_call,
    run_load,
    wait_for_worker,
    worker_pids,
)
from tests.serving_support import REPO_ROOT

pytestmark = pytest.mark.slow

SOAK = os.environ.get("SOAK") == "1"
LOAD_SECONDS = 60.0 if SOAK else 10.0
LOAD_MAX_REQUESTS = 200_000 if SOAK else 5_000
MEMORY_EXPLANATIONS = 5_000 if SOAK else 300
FIGURES = REPO_ROOT / "build" / "ops-figures.jsonl"
RECOVERY_LIMIT_S = 10.0
#: Client deadline of the worker-kill load: how long a request TorchServe dropped keeps its caller waiting.
KILL_REQUEST_TIMEOUT_S = 10.0


@pytest.fixture(scope="session")
def server(request: pytest.FixtureRequest) -> Server:
    return ops_server(request)


def test_mixed_load_has_no_failed_good_request(server: Server) -> None:
    report = run_load(server, concurrency=32, seconds=LOAD_SECONDS, max_requests=LOAD_MAX_REQUESTS, seed=1)
    figures = report.summary()
    log_figures(f"mixed_load_{int(LOAD_SECONDS)}s_c32", figures, FIGURES)
    assert figures["requests"] >= 32, f"too few requests to mean anything: {figures}"
    assert figures["rest"] > 0 and figures["grpc"] > 0 and figures["bad"] > 0, figures
    assert len(figures["methods"]) >= 6, figures
    assert not report.good_failures, [outcome.__dict__ for outcome in report.good_failures[:5]]
    assert not report.bad_misanswered, [outcome.__dict__ for outcome in report.bad_misanswered[:5]]
    assert server.torchserve_pid and worker_pids(server, "sentiment") and worker_pids(server, "digits")


@pytest.fixture
def one_text_worker(server: Server) -> Iterator[int]:
    """The text model scaled to one worker for the test (management API), so that every request reaches the worker
    being measured; scaled back to ``WORKERS['sentiment']`` afterwards, also on failure."""
    status, reply = management(server, "/models/sentiment?min_worker=1&max_worker=1&synchronous=true", method="PUT")
    assert status == 200, reply
    deadline = time.monotonic() + 60
    while len(worker_pids(server, "sentiment")) != 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    pids = worker_pids(server, "sentiment")
    assert len(pids) == 1, pids
    try:
        yield pids[0]
    finally:
        count = WORKERS["sentiment"]
        management(server, f"/models/sentiment?min_worker={count}&max_worker={count}&synchronous=true", method="PUT")
        wait_for_worker(server, "sentiment", count=count, timeout=180)


@pytest.mark.timeout(3600 if SOAK else 600)
def test_worker_memory_stays_flat(server: Server, one_text_worker: int) -> None:
    """Resident memory of the (only) text worker after a warm-up, then over ``MEMORY_EXPLANATIONS`` explanations
    sent by 8 threads (every method but plain prediction, varied texts so that shapes vary)."""
    pid = one_text_worker
    methods = ("relevance", "rollout", "attention", "gae", "grad_x_input", "integrated_gradients")
    words = ["lovely", "awful", "quick", "slow", "crew", "seat", "food", "delay", "staff", "flight"]

    def document(index: int) -> bytes:
        text = " ".join(words[(index * 7 + k) % len(words)] for k in range(3 + index % 40))
        explain: dict[str, Any] = {"method": methods[index % len(methods)]}
        if explain["method"] == "integrated_gradients":
            explain["n_steps"] = 4
        return json.dumps({"text": text, "explain": explain}).encode()

    def send(start: int, count: int) -> list[int]:
        failures: list[int] = []
        lock = threading.Lock()
        counter = [start]

        def loop() -> None:
            while True:
                with lock:
                    index = counter[0]
                    if index >= start + count:
                        return
                    counter[0] += 1
                status, _ = rest_call(server, "sentiment", document(index))
                if status != 200:
                    with lock:
                        failures.append(status)

        threads = [threading.Thread(target=loop) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=3000)
        return failures

    assert not send(0, 200), "warm-up requests failed"
    baseline = resident_bytes(pid)
    samples = [baseline]
    chunk = max(50, MEMORY_EXPLANATIONS // 10)
    done = 0
    started = time.monotonic()
    failures: list[int] = []
    while done < MEMORY_EXPLANATIONS:
        count = min(chunk, MEMORY_EXPLANATIONS - done)
        failures += send(200 + done, count)
        done += count
        samples.append(resident_bytes(pid))
    growth = samples[-1] - baseline
    second_half = samples[-1] - samples[len(samples) // 2]
    figures = {
        "explanations": done,
        "failures": len(failures),
        "seconds": round(time.monotonic() - started, 1),
        "rss_after_warmup_mb": round(baseline / 2**20, 1),
        "rss_end_mb": round(samples[-1] / 2**20, 1),
        "growth_mb": round(growth / 2**20, 2),
        "growth_percent": round(100 * growth / baseline, 2),
        "growth_second_half_mb": round(second_half / 2**20, 2),
        "samples_mb": [round(sample / 2**20, 1) for sample in samples],
    }
    log_figures(f"worker_memory_{done}", figures, FIGURES)
    assert worker_pids(server, "sentiment") == [pid], "the worker restarted during the memory run"
    assert not failures
    # Flat: under 5% of the warm worker's size over the whole run, and no steady climb in its second half.
    assert growth < 0.05 * baseline, figures
    assert second_half < 0.025 * baseline, figures


def test_killed_worker_comes_back_and_only_in_flight_requests_fail(server: Server) -> None:
    """SIGKILL one of the text model's two workers 3 s into a load at concurrency 8: the requests of the batch it
    was running fail with a clear 5xx (REST 507 "Worker died"; gRPC RESOURCE_EXHAUSTED, TorchServe's mapping of
    507); the twin worker keeps answering; the killed worker is replaced.

    TorchServe 0.12 defect, asserted as such: requests its worker thread was still gathering into the dead worker's
    next batch (the ``maxBatchDelay`` wait) are dropped without an answer, so their callers wait for their own
    deadline (docs/OPERATIONS.md). The test bounds them: at most one batch, all sent before the death was noticed.
    """
    count = WORKERS["sentiment"]
    wait_for_worker(server, "sentiment", count=count)
    old_pid = worker_pids(server, "sentiment")[0]
    kill_at: list[float] = []

    def inject(elapsed: float) -> None:
        if not kill_at and elapsed >= 3.0:
            kill_at.append(time.monotonic())
            os.kill(old_pid, signal.SIGKILL)

    report = run_load(server, concurrency=8, seconds=16.0, max_requests=4_000, bad_fraction=0.0, seed=2,
                      request_timeout=KILL_REQUEST_TIMEOUT_S, on_progress=inject)  # fmt: skip
    assert kill_at, "the worker was never killed (load too short?)"
    killed = kill_at[0]
    wait_for_worker(server, "sentiment", not_pid=old_pid, timeout=90, count=count)
    detected = killed + _log_seconds_after(server, killed, "Worker disconnected")
    restarted = _log_seconds_after(server, killed, "-> WORKER_MODEL_LOADED")
    sentiment = [outcome for outcome in report.outcomes if outcome.model == "sentiment"]
    failed = [outcome for outcome in report.outcomes if not outcome.ok]
    unanswered = [outcome for outcome in failed if outcome.status in NO_ANSWER]
    answered = [outcome for outcome in report.outcomes if outcome.status not in NO_ANSWER]
    # In flight = sent before TorchServe noticed the death (its batch may have been handed to the dying worker)
    # and not finished when it was killed.
    in_flight = [outcome for outcome in sentiment if outcome.started <= detected and outcome.finished > killed]
    after = [outcome for outcome in sentiment if outcome.started > killed and outcome.ok]
    recovery = min(outcome.finished for outcome in after) - killed if after else float("inf")
    figures: dict[str, Any] = {
        "requests": len(report.outcomes),
        "served": sum(outcome.ok for outcome in report.outcomes),
        "failed": len(failed),
        "failed_with_5xx": len(failed) - len(unanswered),
        "dropped_unanswered": len(unanswered),
        "in_flight_at_kill": len(in_flight),
        "failed_statuses": sorted({outcome.status for outcome in failed}),
        "failed_details": sorted({outcome.detail[:120] for outcome in failed}),
        "death_detected_s": round(detected - killed, 3),
        "service_recovery_s": round(recovery, 2),
        "worker_replaced_s": round(restarted, 2),
        "max_latency_answered_s": round(max(outcome.finished - outcome.started for outcome in answered), 2),
        "workers_per_model": count,
    }
    log_figures("worker_kill", figures, FIGURES)
    assert recovery <= RECOVERY_LIMIT_S, figures
    # Only requests in flight at the kill failed, none on the other model: a clear server error for the batch the
    # worker was running, no answer (TorchServe's defect) for at most the one batch it was gathering.
    assert all(outcome.model == "sentiment" for outcome in failed), figures
    assert all(outcome.started <= detected and outcome.finished > killed for outcome in failed), figures
    assert all(outcome.status in {"500", "503", "507", "INTERNAL", "UNAVAILABLE", "RESOURCE_EXHAUSTED"}
               for outcome in failed if outcome.status not in NO_ANSWER), figures  # fmt: skip
    status, described = management(server, "/models/sentiment")
    assert status == 200, described
    assert len(unanswered) <= described[0]["batchSize"], figures  # the most one worker gathers
    assert len(failed) <= len(in_flight), figures
    # Everything TorchServe answered, it answered promptly (nothing else waited for the deadline).
    assert figures["max_latency_answered_s"] < KILL_REQUEST_TIMEOUT_S, figures
    # The service is whole again.
    status, reply = rest_call(server, "sentiment", b'{"text": "fine again", "explain": true}')
    assert status == 200 and reply["explanation"]["scores"], reply


def _log_seconds_after(server: Server, since: float, marker: str) -> float:
    """Seconds from ``since`` (``time.monotonic``) to the first line of TorchServe's log about the text model that
    contains ``marker`` and is stamped after ``since`` (log stamps are UTC wall time, converted with the current
    offset between the two clocks); infinity if there is none."""
    now_wall, now_mono = time.time(), time.monotonic()
    since_wall = now_wall - (now_mono - since)
    stamps = []
    for line in (server.log_dir / "ts_log.log").read_text(errors="replace").splitlines():
        if marker in line and ("sentiment" in line or "epollEventLoopGroup" in line):
            try:
                stamp = datetime.strptime(line[:23], "%Y-%m-%dT%H:%M:%S,%f").replace(tzinfo=UTC).timestamp()
            except ValueError:
                continue
            if stamp > since_wall - 0.05:
                stamps.append(stamp)
    return max(0.0, min(stamps) - since_wall) if stamps else float("inf")
