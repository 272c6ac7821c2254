"""The records routes of TorchServe's door (doors/torchserve/records_door.py), as the router answers them, with a
stand-in for TorchServe upstream: the keys read from ``key_file.json`` (the records key added beside TorchServe's,
the inference key refused with 403), a re-explanation sent to ``/predictions/<model>`` with the stored input, the
inference key, a new ``X-Request-Id`` and ``X-Explain-Parent``, the model's version checked, and the router started
with its records arguments whenever records are on."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from doors.torchserve.config import Ports
from doors.torchserve.process import records_arguments, router_command
from doors.torchserve.records_door import PARENT_HEADER, RecordsRoutes, parse_versions
from doors.torchserve.router import PoolRouter
from doors.torchserve.row_records import record_rows, request_ids
from records import build_record, open_store
from records.keys import records_key

VERSION = "sha256:cafe"


@dataclass
class Response:
    status: int


class FakeTorchServe:
    """What the router's upstream answers: a classification of the text, explained by the method asked for."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict[str, Any], Mapping[str, str]]] = []

    def request(self, method: str, path: str, body: bytes | None, headers: Mapping[str, str]) -> tuple[Any, bytes]:
        document = json.loads(body or b"{}")
        self.calls.append((method, path, document, dict(headers)))
        answer = {"label": "positive", "label_id": 1, "probabilities": {"negative": 0.2, "positive": 0.8}}
        method = document["explain"]["method"]
        answer["explanation"] = {"method": method, "target": 1, "target_label": "positive", "options": {},
                                 "tokens": ["good"], "special_tokens": [False], "scores": [1.0]}  # fmt: skip
        return Response(200), json.dumps(answer).encode()


def _body(reply: Any) -> bytes:
    """A reply's whole body (the records routes answer whole bodies, never streams)."""
    assert isinstance(reply.body, bytes)
    return reply.body


@pytest.fixture
def run(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    key_file = tmp_path / "key_file.json"
    key_file.write_text(json.dumps({"inference": {"key": "inf-key"}, "management": {"key": "man-key"}}))
    store_url = f"sqlite:///{tmp_path / 'records.sqlite3'}"
    with open_store(store_url, payload="full") as store:
        store.write([build_record(model="sentiment", version=VERSION, task="classification", door="torchserve",
                                  request_id="seen", index=None, answer={"label": "positive"},
                                  input={"text": "good", "explain": False})])  # fmt: skip
    yield key_file, store_url


def _routes(key_file: Path, store_url: str, versions: Mapping[str, str | None] | None) -> RecordsRoutes:
    return RecordsRoutes(key_file, versions, environ={"EXPLAIN_RECORDS": store_url, "EXPLAIN_RECORDS_PAYLOAD": "full"})


def test_the_router_answers_records_with_the_records_key(run: tuple[Path, str]) -> None:
    key_file, store_url = run
    upstream = FakeTorchServe()
    router = PoolRouter([], [], records=_routes(key_file, store_url, {"sentiment": VERSION}))
    refused = router.respond("GET", "/v1/records", "Bearer inf-key", b"", upstream)  # type: ignore[arg-type]
    assert refused is not None and refused.status == 403
    key = records_key(key_file)
    assert key is not None and json.loads(key_file.read_text())["inference"] == {"key": "inf-key"}
    listed = router.respond("GET", "/v1/records?model=sentiment", f"Bearer {key}", b"", upstream)  # type: ignore[arg-type]
    assert listed is not None and listed.status == 200
    assert [event["id"] for event in json.loads(_body(listed))["data"]] == ["seen"]
    body = json.dumps({"explain": {"method": "grad_x_input"}}).encode()
    again = router.respond("POST", "/v1/records/seen/explain", f"Bearer {key}", body, upstream)  # type: ignore[arg-type]
    assert again is not None
    assert again.status == 200, again.body
    done = json.loads(_body(again))
    assert done["parent"] == "seen" and done["answer"]["explanation"]["method"] == "grad_x_input"
    [(method, path, document, headers)] = upstream.calls
    assert (method, path) == ("POST", "/predictions/sentiment")
    assert document == {"text": "good", "explain": {"method": "grad_x_input"}}
    assert headers[PARENT_HEADER] == "seen" and headers["X-Request-Id"] == done["id"]
    assert headers["Authorization"] == "Bearer inf-key"
    assert router.respond("GET", "/ping", None, b"", upstream) is None  # type: ignore[arg-type]


def test_another_model_version_is_refused(run: tuple[Path, str]) -> None:
    key_file, store_url = run
    upstream = FakeTorchServe()
    routes = _routes(key_file, store_url, {"sentiment": "sha256:newer"})
    body = json.dumps({"explain": {"method": "grad_x_input"}}).encode()
    routes.respond("GET", "/v1/records", None, b"", upstream)  # type: ignore[arg-type]
    key = records_key(key_file)
    refused = routes.respond("POST", "/v1/records/seen/explain", f"Bearer {key}", body, upstream)  # type: ignore[arg-type]
    assert refused is not None and refused.status == 409
    assert json.loads(_body(refused))["error"]["code"] == "model_version_changed" and upstream.calls == []


def test_records_off_answers_nothing(tmp_path: Path) -> None:
    routes = RecordsRoutes(tmp_path / "key_file.json", None, environ={})
    assert not routes.enabled
    assert routes.respond("GET", "/v1/records", None, b"", FakeTorchServe()) is None  # type: ignore[arg-type]


def test_the_router_is_told_the_key_file_and_versions(tmp_path: Path) -> None:
    archive = tmp_path / "store" / "sentiment"
    (tmp_path / "store" / ".fingerprints").mkdir(parents=True)
    (tmp_path / "store" / ".fingerprints" / "sentiment.json").write_text(json.dumps({"fingerprint": VERSION}))
    arguments = records_arguments(tmp_path / "run", tmp_path / "store", {"sentiment": "sentiment", "other": "x"})
    assert arguments == ["--records-key-file", str(tmp_path / "run" / "key_file.json"),
                         "--model-version", f"sentiment={VERSION}", "--model-version", "other="]  # fmt: skip
    assert parse_versions(["sentiment=" + VERSION, "other="]) == {"sentiment": VERSION, "other": None}
    assert parse_versions([]) is None
    assert archive.parent.is_dir() and "--records-key-file" not in router_command(Ports.free(), ())


class FakeContext:
    """TorchServe's context of a batch: per-row request headers, per-row response headers."""

    def __init__(self, headers: list[dict[str, str]]) -> None:
        self.headers = headers
        self.response_headers: dict[int, dict[str, str]] = {}

    def get_all_request_header(self, index: int) -> dict[str, str]:
        return self.headers[index]

    def set_response_header(self, index: int, key: str, value: str) -> None:
        self.response_headers.setdefault(index, {})[key] = value


def test_a_torchserve_batch_is_recorded_row_by_row(tmp_path: Path) -> None:
    from records.recorder import Recorder, close_writers
    from serving_core.errors import RowError

    store_url = f"sqlite:///{tmp_path / 'records.sqlite3'}"
    recorder = Recorder.open("sentiment", {"store": store_url, "payload": "full"}, environ={})
    trace = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    context = FakeContext([
        {"X-Request-Id": "mine"},
        {"traceparent": trace, PARENT_HEADER: "seen"},
        {"X-Request-Id": "../escape"},
    ])  # fmt: skip
    data: list[dict[str, Any]] = [{"body": b'{"text": "good"}'}, {"body": {"text": "bad"}}, {"body": b"\xff raw"}]
    ids = request_ids(context, data)
    assert ids[0] == "mine" and isinstance(ids[1], str) and isinstance(ids[2], RowError)
    refused = {"error": {"code": "invalid_request"}}
    answers: list[dict[str, Any]] = [{"label": "positive"}, {"label": "negative"}, refused]
    try:
        assert record_rows(recorder, task="classification", version=VERSION, context=context, data=data,
                           answers=answers, ids=ids) == [None, None, None]  # fmt: skip
    finally:
        close_writers()
    assert context.response_headers[0] == {"X-Request-Id": "mine"}
    with open_store(store_url) as store:
        first = store.get("mine")
        second = store.get(str(ids[1]))
        third = store.get(context.response_headers[2]["X-Request-Id"])
        assert first is not None and first.event["data"]["input"]["document"] == {"text": "good"}
        assert second is not None and second.event["data"]["parent"] == "seen" and second.event["traceparent"] == trace
        assert third is not None and third.event["data"]["input"]["base64"] and third.event["data"]["error"]
        assert store.verify().ok


def test_explain_records_finds_the_run_folder_as_explain_does(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from explain_client import records_cli
    from explain_client.cli import default_run_dir

    monkeypatch.setenv("EXPLAIN_WORKDIR", str(tmp_path))
    args = records_cli.build_parser().parse_args(["list"])
    assert records_cli._run_dir(args) == default_run_dir() == tmp_path / "run"
