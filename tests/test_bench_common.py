"""The serving benchmarks' shared pieces (``bench/common.py``) without a server: the closed loop of concurrent clients,
the percentile, the request bodies, and ``bench.mix``'s request kinds sent through that loop."""

from __future__ import annotations

import json
import math
import threading
import time

from bench.common import make_texts, percentile, request_body, run_cell
from bench.mix import mixed_kinds, run_mix


def test_run_cell_sends_every_body_once_at_most_concurrency_at_a_time() -> None:
    lock = threading.Lock()
    seen: list[bytes] = []
    running = [0, 0]  # now, most

    def call(body: bytes) -> bool:
        with lock:
            running[0] += 1
            running[1] = max(running)
        time.sleep(0.002 * (int(body) % 3))
        with lock:
            running[0] -= 1
            seen.append(body)
        return int(body) % 4 != 0  # every fourth fails

    bodies = [str(index).encode() for index in range(20)]
    latencies, errors, seconds = run_cell(call, bodies, 3)
    assert sorted(seen, key=int) == bodies and errors == 5 and 1 <= running[1] <= 3
    assert len(latencies) == 20 and all(latency >= 0 for latency in latencies) and seconds > 0
    assert min(latencies[index] for index in range(2, 20, 3)) >= 0.004  # in the order of the bodies


def test_percentile_interpolates_and_is_nan_for_nothing() -> None:
    assert percentile([3.0, 1.0, 2.0, 4.0], 0.5) == 2.5
    assert percentile([1.0, 2.0], 0.99) == 1.99 and percentile([7.0], 0.99) == 7.0
    assert math.isnan(percentile([], 0.5))


def test_request_bodies_and_texts() -> None:
    assert json.loads(request_body("a b", "none")) == {"text": "a b"}
    assert json.loads(request_body("a b", "attnlrp")) == {"text": "a b", "explain": {"method": "attnlrp"}}
    assert make_texts(3) == make_texts(3) and all(len(text.split()) == 26 for text in make_texts(3))


def test_run_mix_pairs_each_request_with_its_kind() -> None:
    kinds = mixed_kinds(8, 0.25)
    assert kinds.count(True) == 2

    def call(body: bytes) -> bool:
        time.sleep(0.005 if b"explain" in body else 0.0)
        return True

    results, errors, _ = run_mix(call, make_texts(8), kinds, "attnlrp", 4)
    assert errors == 0 and [kind for kind, _ in results] == kinds
    assert all(elapsed >= 0.005 for kind, elapsed in results if kind)  # an explanation's latency is its own
