"""Ray Serve replicas behind the KServe door (a local Ray the door starts, one replica of the tiny sentiment model),
with records on (SQLite, payload full), OpenTelemetry on (an OTLP/HTTP receiver in the test) and the model's monitor on
(its default): a v1 ``:explain`` of two instances in the caller's trace is recorded by the replica, under the ids the
answer shows, with ``door: ray``, the model's version and each instance as its input; the replica's monitor reads the
rows and its metrics are on the door's ``/metrics``; the replica's batch span links the door's request span (in the
caller's trace) and parents the service's ``forward``. One door start, bounded waits."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from doors.torchserve.config import Ports
from records import open_store
from serving_core.recording import served_version
from tests.doors_support import EXTRAS
from tests.otlp_receiver import OtlpReceiver, ReceivedSpan
from tests.serving_support import tiny_archives

pytestmark = [pytest.mark.slow, EXTRAS]

TRACE_ID = f"{0x5EED:032x}"
CALLER_SPAN = "00f067aa0ba902b7"
TEXTS = ["the staff were lovely", "the food was cold"]


@dataclass
class RayDoor:
    url: str
    store: str
    version: str | None
    receiver: OtlpReceiver


@pytest.fixture(scope="module")
def ray_door(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayDoor]:
    from doors.kserve import launch

    archive = tiny_archives()["sentiment"]
    run_dir = tmp_path_factory.mktemp("ray-replicas")
    store = f"sqlite:///{run_dir / 'records.sqlite3'}"
    ports = Ports.free()
    with OtlpReceiver() as receiver:
        env = {"OMP_NUM_THREADS": "1", "EXPLAIN_RECORDS": store, "EXPLAIN_RECORDS_PAYLOAD": "full",
               "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100"}  # fmt: skip
        launch.start("ray", {"sentiment": archive}, run_dir, ports.inference, ports.grpc_inference, replicas=1,
                     timeout=400, env=env)  # fmt: skip
        try:
            yield RayDoor(f"http://127.0.0.1:{ports.inference}", store, served_version(archive), receiver)
        finally:
            launch.stop(run_dir)


def _explain(door: RayDoor) -> tuple[str, dict[str, Any]]:
    body = {"instances": [{"text": text, "explain": {"method": "grad_x_input"}} for text in TEXTS]}
    headers = {"Content-Type": "application/json", "X-Request-Id": "ray-rows",
               "traceparent": f"00-{TRACE_ID}-{CALLER_SPAN}-01"}  # fmt: skip
    request = urllib.request.Request(f"{door.url}/v1/models/sentiment:explain", json.dumps(body).encode(), headers)
    with urllib.request.urlopen(request, timeout=120) as reply:
        return reply.headers["X-Request-Id"], json.loads(reply.read())


def _metrics(door: RayDoor) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"{door.url}/metrics", timeout=30) as reply:
        text = reply.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_a_replica_records_monitors_and_links_its_batch_span(ray_door: RayDoor) -> None:
    echoed, answer = _explain(ray_door)
    assert echoed == "ray-rows" and answer["id"] == "ray-rows"
    assert answer["ids"] == ["ray-rows-0", "ray-rows-1"]
    with open_store(ray_door.store, payload="full") as store:
        for record_id, text, explanation in zip(answer["ids"], TEXTS, answer["explanations"], strict=True):
            stored = store.get(record_id)
            assert stored is not None, record_id
            data = stored.event["data"]
            assert data["door"] == "ray" and data["model"]["version"] == ray_door.version
            assert data["input"]["document"]["text"] == text and data["method"] == "grad_x_input"
            assert data["explanation"]["scores"] == explanation["scores"]
            assert stored.event["traceparent"].startswith(f"00-{TRACE_ID}-")
        assert store.verify().ok

    def window_rows(seen: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> float:
        """The drift windows' rows of grad_x_input on the model, over its labels."""
        return sum(
            value for (name, labels), value in seen.items()
            if name == "explain_attribution_window_rows"
            and ("method", "grad_x_input") in labels and ("model", "sentiment") in labels
        )  # fmt: skip

    entropy = ("explain_attribution_entropy_count", (("method", "grad_x_input"), ("model", "sentiment")))
    deadline = time.monotonic() + 60
    seen = _metrics(ray_door)
    while (window_rows(seen) < 2 or seen.get(entropy, 0) < 2) and time.monotonic() < deadline:
        time.sleep(0.5)
        seen = _metrics(ray_door)
    assert window_rows(seen) == 2 and seen.get(entropy, 0) >= 2, sorted(key for key in seen if "explain" in key[0])

    def linked(spans: list[ReceivedSpan]) -> bool:
        requests = {span.span_id for span in spans if span.trace_id == TRACE_ID and span.parent_span_id == CALLER_SPAN}
        return any(span.name == "batch" and {link[1] for link in span.links} & requests for span in spans)

    spans = ray_door.receiver.wait_for(linked, timeout=60)
    request = [span for span in spans if span.trace_id == TRACE_ID and span.parent_span_id == CALLER_SPAN]
    assert len(request) == 1, request
    batch = next(span for span in spans if span.name == "batch" and (TRACE_ID, request[0].span_id) in span.links)
    assert batch.trace_id != TRACE_ID and batch.attributes["explain.batch_rows"] == 2
    forward = [span for span in spans if span.name == "forward" and span.parent_span_id == batch.span_id]
    assert len(forward) == 1 and forward[0].trace_id == batch.trace_id
