"""The records routes on running doors: a KServe door started with ``EXPLAIN_RECORDS`` (SQLite, and a real
PostgreSQL the tests start; payload full) makes its records key beside its config, reads its store on
``/v1/records``, refuses a caller without the key (401), a path-like id (400) and an unknown one (404), explains a
stored prediction again by another method in-process (a new record whose ``parent`` is the old one, with the
model's version), erases it, and echoes every answer's ``X-Request-Id``; the client and ``explain records`` against
it; TorchServe's door with records on (its router in front, the inference key refused with 403, a record explained
again through TorchServe). Online answers on both doors (OIP ``infer`` and v1 ``:predict`` on KServe, REST predictions
through TorchServe) each have their record, under the ``X-Request-Id`` the answer echoes, with the model's version,
and ``explain-records verify`` passes on the store. TorchServe's answers carry their record's id in the body too (REST
``id``, a refused path-like ``X-Request-Id`` answered under the id TorchServe echoes; gRPC through the router:
``ExplainResponse.request_id`` or the JSON ``id``, the caller's ``x-request-id`` metadata honoured, an invalid one
refused with ``INVALID_ARGUMENT``)."""

from __future__ import annotations

import asyncio
import io
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from doors.torchserve.config import Ports
from records import build_record, open_store
from records.cli import main as records_main
from records.keys import records_key
from serving_core.recording import served_version
from tests.doors_support import missing_extras
from tests.postgres_server import PostgresServer, postgres_server
from tests.serving_support import REPO_ROOT, tiny_archives

pytestmark = pytest.mark.slow


@dataclass
class Door:
    url: str
    key: str
    store_url: str
    version: str | None
    inference: str | None = None
    grpc: str | None = None
    grpc_port: int | None = None


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    with postgres_server() as server:
        yield server


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def door(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Door]:
    missing = missing_extras()
    if missing:
        pytest.skip(missing)
    from doors.kserve import launch as launcher

    archive = tiny_archives()["sentiment"]
    run_dir = tmp_path_factory.mktemp("records-door")
    if request.param == "sqlite":
        store_url = f"sqlite:///{run_dir / 'records.sqlite3'}"
    else:
        server: PostgresServer = request.getfixturevalue("postgres")
        store_url = server.new_database()
    ports = Ports.free()
    env = {"OMP_NUM_THREADS": "1", "EXPLAIN_RECORDS": store_url, "EXPLAIN_RECORDS_PAYLOAD": "full"}
    launcher.start("kserve", {"sentiment": archive}, run_dir, ports.inference, ports.grpc_inference, timeout=400,
                   env=env)  # fmt: skip
    try:
        key = records_key(run_dir / "key_file.json")
        assert key is not None
        yield Door(f"http://127.0.0.1:{ports.inference}", key, store_url, served_version(archive),
                   grpc=f"127.0.0.1:{ports.grpc_inference}")  # fmt: skip
    finally:
        launcher.stop(run_dir)


def _call(door: Door, method: str, path: str, body: Any = None, key: str | None = "records") -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {door.key if key == 'records' else key}"
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(door.url + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=120) as reply:
            status, raw, kind = reply.status, reply.read(), reply.headers.get("Content-Type", "")
    except urllib.error.HTTPError as error:
        status, raw, kind = error.code, error.read(), error.headers.get("Content-Type", "")
    return status, (json.loads(raw) if kind.startswith("application/json") else raw.decode())


def _stored(door: Door, request_id: str, text: str) -> None:
    answer = {"label": "positive", "label_id": 1, "probabilities": {"negative": 0.4, "positive": 0.6}}
    record = build_record(model="sentiment", version=door.version, task="classification", door="kserve",
                          request_id=request_id, index=None, answer=answer,
                          input={"text": text, "explain": False})  # fmt: skip
    with open_store(door.store_url, payload="full") as store:
        store.write([record])


def test_records_are_read_explained_again_and_erased(door: Door) -> None:
    _stored(door, "served-1", "a lovely film")
    status, page = _call(door, "GET", "/v1/records?model=sentiment")
    assert status == 200 and "served-1" in [event["id"] for event in page["data"]]
    status, one = _call(door, "GET", "/v1/records/served-1")
    assert status == 200 and one["data"]["input"]["document"]["text"] == "a lovely film"
    status, html = _call(door, "GET", "/v1/records/served-1/page")
    assert status == 200 and "a lovely film" in html
    before = {event["id"] for event in _call(door, "GET", "/v1/records?model=sentiment&limit=1000")[1]["data"]}
    status, done = _call(door, "POST", "/v1/records/served-1/explain", {"explain": {"method": "grad_x_input"}})
    assert status == 200, done
    assert done["parent"] == "served-1" and done["answer"]["explanation"]["method"] == "grad_x_input"
    after = {event["id"] for event in _call(door, "GET", "/v1/records?model=sentiment&limit=1000")[1]["data"]}
    assert after - before == {done["id"]}  # one record of the re-explanation
    status, child = _call(door, "GET", f"/v1/records/{done['id']}")
    assert status == 200 and child["data"]["parent"] == "served-1"
    assert child["data"]["method"] == "grad_x_input" and child["data"]["model"]["version"] == door.version
    status, drawn = _call(door, "GET", f"/v1/records/{done['id']}/page")
    assert status == 200 and "grad_x_input" in drawn
    status, erased = _call(door, "DELETE", "/v1/records/served-1")
    assert status == 200 and erased == {"id": "served-1", "erased": 1}
    with open_store(door.store_url) as store:
        assert store.verify().ok


def test_refusals(door: Door) -> None:
    _stored(door, "served-2", "a dull film")
    assert _call(door, "GET", "/v1/records", key=None)[0] == 401
    assert _call(door, "GET", "/v1/records", key="not-the-key")[0] == 401
    assert _call(door, "GET", "/v1/records/nobody")[1]["error"]["code"] == "record_not_found"
    status, refused = _call(door, "GET", "/v1/records/..%2F..%2Fetc%2Fpasswd")
    assert status == 400 and refused["error"]["code"] == "invalid_record_id"
    status, refused = _call(door, "POST", "/v1/records/served-2/explain", {"explain": {"method": "no_such_method"}})
    assert status == 400 and refused["answer"]["error"]["code"] == "unknown_method"


def test_a_door_without_records_has_no_records_routes(tmp_path: Path) -> None:
    from fastapi import FastAPI

    from doors.kserve.records_routes import add_records_routes

    app = FastAPI()
    assert add_records_routes(app, {}, tmp_path / "key_file.json", environ={}) is None
    assert not (tmp_path / "key_file.json").exists()


def test_the_client_and_the_cli_read_explain_again_and_erase(door: Door, tmp_path: Path) -> None:
    from explain_client import ExplainClient
    from explain_client.cli import main
    from explain_client.results import ServiceError

    _stored(door, "served-3", "a fine film")
    with ExplainClient(url=door.url, records_key=door.key) as client:
        records = client.records
        assert "served-3" in [event["id"] for event in records.iterate(model="sentiment")]
        assert records.get("served-3")["data"]["input"]["document"]["text"] == "a fine film"
        assert "a fine film" in records.page("served-3")
        again = records.explain("served-3", "grad_x_input")
        assert again.parent == "served-3" and again.answer["explanation"]["method"] == "grad_x_input"
        assert records.get(again.id)["data"]["parent"] == "served-3"
        with pytest.raises(ServiceError) as refused:
            records.explain("served-3", "no_such_method")
        assert refused.value.code == "unknown_method"
        with pytest.raises(ServiceError) as refused:
            records.get("nobody")
        assert refused.value.code == "record_not_found" and refused.value.http_status == 404
    with ExplainClient(url=door.url, records_key="wrong") as client, pytest.raises(ServiceError) as refused:
        client.records.list()
    assert refused.value.code == "unauthenticated"
    out = io.StringIO()
    common = ["records", "--url", door.url, f"--records-key={door.key}"]
    assert main([*common, "list", "--model", "sentiment"], stdout=out) == 0
    assert "served-3" in out.getvalue()
    page = tmp_path / "record.html"
    assert main([*common, "page", "served-3", "-o", str(page)], stdout=io.StringIO()) == 0
    assert "a fine film" in page.read_text()
    out = io.StringIO()
    assert main([*common, "explain", "served-3", "--method", "grad_x_input"], stdout=out) == 0
    assert json.loads(out.getvalue())["parent"] == "served-3"
    out = io.StringIO()
    assert main([*common, "erase", "served-3"], stdout=out) == 0 and "erased 1" in out.getvalue()
    assert main([*common, "show", "..%2Fescape"], stdout=io.StringIO()) == 1


@pytest.fixture(scope="module")
def torchserve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Door]:
    from doors.torchserve.process import start, stop

    archive = tiny_archives()["sentiment"]
    run_dir = tmp_path_factory.mktemp("records-torchserve")
    store_url = f"sqlite:///{run_dir / 'records.sqlite3'}"
    ports = Ports.free()
    with pytest.MonkeyPatch.context() as patch:  # what EXPLAIN_RECORDS=... make start gives the processes
        patch.setenv("EXPLAIN_RECORDS", store_url)
        patch.setenv("EXPLAIN_RECORDS_PAYLOAD", "full")
        server = start(run_dir, REPO_ROOT, {"sentiment": str(archive.resolve())}, ports, timeout=300)
    try:
        assert server.router_pid is not None  # records on: the router is in front, whatever else is served
        key = records_key(run_dir / "key_file.json")
        assert key is not None and server.keys["inference"] != key
        yield Door(server.inference_url, key, store_url, served_version(archive), server.keys["inference"],
                   grpc_port=server.ports.grpc_inference)  # fmt: skip
    finally:
        stop(run_dir)


def test_torchserve_s_router_answers_records_and_explains_again_through_torchserve(torchserve: Door) -> None:
    _stored(torchserve, "ts-1", "a lovely film")
    status, page = _call(torchserve, "GET", "/v1/records?model=sentiment")
    assert status == 200 and [event["id"] for event in page["data"]] == ["ts-1"]
    assert _call(torchserve, "GET", "/v1/records", key=torchserve.inference)[0] == 403
    assert _call(torchserve, "GET", "/v1/records", key=None)[0] == 401
    assert _call(torchserve, "GET", "/v1/records/ts-1/page")[0] == 200
    status, done = _call(torchserve, "POST", "/v1/records/ts-1/explain", {"explain": {"method": "grad_x_input"}})
    assert status == 200, done
    assert done["parent"] == "ts-1" and done["answer"]["explanation"]["method"] == "grad_x_input"
    assert done["answer"]["id"] == done["id"]  # the re-explanation's answer carries its record's id
    assert _call(torchserve, "DELETE", "/v1/records/ts-1")[1] == {"id": "ts-1", "erased": 1}


def test_every_kserve_answer_has_its_request_id() -> None:
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse
    from fastapi.testclient import TestClient

    from doors.kserve.request_ids import RequestIds, oip_request_id

    app = FastAPI()

    async def seen(request: Any) -> JSONResponse:
        return JSONResponse({"id": request.headers.get("x-request-id")})

    app.add_route("/seen", seen, methods=["GET"])
    app.add_middleware(RequestIds)
    client = TestClient(app)
    mine = client.get("/seen", headers={"X-Request-Id": "caller-1"})
    assert mine.headers["x-request-id"] == "caller-1" and mine.json() == {"id": "caller-1"}
    made = client.get("/seen")
    assert made.headers["x-request-id"] == made.json()["id"] and len(made.json()["id"]) == 36
    refused = client.get("/seen", headers={"X-Request-Id": "../escape"})
    assert refused.status_code == 400 and refused.json()["code"] == "invalid_request"
    assert oip_request_id("oip-id", {"x-request-id": "header"}) == "oip-id"
    assert oip_request_id(None, {"X-Request-Id": "header"}) == "header"
    assert oip_request_id("", None) is None


def test_a_kserve_door_answers_with_the_callers_id(door: Door) -> None:
    body = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a lovely film"]}]}
    request = urllib.request.Request(f"{door.url}/v2/models/sentiment/infer", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json", "X-Request-Id": "oip-1"})  # fmt: skip
    with urllib.request.urlopen(request, timeout=120) as reply:
        assert reply.headers["X-Request-Id"] == "oip-1"
        assert json.loads(reply.read())["id"] == "oip-1"
    with urllib.request.urlopen(f"{door.url}/v2/health/ready", timeout=30) as reply:
        assert len(reply.headers["X-Request-Id"]) == 36


def _post(url: str, body: Any, headers: dict[str, str]) -> tuple[str, Any]:
    """POST ``body`` as JSON; the answer's ``X-Request-Id`` and JSON document."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json", **headers})  # fmt: skip
    with urllib.request.urlopen(request, timeout=120) as reply:
        return reply.headers["X-Request-Id"], json.loads(reply.read())


def _recorded(door: Door, record_id: str) -> dict[str, Any]:
    """The record ``record_id`` as the records routes read it (it must be there): its event's ``data``."""
    status, one = _call(door, "GET", f"/v1/records/{record_id}")
    assert status == 200, one
    assert one["id"] == record_id and one["data"]["model"]["name"] == "sentiment"
    return dict(one["data"])


def test_kserve_online_answers_are_recorded(door: Door) -> None:
    body = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a lovely film"]}]}
    echoed, _ = _post(f"{door.url}/v2/models/sentiment/infer", body, {"X-Request-Id": "online-oip-1"})
    assert echoed == "online-oip-1"
    data = _recorded(door, "online-oip-1")
    assert data["model"]["version"] == door.version and data["door"] == "kserve" and data["error"] is None
    assert data["input"]["document"]["inputs"][0]["data"] == ["a lovely film"]
    status, drawn = _call(door, "GET", "/v1/records/online-oip-1/page")  # the OIP row read by the model's codec
    assert status == 200 and "a lovely film" in drawn and "datatype" not in drawn
    instances = {"instances": [{"text": "a dull film"}, "a fine film"]}
    echoed, answer = _post(f"{door.url}/v1/models/sentiment:predict", instances, {})
    assert len(answer["predictions"]) == 2 and answer["id"] == echoed
    assert answer["ids"] == [f"{echoed}-0", f"{echoed}-1"]
    for record_id, text in zip(answer["ids"], ["a dull film", "a fine film"], strict=True):
        assert _recorded(door, record_id)["input"]["document"]["text"] == text
    assert records_main(["verify", door.store_url]) == 0


def test_kserve_requests_refused_as_a_whole_are_recorded(door: Door) -> None:
    """A request the door cannot decode is answered 400 and recorded under its id, with its error and its input."""
    oip = {"inputs": [{"name": "text", "shape": [1], "datatype": "FP32", "data": [1.0]}]}
    cases = {
        "refused-oip-1": ("/v2/models/sentiment/infer", oip),
        "refused-v1-1": ("/v1/models/sentiment:predict", {"instances": []}),
    }
    for request_id, (path, body) in cases.items():
        headers = {"Content-Type": "application/json", "X-Request-Id": request_id}
        request = urllib.request.Request(f"{door.url}{path}", data=json.dumps(body).encode(), headers=headers)
        with pytest.raises(urllib.error.HTTPError) as raised:
            urllib.request.urlopen(request, timeout=120)
        assert raised.value.code == 400, raised.value.read()
        data = _recorded(door, request_id)
        assert data["door"] == "kserve" and data["error"]["code"], data
        assert data["input"]["document"] is not None and data["input"]["payload"] == "full", data
    assert records_main(["verify", door.store_url]) == 0


def test_kserve_grpc_answers_carry_their_record_id(door: Door) -> None:
    from bench.oip_client import GrpcOip

    assert door.grpc is not None
    client = GrpcOip(door.grpc)
    pb = client.pb
    texts = [b"a lovely film", b"a dull film"]
    tensor = pb.ModelInferRequest.InferInputTensor(name="text", datatype="BYTES", shape=[2],
                                                   contents=pb.InferTensorContents(bytes_contents=texts))  # fmt: skip
    try:
        made = client.stub.ModelInfer(pb.ModelInferRequest(model_name="sentiment", inputs=[tensor]), timeout=120)
        named = client.stub.ModelInfer(pb.ModelInferRequest(model_name="sentiment", inputs=[tensor]), timeout=120,
                                       metadata=[("x-request-id", "grpc-meta")])  # fmt: skip
    finally:
        client.close()
    assert named.id == "grpc-meta" and made.id and made.id != named.id
    for request_id in (made.id, named.id):
        for index, text in enumerate(texts):
            data = _recorded(door, f"{request_id}-{index}")
            assert data["input"]["document"]["inputs"][0] == {"name": "text", "datatype": "BYTES", "shape": [1],
                                                               "data": [text.decode()]}  # fmt: skip


def test_torchserve_online_answers_are_recorded(torchserve: Door) -> None:
    url = f"{torchserve.url}/predictions/sentiment"
    auth = {"Authorization": f"Bearer {torchserve.inference}"}
    echoed, answer = _post(url, {"text": "a lovely film"}, {**auth, "X-Request-Id": "online-ts-1"})
    assert echoed == "online-ts-1" and "label" in answer
    data = _recorded(torchserve, "online-ts-1")
    assert data["door"] == "torchserve" and data["model"]["version"] == torchserve.version
    assert data["input"]["document"]["text"] == "a lovely film" and data["prediction"]["label"] == answer["label"]
    assert answer["id"] == "online-ts-1"
    made, answer = _post(url, {"text": "a dull film"}, auth)
    assert made and answer["id"] == made and _recorded(torchserve, made)["input"]["document"]["text"] == "a dull film"
    assert records_main(["verify", torchserve.store_url]) == 0


def test_torchserve_s_answers_carry_their_records_id_over_rest_and_grpc(torchserve: Door) -> None:
    import grpc

    from explain_client import protos

    url = f"{torchserve.url}/predictions/sentiment"
    auth = {"Authorization": f"Bearer {torchserve.inference}"}
    refused = urllib.request.Request(url, data=json.dumps({"text": "a film"}).encode(), method="POST",
                                     headers={"Content-Type": "application/json", **auth,
                                              "X-Request-Id": "../escape"})  # fmt: skip
    with pytest.raises(urllib.error.HTTPError) as raised:
        urllib.request.urlopen(refused, timeout=120)
    echoed, answer = raised.value.headers["X-Request-Id"], json.loads(raised.value.read())
    assert raised.value.code == 400 and answer["error"]["code"] == "invalid_request" and answer["id"] == echoed
    assert _recorded(torchserve, echoed)["error"]["code"] == "invalid_request"

    messages, stubs = protos.inference_stubs()
    explain = protos.explain_messages()
    metadata = [("authorization", f"Bearer {torchserve.inference}")]
    with grpc.insecure_channel(f"127.0.0.1:{torchserve.grpc_port}") as channel:
        stub = stubs.InferenceAPIsServiceStub(channel)

        def call(entries: dict[str, bytes], extra: list[tuple[str, str]]) -> bytes:
            request = messages.PredictionsRequest(model_name="sentiment", input=entries)
            return bytes(stub.Predictions(request, metadata=[*metadata, *extra], timeout=120).prediction)

        payload = explain.ExplainRequest(text="a lovely film").SerializeToString()
        mine = explain.ExplainResponse.FromString(call({"request": payload}, [("x-request-id", "grpc-ts-1")]))
        assert mine.request_id == "grpc-ts-1" and mine.label and not mine.HasField("error")
        assert _recorded(torchserve, "grpc-ts-1")["prediction"]["label"] == mine.label
        status, drawn = _call(torchserve, "GET", "/v1/records/grpc-ts-1/page")  # the ExplainRequest read
        assert status == 200 and "a lovely film" in drawn
        made = explain.ExplainResponse.FromString(call({"request": payload}, []))
        assert made.request_id and _recorded(torchserve, made.request_id)["error"] is None
        as_json = json.loads(call({"body": b'{"text": "a dull film"}'}, [("x-request-id", "grpc-ts-2")]))
        assert as_json["id"] == "grpc-ts-2" and "label" in as_json
        assert _recorded(torchserve, "grpc-ts-2")["input"]["document"]["text"] == "a dull film"
        failed = explain.ExplainResponse.FromString(call({"request": b"\xff"}, [("x-request-id", "grpc-ts-3")]))
        assert failed.request_id == "grpc-ts-3" and failed.error.code == "invalid_protobuf"
        assert _recorded(torchserve, "grpc-ts-3")["error"]["code"] == "invalid_protobuf"
        with pytest.raises(grpc.RpcError) as refusal:
            call({"request": payload}, [("x-request-id", "../escape")])
        assert refusal.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "x-request-id" in refusal.value.details()
    assert records_main(["verify", torchserve.store_url]) == 0


@pytest.mark.parametrize("payload", ["full", "hash"])
def test_kserve_rows_are_recorded_with_their_input_under_the_ids_the_answer_shows(payload: str, tmp_path: Path) -> None:
    """In-process (the door's model over its in-process backend): an OIP request of two rows is recorded as
    ``<id>-0`` and ``<id>-1``, each row's input the OIP request of that row alone (full: the document; hash: its
    salted digest), the answer's ``id`` the request's (made when it had none: the same id as the records'); a v1
    answer shows its ``id`` and each instance's record id in ``ids``."""
    missing = missing_extras()
    if missing:
        pytest.skip(missing)
    from kserve.protocol.infer_type import InferInput, InferRequest

    from doors.kserve.backends import LocalBackend
    from doors.kserve.kserve_model import ExplainModel
    from doors.kserve.settings import read_settings
    from records import input_matches
    from records.recorder import Recorder

    model = ExplainModel(LocalBackend(read_settings("sentiment", tiny_archives()["sentiment"])))
    model.load()
    store_url = f"sqlite:///{tmp_path / 'records.sqlite3'}"
    model.recorder = Recorder.open("sentiment", {"store": store_url, "payload": payload})
    texts = ["a lovely film", "a dull film"]

    def infer(headers: dict[str, str], request_id: str | None = None) -> Any:
        inputs = [InferInput("text", [2], "BYTES", list(texts))]
        request = InferRequest("sentiment", inputs, request_id=request_id, parameters={"explain_method": "rollout"})
        return asyncio.run(model.predict(request, headers))

    try:
        answered = infer({"X-Request-Id": "oip-rows"})
        made = infer({})
        own = infer({"X-Request-Id": "header"}, request_id="oip-own")
        v1_answer = asyncio.run(model.predict({"instances": [*texts, {"text": "fine"}]}, {"X-Request-Id": "v1-rows"}))
        with open_store(store_url, payload=payload) as store:
            salt = store.salt
            for request_id in ("oip-rows", made.id, "oip-own"):
                for index, text in enumerate(texts):
                    stored = store.get(f"{request_id}-{index}")
                    assert stored is not None, (request_id, index)
                    data = stored.event["data"]
                    assert data["door"] == "kserve" and data["method"] == "rollout" and data["error"] is None
                    row = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [text]}],
                           "parameters": {"explain_method": "rollout"}}  # fmt: skip
                    assert data["input"]["payload"] == payload
                    assert input_matches(stored.event, row, salt)
                    assert not input_matches(stored.event, {**row, "parameters": {}}, salt)
            assert [store.get(record_id) is not None for record_id in v1_answer["ids"]] == [True] * 3
            assert store.verify().ok
    finally:
        model.stop()
    assert answered.id == "oip-rows" and own.id == "oip-own" and len(made.id) == 36
    assert v1_answer["id"] == "v1-rows" and v1_answer["ids"] == ["v1-rows-0", "v1-rows-1", "v1-rows-2"]
