"""The records library apart from the SQL stores: ids, the CloudEvents record, store URLs, the settings, the writer
and its ``on_store_error`` policy, the HTTP sink against a local receiver, and ``explain-records``."""

from __future__ import annotations

import http.server
import json
import logging
import os
import socket
import stat
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from records import (
    InvalidRecordIdError,
    OnStoreError,
    Payload,
    RecordsSettings,
    SettingsError,
    StoreUnavailableError,
    StoreUrlError,
    WriteOnlyStoreError,
    open_store,
    parse_store_url,
    records_settings,
    request_id,
    row_id,
)
from records.cli import main
from records.event import Record, canonical_json, input_digest, parse_time
from records.http_sink import HttpSink
from records.ids import check_record_id, check_request_id
from records.sql import TABLE
from records.store import RecordStore
from records.writer import RecordWriter, handle_store_error
from serving_core.errors import ERROR_TABLE, RowError
from tests.records_support import answer, execute, record

# -- ids -------------------------------------------------------------------------------------------------------------


def test_a_request_id_is_the_callers_or_a_new_one() -> None:
    assert request_id("abc-123_x:y.z") == "abc-123_x:y.z"
    made = {request_id(None) for _ in range(3)} | {request_id("")}
    assert len(made) == 4 and all(len(value) == 36 for value in made)
    assert row_id("abc", None) == "abc" and row_id("abc", 2) == "abc-2"


@pytest.mark.parametrize("bad", ["../x", "a/b", "a\\b", ".hidden", "-x", "a b", "é", "x" * 129, "", "a\n"])
def test_path_like_and_odd_ids_are_refused(bad: str) -> None:
    with pytest.raises(InvalidRecordIdError):
        check_request_id(bad)
    if bad and bad != "x" * 129:
        with pytest.raises(InvalidRecordIdError):
            request_id(bad)
    if bad != "x" * 129:  # a record id may be longer: a request id and its row index
        with pytest.raises(InvalidRecordIdError):
            check_record_id(bad)
    with pytest.raises(InvalidRecordIdError):
        check_record_id("x" * 161)


# -- the record ------------------------------------------------------------------------------------------------------


def test_the_record_is_a_cloudevent_with_what_a_reviewer_needs() -> None:
    moment = datetime(2026, 12, 4, 19, 4, 24, 123456, tzinfo=UTC)
    made = record("req", 1, time=moment, traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
                  parent="earlier")  # fmt: skip
    event = made.event
    assert {key: event[key] for key in ("specversion", "id", "source", "type", "time", "datacontenttype")} == {
        "specversion": "1.0",
        "id": "req-1",
        "source": "/doors/torchserve/models/sentiment",
        "type": "org.explain.prediction.v1",
        "time": "2026-12-04T19:04:24.123456Z",
        "datacontenttype": "application/json",
    }
    assert event["traceparent"].startswith("00-0af7")
    data = event["data"]
    assert data["model"] == {"name": "sentiment", "version": "sha256:feedface"}
    assert (data["task"], data["door"], data["method"], data["options"]) == ("classification", "torchserve",
                                                                              "attnlrp", {})  # fmt: skip
    assert data["prediction"] == {"label": "positive", "label_id": 2, "probabilities": {"negative": 0.1,
                                                                                        "positive": 0.9}}  # fmt: skip
    assert data["explanation"]["scores"] == [0.25, -0.5] and data["error"] is None
    assert data["timings"] == {"model": 0.012} and data["parent"] == "earlier" and "input" not in data
    plain = record("p", answer=answer(method=None), input={"text": "x"})
    assert plain.event["data"]["method"] is None and "traceparent" not in plain.event
    asked = record("e", answer={"error": {"code": "invalid_option"}}, input={"text": "x", "explain": {
        "method": "relevance", "start_layer": 9}})  # fmt: skip
    assert (asked.event["data"]["method"], asked.event["data"]["options"]) == ("relevance", {"start_layer": 9})
    assert asked.event["data"]["prediction"] is None


def test_a_record_refuses_what_is_not_json_or_a_bad_id() -> None:
    from records import RecordsError

    with pytest.raises(RecordsError, match="must be JSON"):
        record(answer={"label": float("nan")})
    with pytest.raises(RecordsError, match="must be JSON"):
        record(input={"text": object()})
    with pytest.raises(InvalidRecordIdError):
        record("a/b")
    with pytest.raises(InvalidRecordIdError):
        record(parent="../x")


def test_the_hash_is_salted_and_canonical() -> None:
    salt = "00" * 32
    assert input_digest({"b": 1, "a": "é"}, salt) == input_digest({"a": "é", "b": 1}, salt)
    assert input_digest({"a": 1}, salt) != input_digest({"a": 1}, "11" * 32)
    assert canonical_json({"b": 1, "a": [1.5, "é"]}) == '{"a":[1.5,"é"],"b":1}'
    assert parse_time("2026-12-04") == datetime(2026, 12, 4, tzinfo=UTC)
    assert parse_time("2026-12-04T20:00:00+01:00") == parse_time("2026-12-04T19:00Z")
    with pytest.raises(ValueError, match="ISO 8601"):
        parse_time("yesterday")


# -- store URLs ------------------------------------------------------------------------------------------------------


def test_store_urls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EXPLAIN_WORKDIR", str(tmp_path))
    assert parse_store_url("sqlite").sqlite_path() == tmp_path / "records.sqlite3"
    assert parse_store_url("sqlite:///srv/r.sqlite3").sqlite_path() == Path("/srv/r.sqlite3")
    assert parse_store_url("sqlite:sub/r.sqlite3").sqlite_path() == tmp_path / "sub" / "r.sqlite3"
    assert parse_store_url(" postgresql://u:p@db:5432/records ").kind == "postgresql"
    assert parse_store_url("postgres://db/records").kind == "postgresql"
    assert parse_store_url("https://broker.example/default").kind == "http"
    with open_store("sqlite") as store:
        assert store.kind == "sqlite" and (tmp_path / "records.sqlite3").is_file()
        assert stat.S_IMODE(os.stat(tmp_path / "records.sqlite3").st_mode) == 0o600


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("", "must be a URL"),
        ("mysql://db/x", "is not a store URL"),
        ("records.db", "is not a store URL"),
        ("sqlite://host/x", "has no host"),
        ("sqlite:", "give the SQLite file"),
        ("sqlite:///x?mode=ro", "give the SQLite file"),
        ("postgresql://", "name the server or database"),
        ("postgresql://db:notaport/x", "records store"),
        ("http:///path", "needs a host"),
        ("https://host:99999/", "records store"),
    ],
)
def test_bad_store_urls_get_one_clear_error(url: str, says: str) -> None:
    with pytest.raises(StoreUrlError, match=says) as caught:
        open_store(url)
    assert "sqlite" in str(caught.value) or "records store" in str(caught.value)


def test_a_missing_store_is_not_made_for_readers_and_an_unreachable_one_is_clear(tmp_path: Path) -> None:
    with pytest.raises(StoreUnavailableError, match="no records store at"):
        open_store(f"sqlite:///{tmp_path / 'absent.sqlite3'}", create=False)
    assert not (tmp_path / "absent.sqlite3").exists()
    pytest.importorskip("psycopg", reason="psycopg is not installed: pip install '.[records]' (make extras does)")
    with pytest.raises(StoreUnavailableError, match=r"postgresql://explain:\*\*\*@127.0.0.1:1/x could not open"):
        open_store("postgresql://explain:secret@127.0.0.1:1/x")
    with pytest.raises(SettingsError, match="not one of full, hash, none"):
        open_store("sqlite", payload="some")
    from records.postgres_store import redacted

    assert redacted("postgresql://u:pw@db:5432/r?sslmode=require&password=pw") == (
        "postgresql://u:***@db:5432/r?sslmode=require&password=***"
    )
    assert redacted("postgresql://u@db/r") == "postgresql://u@db/r"


# -- settings --------------------------------------------------------------------------------------------------------


def test_settings_from_the_environment_and_a_section() -> None:
    assert records_settings(None, {}) is None
    assert records_settings(None, {"EXPLAIN_RECORDS": "off"}) is None
    env = {"EXPLAIN_RECORDS": "sqlite", "EXPLAIN_RECORDS_PAYLOAD": "full"}
    assert records_settings(None, env) == RecordsSettings("sqlite", Payload.FULL, None, OnStoreError.REFUSE)
    assert records_settings(None, {"EXPLAIN_RECORDS": "sqlite"}) == RecordsSettings("sqlite")
    assert records_settings(False, env) is None and records_settings("off", env) is None
    assert records_settings("postgresql://db/r", env) == RecordsSettings("postgresql://db/r", Payload.FULL)
    section = {"store": "postgresql://db/r", "payload": "none", "retention_days": 183, "on_store_error": "answer"}
    expected = RecordsSettings("postgresql://db/r", Payload.NONE, 183.0, OnStoreError.ANSWER)
    assert records_settings(section, {}) == expected
    assert records_settings({"store": "https://sink/"}, {}) == RecordsSettings("https://sink/")
    assert records_settings({"payload": "hash"}, env) == RecordsSettings("sqlite", Payload.HASH)
    env_all = {**env, "EXPLAIN_RECORDS_RETENTION_DAYS": "30", "EXPLAIN_RECORDS_ON_STORE_ERROR": "answer"}
    assert records_settings(None, env_all) == RecordsSettings("sqlite", Payload.FULL, 30.0, OnStoreError.ANSWER)


@pytest.mark.parametrize(
    ("section", "env", "says"),
    [
        ({"payload": "full"}, {}, "m: records: no store: set m: records.store or EXPLAIN_RECORDS"),
        ({"store": "sqlite", "payloads": "full"}, {}, "unknown key\\(s\\) payloads; the keys are store, payload"),
        ({"store": "mysql://x"}, {}, "m: records.store: records store 'mysql://x' is not a store URL"),
        ({"store": "sqlite", "payload": "all"}, {}, "m: records.payload: payload 'all' is not one of full"),
        ({"store": "sqlite", "retention_days": -1}, {}, "retention_days must be a positive number"),
        ({"store": "sqlite", "retention_days": True}, {}, "retention_days must be a positive number"),
        ({"store": "sqlite", "retention_days": "inf"}, {}, "retention_days must be a positive number"),
        ({"store": "sqlite", "on_store_error": "ignore"}, {}, "m: records.on_store_error: 'ignore' is not one of"),
        (None, {"EXPLAIN_RECORDS": "sqlite", "EXPLAIN_RECORDS_PAYLOAD": "x"}, "EXPLAIN_RECORDS_PAYLOAD: payload"),
        (None, {"EXPLAIN_RECORDS": "sqlite", "EXPLAIN_RECORDS_RETENTION_DAYS": "soon"}, "EXPLAIN_RECORDS_RETENTION"),
        (42, {}, "expected a store URL, a mapping"),
        (
            {"store": "https://sink/", "retention_days": 7},
            {},
            "m: records.retention_days: the HTTP sink .* keeps nothing",
        ),
    ],
)
def test_bad_settings_get_a_clear_error(section: Any, env: dict[str, str], says: str) -> None:
    with pytest.raises(SettingsError, match=says):
        records_settings(section, env, where="m: records")


# -- the writer and on_store_error -----------------------------------------------------------------------------------


@dataclass
class FakeStore(RecordStore):
    """A store that keeps batches in memory, fails when told, or hangs."""

    fail: bool = False
    hang_s: float = 0.0
    batches: list[list[str]] = field(default_factory=list)
    threads: set[str] = field(default_factory=set)
    kind: str = "postgresql"
    location: str = "postgresql://db/records"
    payload: Payload = Payload.HASH

    def write(self, records: Sequence[Record]) -> list[dict[str, Any]]:
        self.threads.add(threading.current_thread().name)
        time.sleep(self.hang_s)
        if self.fail:
            raise StoreUnavailableError(self.kind, f"the postgresql records store {self.location} could not commit")
        self.batches.append([item.id for item in records])
        return [item.event_for(self.payload, self.salt) for item in records]

    retained: list[float] = field(default_factory=list)

    def retain(self, days: float, *, now: datetime | None = None) -> int:
        self.retained.append(days)
        return 0

    get = list = erase = verify = None  # type: ignore[assignment]

    @property
    def salt(self) -> str:
        return "00" * 32


def _errors(model: str, store: str = "postgresql") -> float:
    return REGISTRY.get_sample_value("explain_record_errors_total", {"model": model, "store": store}) or 0.0


def test_the_writer_commits_a_batch_off_the_callers_thread() -> None:
    store = FakeStore()
    writer = RecordWriter(store)
    writer.record([record("a", 0), record("a", 1)], model="m", on_store_error=OnStoreError.REFUSE)
    future = writer.submit([record("b")])
    writer.wait(future)
    writer.close()
    assert store.batches == [["a-0", "a-1"], ["b"]]
    assert store.threads and threading.current_thread().name not in store.threads


def test_the_writer_applies_retention_at_most_every_so_often(tmp_path: Path) -> None:
    store = FakeStore()
    writer = RecordWriter(store, retention_days=30, retention_every_s=3600)
    for name in ("a", "b", "c"):
        writer.write([record(name)])
    assert store.retained == [30]
    writer.close()
    old = datetime(2020, 1, 1, tzinfo=UTC)
    with open_store(f"sqlite:///{tmp_path / 'r.sqlite3'}") as sqlite:
        sqlite.write([record("ancient", time=old)])
        real = RecordWriter(sqlite, retention_days=30)
        real.write([record("now")])
        real.wait(real.submit([]))  # retention runs after the batch, on the writer's thread
        assert sqlite.get("ancient") is None and sqlite.get("now") is not None and sqlite.verify().ok
        real.close()


def test_on_store_error_answer_logs_and_counts(caplog: pytest.LogCaptureFixture) -> None:
    before = _errors("answering")
    writer = RecordWriter(FakeStore(fail=True))
    with caplog.at_level(logging.ERROR, logger="records.writer"):
        writer.record([record("a")], model="answering", on_store_error=OnStoreError.ANSWER)
    writer.close()
    assert _errors("answering") == before + 1
    errors = [item for item in caplog.records if item.levelno == logging.ERROR]
    assert len(errors) == 1 and "could not commit" in errors[0].getMessage()
    assert "answering answered without its records" in errors[0].getMessage()


def test_on_store_error_refuse_raises_the_tables_code() -> None:
    before = _errors("refusing")
    writer = RecordWriter(FakeStore(fail=True))
    with pytest.raises(RowError) as caught:
        writer.record([record("a")], model="refusing", on_store_error=OnStoreError.REFUSE)
    writer.close()
    assert caught.value.code == "records_unavailable" and caught.value.http_status == 503
    assert ERROR_TABLE["records_unavailable"].grpc_code == "UNAVAILABLE" and "could not commit" in caught.value.message
    assert _errors("refusing") == before + 1


def test_a_store_that_hangs_is_a_store_error_within_the_timeout() -> None:
    writer = RecordWriter(FakeStore(hang_s=1.0), timeout_s=0.1)
    started = time.monotonic()
    with pytest.raises(StoreUnavailableError, match=r"did not commit within 0\.1 s"):
        writer.write([record("slow")])
    assert time.monotonic() - started < 0.9
    writer.close()
    error = StoreUnavailableError("http", "down")
    handle_store_error(error, policy=OnStoreError.ANSWER, model="m")
    assert _errors("m", "http") >= 1


def test_a_recorder_per_model_shares_its_stores_writer(tmp_path: Path) -> None:
    from records.recorder import Recorder, close_writers

    assert Recorder.open("m", None, {}) is None and Recorder.open("m", "off", {"EXPLAIN_RECORDS": "sqlite"}) is None
    url = f"sqlite:///{tmp_path / 'shared.sqlite3'}"
    first = Recorder.open("sentiment", {"store": url, "payload": "full"}, {})
    second = Recorder.open("digits", url, {"EXPLAIN_RECORDS_PAYLOAD": "full"})
    assert first is not None and second is not None and first._writer is second._writer
    first.record([record("s", model="sentiment")])
    second.record([record("d", model="digits")])
    close_writers()
    with open_store(url, create=False) as store:
        assert [item.model for item in store.list().records] == ["sentiment", "digits"] and store.verify().ok


def test_a_store_that_cannot_be_opened_yet_is_tried_again_per_batch(tmp_path: Path) -> None:
    from records.recorder import Recorder, close_writers

    blocker = tmp_path / "later"
    blocker.write_text("a file where the store's folder goes")
    url = f"sqlite:///{blocker / 'records.sqlite3'}"
    answering = Recorder.open("late", {"store": url, "on_store_error": "answer"}, {})
    refusing = Recorder.open("late", {"store": url}, {})
    assert answering is not None and refusing is not None
    before = _errors("late", "sqlite")
    answering.record([record("a")])
    with pytest.raises(RowError, match="cannot make the records store"):
        refusing.record([record("b")])
    assert _errors("late", "sqlite") == before + 2
    blocker.unlink()
    refusing.record([record("c")])
    close_writers()
    with open_store(url, create=False) as store:
        assert [item.id for item in store.list().records] == ["c"]


# -- the HTTP sink ---------------------------------------------------------------------------------------------------


@dataclass
class Receiver:
    """A local CloudEvents receiver: what it got, and the statuses it answers (then 200)."""

    port: int
    received: list[tuple[dict[str, str], bytes]]
    statuses: list[int]
    delay_s: list[float]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/events"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    state = Receiver(0, [], [], [])

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if state.delay_s:
                time.sleep(state.delay_s.pop(0))
            status = state.statuses.pop(0) if state.statuses else 200
            if status == 200:
                state.received.append(({k.lower(): v for k, v in self.headers.items()}, body))
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield state
    server.shutdown()
    server.server_close()


def test_the_sink_posts_each_record_in_cloudevents_binary_mode(receiver: Receiver, tmp_path: Path) -> None:
    salt_file = tmp_path / "salt"
    sink = open_store(receiver.url, payload="hash", salt_file=salt_file)
    trace = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    events = sink.write([record("r", 0, traceparent=trace), record("r", 1)])
    assert len(receiver.received) == 2
    headers, body = receiver.received[0]
    assert headers["ce-specversion"] == "1.0" and headers["ce-id"] == "r-0" and headers["ce-traceparent"] == trace
    assert headers["ce-source"] == "/doors/torchserve/models/sentiment" and headers["ce-type"] == events[0]["type"]
    assert headers["ce-time"] == events[0]["time"] and headers["content-type"] == "application/json"
    assert "ce-traceparent" not in receiver.received[1][0]
    data = json.loads(body)
    assert data == events[0]["data"] and data["input"]["payload"] == "hash"
    salt = salt_file.read_text().strip()
    assert stat.S_IMODE(salt_file.stat().st_mode) == 0o600 and data["input"]["sha256"] == input_digest(
        {"text": "what a lovely day", "explain": {"method": "attnlrp"}}, salt
    )
    assert open_store(receiver.url, salt_file=salt_file).salt == salt
    cloudevents = pytest.importorskip("cloudevents.http", reason="cloudevents comes with the kserve extra")
    parsed = cloudevents.from_http(headers, body)
    assert parsed["id"] == "r-0" and parsed["specversion"] == "1.0" and parsed.data == data


def test_the_sink_retries_then_fails_clearly(receiver: Receiver, tmp_path: Path) -> None:
    sink = HttpSink(receiver.url, salt_file=tmp_path / "salt", attempts=3, timeout_s=2.0)
    receiver.statuses += [503, 429]
    sink.write([record("retried")])
    assert [headers["ce-id"] for headers, _ in receiver.received] == ["retried"]
    receiver.statuses += [400]
    with pytest.raises(StoreUnavailableError, match=r"answered 400 .* for record refused \(tried 1 time"):
        sink.write([record("refused")])
    receiver.statuses += [500, 500, 500]
    with pytest.raises(StoreUnavailableError, match=r"answered 500 .*tried 3 time"):
        sink.write([record("down")])


def test_the_sink_bounds_its_wait(receiver: Receiver, tmp_path: Path) -> None:
    sink = HttpSink(receiver.url, salt_file=tmp_path / "salt", attempts=2, timeout_s=0.3)
    receiver.delay_s += [1.5, 1.5]
    started = time.monotonic()
    with pytest.raises(StoreUnavailableError, match="could not be reached"):
        sink.write([record("slow")])
    assert time.monotonic() - started < 1.5
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    unreachable = HttpSink(f"http://127.0.0.1:{closed}/", salt_file=tmp_path / "salt", attempts=2, timeout_s=0.5)
    with pytest.raises(StoreUnavailableError, match=r"could not be reached .*tried 2 time"):
        unreachable.write([record("nowhere")])


def test_the_sink_is_write_only(tmp_path: Path) -> None:
    sink = open_store("http://127.0.0.1:9/", salt_file=tmp_path / "salt")
    for read in (lambda: sink.get("x"), sink.list, lambda: sink.erase("x"), lambda: sink.retain(1), sink.verify):
        with pytest.raises(WriteOnlyStoreError, match="is write-only"):
            read()


# -- explain-records -------------------------------------------------------------------------------------------------


def test_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'records.sqlite3'}"
    with open_store(url, payload="full") as store:
        store.write([record(f"c{i}", time=datetime(2026, 1, 1 + i, tzinfo=UTC)) for i in range(5)])
    assert main(["verify", url]) == 0
    assert capsys.readouterr().out.startswith("ok: 5 record(s) checked (0 erased)")
    assert main(["list", url, "--limit", "2", "--since", "2026-01-02"]) == 0
    out = capsys.readouterr()
    assert [line.split()[-1] for line in out.out.splitlines()] == ["c1", "c2"] and "more: --cursor 3" in out.err
    assert main(["list", url, "--cursor", "3", "--json"]) == 0
    assert [json.loads(line)["id"] for line in capsys.readouterr().out.splitlines()] == ["c3", "c4"]
    assert main(["show", url, "c2"]) == 0 and json.loads(capsys.readouterr().out)["id"] == "c2"
    assert main(["show", url, "c9"]) == 1 and "no record c9" in capsys.readouterr().err
    assert main(["erase", url, "c2"]) == 0 and "erased 1 record(s) c2" in capsys.readouterr().out
    assert main(["erase", url, "c2"]) == 0 and "erased already" in capsys.readouterr().out
    assert main(["erase", url, "c9"]) == 1
    assert main(["retain", url, "--days", "1"]) == 0 and "removed 5 record(s)" in capsys.readouterr().out
    assert main(["verify", url]) == 0
    capsys.readouterr()


def test_the_command_line_names_what_verify_finds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'records.sqlite3'}"
    with open_store(url) as store:
        store.write([record(f"c{i}") for i in range(4)])
        execute(store, f"UPDATE {TABLE} SET body = replace(body, 'positive', 'negative') WHERE seq = 2")  # type: ignore[arg-type]
        execute(store, f"DELETE FROM {TABLE} WHERE seq = 3")  # type: ignore[arg-type]
    assert main(["verify", url]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "record 2 (id c1) was changed: its body does not match its hash"
    assert out[1].startswith("record 3 missing") and out[2].startswith("2 problem(s): 3 record(s) checked")


def test_the_command_line_proves_what_a_record_saw(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'records.sqlite3'}"
    sent = {"text": "what a lovely day", "explain": {"method": "attnlrp"}}
    with open_store(url, payload="hash") as store:
        store.write([record("h", input=sent), record("raw", input=b"\x89PNG")])
    claim = tmp_path / "claim.json"
    claim.write_text(json.dumps({"explain": {"method": "attnlrp"}, "text": "what a lovely day"}, indent=2))
    assert main(["prove", url, "h", str(claim)]) == 0 and "saw this input" in capsys.readouterr().out
    claim.write_text(json.dumps({**sent, "text": "what a dreadful day"}))
    assert main(["prove", url, "h", str(claim)]) == 1 and "kept: hash" in capsys.readouterr().out
    image = tmp_path / "image.png"
    image.write_bytes(b"\x89PNG")
    assert main(["prove", url, "raw", str(image), "--bytes"]) == 0
    assert main(["prove", url, "nope", str(image)]) == 1
    assert main(["prove", url, "h", str(tmp_path / "absent.json")]) == 2
    capsys.readouterr()


def test_the_command_line_refuses_clearly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", f"sqlite:///{tmp_path / 'none.sqlite3'}"]) == 2
    assert "no records store at" in capsys.readouterr().err and not (tmp_path / "none.sqlite3").exists()
    assert main(["list", "http://127.0.0.1:9/"]) == 2 and "write-only" in capsys.readouterr().err
    assert main(["show", "mysql://x", "a"]) == 2 and "not a store URL" in capsys.readouterr().err
    with open_store(f"sqlite:///{tmp_path / 'r.sqlite3'}"):
        pass
    assert main(["show", f"sqlite:///{tmp_path / 'r.sqlite3'}", "../x"]) == 2
    assert "is not valid" in capsys.readouterr().err


def test_the_command_and_the_extra_are_declared() -> None:
    import tomllib

    project = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["explain-records"] == "records.cli:entry_point"
    assert any(r.startswith("psycopg[binary]") for r in project["optional-dependencies"]["records"])
