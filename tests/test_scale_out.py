"""Scale-out on a local Ray cluster of simulated nodes (``ray.cluster_utils.Cluster``: a head without CPUs and three
one-CPU nodes), bounded in requests and time: the tiny sentiment model behind the KServe door as one replica and as
two replicas on two distinct nodes, every request answered under a fixed concurrent load; then a replica SIGKILLed in
the middle of the load: only requests in flight on it fail, each with a retryable answer (503) that the client's
retry turns into an answer, none is lost, and the replacement replica answers within the bound. Throughput is
measured and logged (``python -m bench.doors scale`` reports it), not asserted: timings here are noisy."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import pytest

from bench.doors import format_scale, scale
from tests.doors_support import EXTRAS
from tests.serving_support import tiny_archives

pytestmark = [pytest.mark.slow, EXTRAS]
logger = logging.getLogger(__name__)
CONCURRENCY = 4


def test_replicas_on_simulated_nodes_and_a_replica_killed_under_load(tmp_path: Path) -> None:
    archive = tiny_archives()["sentiment"]
    report = scale(archive, requests=32, concurrency=CONCURRENCY, fault_requests=60, repeats=1, run_dir=tmp_path)
    logger.warning("scale-out on simulated nodes (tiny model):\n%s", format_scale(report, CONCURRENCY))
    assert report.placement == {"r1": 1, "r2": 2}, "two replicas on two distinct simulated nodes"
    assert all(cell.errors == 0 for cell in report.cells), report.cells
    assert {cell.door for cell in report.cells} == {"r1", "r2"} and all(cell.throughput > 0 for cell in report.cells)
    fault = report.fault
    assert fault is not None
    assert fault.answered == fault.requests and fault.lost == 0 and fault.other_errors == 0, fault
    # Only requests in flight on the killed replica fail (at most the load's concurrency), each retried.
    assert fault.failed_before_retry <= CONCURRENCY, fault
    assert math.isfinite(fault.replacement_seconds) and fault.replacement_seconds < 240, fault
