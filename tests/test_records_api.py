"""The door-neutral records routes (records/api.py) and the per-batch record glue (serving_core/recording.py), on
SQLite and a real PostgreSQL: every row of a batch recorded with its id, records listed, read, drawn, explained again
(a new record whose ``parent`` is the old one) and erased; the refusals (no key 401, the inference key 403, a
path-like id 400, an unknown id 404, a record without its input or of another model version 409)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from records import StoreUnavailableError, build_record, open_store
from records.api import ApiReply, KeptInput, RecordsApi, Reexplained
from records.keys import ensure_records_key, inference_key, records_key
from records.recorder import Recorder, close_writers
from records.store import RecordStore
from serving_core.errors import RowError
from serving_core.recording import AnsweredRow, door_request_id, record_batch, refused_answers, row_indexes
from serving_core.stored_input import task_document
from tests.postgres_server import PostgresServer, postgres_server

KEY = "records-key"
INFERENCE = "inference-key"
VERSION = "sha256:feedface"


def answer(method: str | None = "attnlrp") -> dict[str, Any]:
    """A classification answer as the doors give it, explained by ``method``."""
    document: dict[str, Any] = {"label": "positive", "label_id": 1, "probabilities": {"negative": 0.1, "positive": 0.9}}
    if method is not None:
        document["explanation"] = {
            "method": method,
            "target": 1,
            "target_label": "positive",
            "options": {},
            "tokens": ["[CLS]", "lovely", "day", "[SEP]"],
            "special_tokens": [True, False, False, True],
            "scores": [0.0, 0.75, -0.25, 0.0],
        }
    return document


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    with postgres_server() as server:
        yield server


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'records.sqlite3'}"
    server: PostgresServer = request.getfixturevalue("postgres")
    return server.new_database()


@pytest.fixture
def recorder(store_url: str) -> Iterator[Recorder]:
    opened = Recorder.open("sentiment", {"store": store_url, "payload": "full"}, environ={})
    assert opened is not None
    yield opened
    close_writers()


@pytest.fixture
def store(store_url: str, recorder: Recorder) -> Iterator[RecordStore]:
    with open_store(store_url, payload="full") as opened:
        yield opened


def _rows(request_id: str, texts: list[str]) -> list[AnsweredRow]:
    return [
        AnsweredRow(
            request_id=request_id,
            index=index,
            answer=answer(),
            input={"text": text, "explain": {"method": "attnlrp"}},
            traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        )
        for index, text in zip(row_indexes(len(texts)), texts, strict=True)
    ]


class FakeDoor:
    """What a door gives the routes: its model's version, and a re-explanation recorded with its parent."""

    def __init__(self, recorder: Recorder, version: str = VERSION) -> None:
        self.recorder = recorder
        self.served_version = version
        self.explained: list[Mapping[str, Any]] = []

    @property
    def versions(self) -> dict[str, str | None]:
        return {"sentiment": self.served_version}

    def reexplain(self, kept: KeptInput) -> Reexplained:
        document = {**task_document(kept.input, kept.task), "explain": dict(kept.explain)}
        parent = kept.parent
        self.explained.append(document)
        request = door_request_id(None)
        method = document["explain"]["method"]
        answered = answer(method=method)
        row = AnsweredRow(request_id=request, index=None, answer=answered, input=document, parent=parent)
        assert record_batch(self.recorder, task="classification", door="kserve", version=VERSION, rows=[row]) == [None]
        return Reexplained(request, answered)


class _Versions(Mapping[str, "str | None"]):
    """The door's served versions, read when asked (a test changes the version)."""

    def __init__(self, door: FakeDoor) -> None:
        self.door = door

    def __getitem__(self, name: str) -> str | None:
        return self.door.versions[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.door.versions)

    def __len__(self) -> int:
        return len(self.door.versions)


def _api(store: RecordStore, door: FakeDoor) -> RecordsApi:
    return RecordsApi(store, key=KEY, inference_keys=[INFERENCE], versions=_Versions(door), reexplain=door.reexplain)


def _call(api: RecordsApi, method: str, target: str, body: Any = None, key: str | None = KEY) -> ApiReply:
    reply = api.respond(
        method, target, f"Bearer {key}" if key else None, b"" if body is None else json.dumps(body).encode()
    )
    assert reply is not None
    return reply


def test_every_row_of_a_batch_is_recorded_with_its_id(recorder: Recorder, store: RecordStore) -> None:
    refusals = record_batch(recorder, task="classification", door="torchserve", version=VERSION,
                            rows=_rows("batch-1", ["one", "two", "three"]))  # fmt: skip
    assert refusals == [None, None, None]
    single = record_batch(recorder, task="classification", door="torchserve", version=VERSION,
                          rows=_rows("alone", ["four"]))  # fmt: skip
    assert single == [None]
    for record_id, text in (("batch-1-0", "one"), ("batch-1-1", "two"), ("batch-1-2", "three"), ("alone", "four")):
        stored = store.get(record_id)
        assert stored is not None
        assert stored.event["data"]["input"]["document"]["text"] == text
        assert stored.event["data"]["model"] == {"name": "sentiment", "version": VERSION}
        assert stored.event["traceparent"].startswith("00-0af765")
    assert store.verify().ok


def test_no_recorder_records_nothing_and_refuses_nothing() -> None:
    assert record_batch(None, task="classification", door="kserve", version=None, rows=_rows("r", ["a", "b"])) == [
        None,
        None,
    ]


def test_a_failed_store_refuses_every_row_of_the_batch(recorder: Recorder, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(records: Any, **_: Any) -> None:
        raise StoreUnavailableError("sqlite", "disk full")

    assert recorder._writer is not None
    monkeypatch.setattr(recorder._writer, "write", broken)
    refusals = record_batch(
        recorder, task="classification", door="kserve", version=VERSION, rows=_rows("r", ["a", "b"])
    )
    assert all(isinstance(refusal, RowError) and refusal.code == "records_unavailable" for refusal in refusals)
    answers = refused_answers([answer(), answer()], refusals)
    assert [document["error"]["code"] for document in answers] == ["records_unavailable"] * 2
    assert answers[0]["error"]["http_status"] == 503


def test_request_ids_are_the_callers_or_made_and_path_like_ones_are_refused() -> None:
    assert door_request_id({"x-request-id": "abc-123"}) == "abc-123"
    assert door_request_id({"X-Request-Id": b"from-grpc"}) == "from-grpc"
    made = door_request_id({})
    assert len(made) == 36 and made != door_request_id(None)
    for bad in ("../etc/passwd", "a/b", ".hidden", "x" * 200):
        with pytest.raises(RowError) as refused:
            door_request_id({"X-Request-Id": bad})
        assert refused.value.code == "invalid_request"


def test_records_are_listed_read_and_drawn(recorder: Recorder, store: RecordStore) -> None:
    record_batch(recorder, task="classification", door="torchserve", version=VERSION, rows=_rows("req", ["a", "b"]))
    api = _api(store, FakeDoor(recorder))
    listed = _call(api, "GET", "/v1/records?model=sentiment&limit=1")
    assert listed.status == 200
    page = listed.json()
    assert [event["id"] for event in page["data"]] == ["req-0"] and page["next_cursor"]
    rest = _call(api, "GET", f"/v1/records?model=sentiment&cursor={page['next_cursor']}").json()
    assert [event["id"] for event in rest["data"]] == ["req-1"] and rest["next_cursor"] is None
    assert _call(api, "GET", "/v1/records?model=other").json()["data"] == []
    assert _call(api, "GET", "/v1/records?since=2000-01-01&until=2000-01-02").json()["data"] == []
    one = _call(api, "GET", "/v1/records/req-1")
    assert one.status == 200 and one.json()["data"]["input"]["document"]["text"] == "b"
    drawn = _call(api, "GET", "/v1/records/req-1/page")
    assert drawn.status == 200 and drawn.content_type.startswith("text/html")
    text = drawn.body.decode()
    assert "record req-1" in text and "attnlrp" in text and "positive" in text and "lovely" in text
    assert 'class="row error"' not in text


def test_a_record_is_explained_again_by_another_method(recorder: Recorder, store: RecordStore) -> None:
    record_batch(recorder, task="classification", door="torchserve", version=VERSION, rows=_rows("req", ["a"]))
    door = FakeDoor(recorder)
    api = _api(store, door)
    reply = _call(api, "POST", "/v1/records/req/explain", {"explain": {"method": "grad_x_input"}})
    assert reply.status == 200, reply.body
    done = reply.json()
    assert done["parent"] == "req" and done["answer"]["explanation"]["method"] == "grad_x_input"
    assert door.explained == [{"text": "a", "explain": {"method": "grad_x_input"}}]
    child = store.get(done["id"])
    assert child is not None and child.event["data"]["parent"] == "req"
    assert child.event["data"]["method"] == "grad_x_input"
    assert store.verify().ok


def test_a_record_is_erased(recorder: Recorder, store: RecordStore) -> None:
    record_batch(recorder, task="classification", door="torchserve", version=VERSION, rows=_rows("req", ["a"]))
    api = _api(store, FakeDoor(recorder))
    assert _call(api, "DELETE", "/v1/records/req").json() == {"id": "req", "erased": 1}
    assert _call(api, "GET", "/v1/records/req").json()["data"]["erased"] is True
    assert "erased at" in _call(api, "GET", "/v1/records/req/page").body.decode()
    refused = _call(api, "POST", "/v1/records/req/explain", {"explain": {"method": "attnlrp"}})
    assert refused.status == 409 and refused.json()["error"]["code"] == "payload_not_kept"
    assert store.verify().ok


def test_refusals(recorder: Recorder, store: RecordStore, store_url: str) -> None:
    record_batch(recorder, task="classification", door="torchserve", version=VERSION, rows=_rows("req", ["a"]))
    door = FakeDoor(recorder)
    api = _api(store, door)

    def code(reply: ApiReply) -> tuple[int, str]:
        return reply.status, reply.json()["error"]["code"]

    assert code(_call(api, "GET", "/v1/records", key=None)) == (401, "unauthenticated")
    assert code(_call(api, "GET", "/v1/records", key="wrong")) == (401, "unauthenticated")
    assert code(_call(api, "GET", "/v1/records/req", key=INFERENCE)) == (403, "forbidden")
    assert code(_call(api, "GET", "/v1/records/nobody")) == (404, "record_not_found")
    assert code(_call(api, "GET", "/v1/records/..%2F..%2Fetc%2Fpasswd")) == (400, "invalid_record_id")
    assert code(_call(api, "GET", "/v1/records/.hidden")) == (400, "invalid_record_id")
    assert code(_call(api, "GET", "/v1/records/req/other/path")) == (400, "invalid_record_id")
    assert code(_call(api, "GET", "/v1/records?limit=0")) == (400, "invalid_request")
    assert code(_call(api, "GET", "/v1/records?since=yesterday")) == (400, "invalid_request")
    assert code(_call(api, "GET", "/v1/records?colour=red")) == (400, "invalid_request")
    assert code(_call(api, "PUT", "/v1/records/req")) == (405, "method_not_allowed")
    assert code(_call(api, "POST", "/v1/records/req/explain", {"method": "x"})) == (400, "invalid_request")
    assert code(_call(api, "POST", "/v1/records/nobody/explain", {"explain": {"method": "x"}})) == (
        404,
        "record_not_found",
    )
    door.served_version = "sha256:another"
    assert code(_call(api, "POST", "/v1/records/req/explain", {"explain": {"method": "x"}})) == (
        409,
        "model_version_changed",
    )
    assert door.explained == []
    with open_store(store_url, payload="hash") as hashed:  # the same store, keeping only a hash of the input
        row = _rows("hid", ["a"])[0]
        kept = build_record(model="sentiment", version=VERSION, task="classification", door="kserve",
                            request_id=row.request_id, index=None, answer=row.answer, input=row.input)  # fmt: skip
        hashed.write([kept])
    door.served_version = VERSION
    refused = _call(api, "POST", "/v1/records/hid/explain", {"explain": {"method": "x"}})
    assert code(refused) == (409, "payload_not_kept") and "payload: hash" in refused.json()["error"]["message"]
    assert api.respond("GET", "/predictions/sentiment", None) is None


def test_the_records_key_lives_beside_torchserves_keys(tmp_path: Path) -> None:
    key_file = tmp_path / "key_file.json"
    key_file.write_text(json.dumps({"inference": {"key": "inf"}, "management": {"key": "man"}}))
    assert records_key(key_file) is None
    made = ensure_records_key(key_file)
    assert ensure_records_key(key_file) == made == records_key(key_file) and len(made) >= 32
    document = json.loads(key_file.read_text())
    assert document["management"] == {"key": "man"} and document["records"] == {"key": made}
    assert inference_key(key_file) == "inf"
    assert key_file.stat().st_mode & 0o777 == 0o600


def test_explain_serve_records_sets_the_environment_and_refuses_a_bad_store() -> None:
    from doors import explain_serve

    parser = explain_serve.build_parser()
    args = parser.parse_args(["--models", "m=/x", "--records", "sqlite", "--records-payload", "full"])
    assert explain_serve.records_environment(args) == {"EXPLAIN_RECORDS": "sqlite", "EXPLAIN_RECORDS_PAYLOAD": "full"}
    assert explain_serve.records_environment(parser.parse_args(["--models", "m=/x"])) == {}
    assert explain_serve.main(["--models", "m=/x", "--records", "mysql://db"]) == 2


def test_the_fingerprint_folder_is_the_packagers() -> None:
    from model_store.package import FINGERPRINTS_DIR as PACKAGED
    from serving_core.recording import FINGERPRINTS_DIR

    assert FINGERPRINTS_DIR == PACKAGED


def test_a_raw_input_is_drawn_as_the_door_reads_it(recorder: Recorder, store: RecordStore) -> None:
    """A record's page draws the text of an input kept as bytes (a ``text/plain`` body, a gRPC row's serialized
    ``ExplainRequest``) as the door reads it; bytes the door cannot read, or a door that reads none, are drawn as
    their size."""
    from explain_client.protos import explain_messages

    bodies = {
        "plain": b"a plainly lovely day",
        "grpc": explain_messages().ExplainRequest(text="a lovely gRPC day").SerializeToString(),
        "binary": b"\xff\xfe\x00\x01",
    }
    rows = [AnsweredRow(request_id=name, index=None, answer=answer(), input=body) for name, body in bodies.items()]
    assert record_batch(recorder, task="classification", door="torchserve", version=VERSION, rows=rows) == [None] * 3
    read: list[tuple[str, str]] = []

    def read_input(model: str, task: str, kept: Mapping[str, Any] | bytes) -> Mapping[str, Any]:
        read.append((model, task))
        return task_document(kept, task)

    door = FakeDoor(recorder)
    reading = RecordsApi(store, key=KEY, versions=_Versions(door), reexplain=door.reexplain, read_input=read_input)
    pages = {name: _call(reading, "GET", f"/v1/records/{name}/page").body.decode() for name in bodies}
    assert "a plainly lovely day" in pages["plain"] and "a lovely gRPC day" in pages["grpc"]
    assert "an input of 4 bytes" in pages["binary"]
    assert read == [("sentiment", "classification")] * 3
    blind = _api(store, door)
    assert f"an input of {len(bodies['grpc'])} bytes" in _call(blind, "GET", "/v1/records/grpc/page").body.decode()
