"""The KServe and Ray doors' record pieces, in process: an OIP request cut into one OIP request per row (what a record
keeps as the row's input), a batch's records committed in one transaction with each recorded row mapped to the served
row that answers it (identical choices served once, recorded each) and a store's refusal mapped back to the served
rows, what the door passes on to its replicas' environment, and the replicas' monitor metrics read from their
multiprocess files (a live replica's gauges counted, a gone replica's dropped, its counters kept)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from doors.kserve.oip import OipRequest, Tensor, row_requests
from doors.kserve.row_records import RecordedRow, RequestRecords, commit_batch
from records.event import Record
from serving_core.errors import RowError


def test_an_oip_request_is_cut_into_one_request_per_row() -> None:
    request = OipRequest(
        {
            "text": Tensor("text", "BYTES", (2,), ["a lovely film", b"\xff\xfe"]),
            "explain_target": Tensor("explain_target", "INT64", (2, 1), [1, 0]),
            "explain_options": Tensor("explain_options", "BYTES", (1,), ['{"start_layer": 1}']),
        },
        {"explain_method": "rollout"},
    )
    first, second = row_requests(request, 2)
    assert first == {
        "inputs": [
            {"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a lovely film"]},
            {"name": "explain_target", "datatype": "INT64", "shape": [1, 1], "data": [1]},
            {"name": "explain_options", "datatype": "BYTES", "shape": [1], "data": ['{"start_layer": 1}']},
        ],
        "parameters": {"explain_method": "rollout"},
    }
    assert second["inputs"][0]["data"] == [{"b64": "//4="}] and second["inputs"][1]["data"] == [0]
    assert json.loads(json.dumps(second)) == second
    (alone,) = row_requests(OipRequest({"text": Tensor("text", "BYTES", (1,), ["hi"])}), 1)
    assert alone == {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["hi"]}], "parameters": {}}


class _Recorder:
    model = "lm"

    def __init__(self, fail: bool = False) -> None:
        self.batches: list[list[Record]] = []
        self.fail = fail

    def record(self, records: Sequence[Record]) -> None:
        self.batches.append(list(records))
        if self.fail:
            raise RowError("records_unavailable", "the store is down")


def test_a_batch_is_one_transaction_each_record_answered_by_its_served_row() -> None:
    recorder = _Recorder()
    choices = RequestRecords(
        "oa", (RecordedRow(0, 0, {"p": 1}), RecordedRow(0, 1, {"p": 1}), RecordedRow(1, 2, {"p": 2}))
    )
    single = RequestRecords.of("one", [{"text": "x"}], {"traceparent": f"00-{'1' * 32}-{'2' * 16}-01"})
    answers: list[list[dict[str, Any]]] = [[{"text": "a"}, {"text": "b"}], [{"error": {"code": "missing_text"}}]]
    refused = commit_batch(recorder, [(choices, answers[0]), (single, answers[1])],  # type: ignore[arg-type]
                           task="generation", door="ray", version="v1")  # fmt: skip
    assert refused == [[None, None], [None]] and len(recorder.batches) == 1
    events = [record.event for record in recorder.batches[0]]
    assert [event["id"] for event in events] == ["oa-0", "oa-1", "oa-2", "one"]
    assert [event["data"]["prediction"] for event in events[:3]] == [{"text": "a"}, {"text": "a"}, {"text": "b"}]
    assert events[3]["data"]["error"]["code"] == "missing_text" and events[3]["traceparent"].startswith("00-111")
    assert all(event["data"]["door"] == "ray" and event["data"]["model"]["version"] == "v1" for event in events)
    assert single.ids == ["one"] and choices.ids == ["oa-0", "oa-1", "oa-2"]
    down = commit_batch(_Recorder(fail=True), [(choices, answers[0])], task="generation", door="kserve",  # type: ignore[arg-type]
                        version=None)  # fmt: skip
    assert [[error.code if error else None for error in request] for request in down] == [["records_unavailable"] * 2]
    assert commit_batch(None, [(single, answers[1])], task="text", door="kserve", version=None) == [[None]]


def test_the_replicas_get_the_records_tracing_and_metrics_settings() -> None:
    pytest.importorskip("ray")
    from doors.kserve.ray_deployment import replica_env

    environ = {"EXPLAIN_RECORDS": "sqlite", "EXPLAIN_RECORDS_PAYLOAD": "full", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c",
               "HOME": "/root", "AWS_SECRET_ACCESS_KEY": "no"}  # fmt: skip
    env = replica_env(environ, Path("/run/replica-metrics"))
    assert env["EXPLAIN_RECORDS"] == "sqlite" and env["EXPLAIN_RECORDS_PAYLOAD"] == "full"
    assert (
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://c" and env["PROMETHEUS_MULTIPROC_DIR"] == "/run/replica-metrics"
    )
    assert "EXPLAIN_WORKDIR" in env and "HOME" not in env and "AWS_SECRET_ACCESS_KEY" not in env
    assert "PROMETHEUS_MULTIPROC_DIR" not in replica_env(environ)


_REPLICA = """
import sys
from monitoring import metrics
metrics.WINDOW_ROWS.labels("sentiment", "rollout", "positive").set(5)
metrics.DROPPED.labels("sentiment").inc(3)
print("ready", flush=True)
sys.stdin.readline()
"""


def test_the_replicas_monitor_metrics_reach_the_doors_registry(tmp_path: Path) -> None:
    from doors.kserve.replica_metrics import export_replica_metrics, replica_folder

    folder = replica_folder(tmp_path)
    env = {"PROMETHEUS_MULTIPROC_DIR": str(folder), "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    replica = subprocess.Popen([sys.executable, "-c", _REPLICA], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    registry = CollectorRegistry()
    try:
        assert replica.stdout is not None and replica.stdout.readline().strip() == b"ready"
        export_replica_metrics(folder, registry)
        live = generate_latest(registry).decode()
        assert 'explain_attribution_window_rows{label="positive",method="rollout",model="sentiment"} 5.0' in live
        assert 'explain_monitor_dropped_rows_total{model="sentiment"} 3.0' in live
        assert live.count("# TYPE explain_attribution_window_rows gauge") == 1
    finally:
        replica.communicate(b"\n", timeout=30)
    gone = generate_latest(registry).decode()
    assert "explain_attribution_window_rows{" not in gone  # a gone replica's live gauge is dropped
    assert 'explain_monitor_dropped_rows_total{model="sentiment"} 3.0' in gone
