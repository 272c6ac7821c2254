"""Every record kept with payload ``full`` is explained again, whatever door and encoding its input came in
(``POST /v1/records/{id}/explain``): a stored input as its task's JSON document (serving_core/stored_input.py: a JSON
document, a raw PNG body, a serialized ``ExplainRequest``, a ``text/plain`` body), an OIP ``infer`` row's record
read back through the model's OIP codec (doors/kserve/oip/stored.py); on the KServe door (its records routes over an
in-process model) and through TorchServe's router (its records routes, TorchServe stood in for by the same model
answering the posted JSON document, the row recorded by the handler's own glue with the router's headers). Each
re-explanation is a new record whose ``parent`` is the old one, explained by the method asked for; an input that
cannot be a request is 422 ``unreadable_input``; erased and hash records stay 409 ``payload_not_kept``; another
model version 409 ``model_version_changed``."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from doors.torchserve.records_door import RecordsRoutes
from doors.torchserve.row_records import record_rows
from explain_client.protos import explain_messages
from records import build_record, open_store
from records.api import UnreadableInputError
from records.keys import ensure_records_key, records_key
from records.recorder import Recorder, close_writers
from serving_core.errors import RowError
from serving_core.recording import REQUEST_ID_HEADER, new_request_id
from serving_core.stored_input import task_document
from tests.serving_support import png_bytes, tiny_archives


def _request(**fields: Any) -> bytes:
    """A serialized ``ExplainRequest``."""
    message = explain_messages().ExplainRequest(**fields)
    return bytes(message.SerializeToString())


def test_stored_inputs_become_their_task_documents() -> None:
    png = png_bytes()
    assert task_document(png, "image") == {"image": base64.b64encode(png).decode()}
    asked = explain_messages().ExplainOptions(method="rollout")
    assert task_document(_request(text="a lovely film", text_pair="fine", explain=asked, deadline_ms=5), "text") == {
        "text": "a lovely film",
        "text_pair": "fine",
    }
    assert task_document(_request(image=png), "image") == {"image": base64.b64encode(png).decode()}
    generation = explain_messages().GenerationRequest(
        messages=[explain_messages().ChatMessage(role="user", content="hi")], max_new_tokens=3,
        sampling=explain_messages().GenerationSampling(do_sample=True, seed=7), continuation_ids=[1, 2],
    )  # fmt: skip
    assert task_document(_request(generation=generation), "generation") == {
        "messages": [{"role": "user", "content": "hi"}],
        "max_new_tokens": 3,
        "generation": {"do_sample": True, "seed": 7},
        "continuation_ids": [1, 2],
    }
    assert task_document(b"a lovely film", "text") == {"text": "a lovely film"}
    assert task_document(b"a lovely film", "token_classification") == {"text": "a lovely film"}
    assert task_document(b"Once upon", "generation") == {"prompt": "Once upon"}
    assert task_document(b"\n\x05hello", "text") == {"text": "hello"}  # parses as an ExplainRequest
    entries = [b"\x0a\x01" + key + b"\x10" + bytes([value]) for key, value in ((b"b", 1), (b"a", 2))]
    options = b"\x0a\x01m" + b"".join(b"\x22" + bytes([len(entry)]) + entry for entry in entries)  # b before a
    written = b"\x0a\x01x" + b"\x1a" + bytes([len(options)]) + options  # as another client may order a map
    assert task_document(written, "text") == {"text": "x"}
    assert task_document(b"\n\x01xH1", "text") == {"text": "\n\x01xH1"}  # parses, with an unknown field 9: a text
    assert task_document(b'{"text": "x", "explain": {"method": "a"}}', "text") == {"text": "x"}
    kept = {"prompt": "p", "explain": {"method": "a"}, "deadline_ms": 1, "stream": True, "max_new_tokens": 2}
    assert task_document(kept, "generation") == {"prompt": "p", "max_new_tokens": 2}
    oip_row = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["x"]}], "parameters": {}}
    with pytest.raises(UnreadableInputError, match="KServe door"):
        task_document(oip_row, "text")  # the TorchServe door has no OIP codec
    for junk, task in ((b"\xff\xfe not text", "text"), (b"", "text"), (b"plain words", "image"), (b"[1]", "image")):
        with pytest.raises(UnreadableInputError):
            task_document(junk, task)


def _fake_context(headers: list[dict[str, str]]) -> Any:
    class Context:
        def __init__(self) -> None:
            self.response_headers: dict[int, dict[str, str]] = {}

        def get_all_request_header(self, index: int) -> dict[str, str]:
            return headers[index]

        def set_response_header(self, index: int, key: str, value: str) -> None:
            self.response_headers.setdefault(index, {})[key] = value

    return Context()


def _record_torchserve_rows(
    recorder: Recorder, task: str, version: str | None, rows: list[dict[str, Any]], answer: dict[str, Any]
) -> list[str]:
    """Rows recorded as TorchServe's handler records them (its own glue), under ids of their own."""
    context = _fake_context([{} for _ in rows])
    ids: list[str | RowError] = [new_request_id() for _ in rows]
    assert record_rows(recorder, task=task, version=version, context=context, data=rows,
                       answers=[answer] * len(rows), ids=ids) == [None] * len(rows)  # fmt: skip
    return [str(given) for given in ids]


class Served:
    """The tiny models served in-process, each with its recorder on one store (payload full)."""

    def __init__(self, store_url: str, archives: Mapping[str, Path]) -> None:
        from doors.kserve.backends import LocalBackend
        from doors.kserve.kserve_model import ExplainModel
        from doors.kserve.settings import read_settings

        self.store_url = store_url
        self.models: dict[str, ExplainModel] = {}
        for name, archive in archives.items():
            model = ExplainModel(LocalBackend(read_settings(name, archive)))
            model.load()
            model.recorder = Recorder.open(name, {"store": store_url, "payload": "full"}, environ={})
            self.models[name] = model

    def version(self, name: str) -> str | None:
        return self.models[name].version

    def close(self) -> None:
        for model in self.models.values():
            model.stop()
        close_writers()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    from tests.doors_support import missing_extras

    missing = missing_extras()
    if missing:
        pytest.skip(missing)
    from model_store.package import package, validate
    from tests.generation_checkpoint import causal_lm

    folder = tmp_path_factory.mktemp("reexplain")
    lm = causal_lm(folder / "writer")
    writer = package(lm, "writer", folder / "packages", None, validate(lm, "writer")).archive
    archives = {**tiny_archives(), "writer": writer}  # text, image, token classification, generation
    models = Served(f"sqlite:///{folder / 'records.sqlite3'}", archives)
    try:
        yield models
    finally:
        models.close()


def _oip_record(served: Served, name: str, request_id: str, inputs: list[tuple[str, list[Any]]]) -> str:
    """An OIP ``infer`` of one row answered (and recorded) by the KServe door's model, explained by rollout."""
    from kserve.protocol.infer_type import InferInput, InferRequest

    tensors = [InferInput(input_name, [len(data)], "BYTES", data) for input_name, data in inputs]
    parameters = {"explain_method": "rollout", "explain_option_start_layer": 0}
    if name == "writer":
        parameters = {"explain_method": "rollout", "explain_steps": "0", "max_new_tokens": 2}
    request = InferRequest(name, tensors, parameters=parameters)
    answered = asyncio.run(served.models[name].predict(request, {"X-Request-Id": request_id}))
    assert answered.id == request_id
    return request_id


def _kserve_client(served: Served, folder: Path) -> Any:
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from doors.kserve.records_routes import add_records_routes

    app = FastAPI()
    environ = {"EXPLAIN_RECORDS": served.store_url, "EXPLAIN_RECORDS_PAYLOAD": "full"}
    key_file = folder / "key_file.json"
    assert add_records_routes(app, served.models, key_file, environ) is not None
    client = TestClient(app)  # entered by the test: one event loop serves every request, as the door's
    client.headers["Authorization"] = f"Bearer {records_key(key_file)}"
    return client


def _child(served: Served, record_id: str) -> dict[str, Any]:
    with open_store(served.store_url) as store:
        stored = store.get(record_id)
        assert stored is not None, record_id
        return dict(stored.event["data"])


def _check_explained_again(served: Served, done: dict[str, Any], parent: str, model: str, method: str) -> None:
    assert done["parent"] == parent and done["answer"]["explanation"]["method"] == method, done
    child = _child(served, done["id"])
    assert child["parent"] == parent and child["method"] == method and child["error"] is None
    assert child["model"] == {"name": model, "version": served.version(model)}


def test_the_kserve_door_explains_any_full_record_again(served: Served, tmp_path: Path) -> None:
    png = png_bytes()
    text_row = _oip_record(served, "sentiment", "oip-text", [("text", ["a lovely film"]), ("text_pair", ["fine"])])
    image_row = _oip_record(served, "digits", "oip-image", [("image", [base64.b64encode(png).decode()])])
    with open_store(served.store_url) as store:
        stored = store.get(text_row)
        assert stored is not None and stored.event["data"]["input"]["document"]["inputs"][0]["name"] == "text"
    entities_row = _oip_record(served, "entities", "oip-entities", [("text", ["Ada Lovelace wrote"])])
    writer_row = _oip_record(served, "writer", "oip-writer", [("prompt", ["the service was"])])
    recorder = served.models["sentiment"].recorder
    writer = served.models["writer"].recorder
    assert recorder is not None and writer is not None
    answer = {"label": "positive", "label_id": 1, "probabilities": {"negative": 0.4, "positive": 0.6}}
    generation = explain_messages().GenerationRequest(prompt="good", max_new_tokens=2)
    writer_proto, writer_plain = _record_torchserve_rows(
        writer, "generation", served.version("writer"), [{"request": _request(generation=generation)},
                                                         {"body": "the service was"}], answer)  # fmt: skip
    plain, proto = _record_torchserve_rows(recorder, "text", served.version("sentiment"),
                                           [{"body": "a lovely film"}, {"request": _request(text="a dull film")}],
                                           answer)  # fmt: skip
    with _kserve_client(served, tmp_path) as client:
        rows = [(text_row, "sentiment"), (image_row, "digits"), (entities_row, "entities"),
                (writer_row, "writer"), (writer_proto, "writer"), (writer_plain, "writer"),
                (plain, "sentiment"), (proto, "sentiment")]  # fmt: skip
        _explain_each_again(served, client, rows, text_row)
        child = _child(served, client.post(f"/v1/records/{writer_row}/explain", json=ASK).json()["id"])
        assert child["input"]["document"] == {"prompt": "the service was", "max_new_tokens": 2, **ASK}


#: The re-explanation asked for in these tests.
ASK = {"explain": {"method": "grad_x_input"}}


def _explain_each_again(served: Served, client: Any, rows: list[tuple[str, str]], text_row: str) -> None:
    for parent, model in rows:
        reply = client.post(f"/v1/records/{parent}/explain", json={"explain": {"method": "grad_x_input"}})
        assert reply.status_code == 200, reply.text
        _check_explained_again(served, reply.json(), parent, model, "grad_x_input")
    assert _child(served, reply.json()["id"])["input"]["document"] == {
        "text": "a dull film",
        "explain": {"method": "grad_x_input"},
    }
    again = client.post(f"/v1/records/{text_row}/explain", json={"explain": {"method": "grad_x_input"}}).json()
    assert _child(served, again["id"])["input"]["document"] == {
        "text": "a lovely film",
        "text_pair": "fine",
        "explain": {"method": "grad_x_input"},
    }
    assert _child(served, again["id"])["input"]["document"]["text_pair"] == "fine"


def test_refusals_stay_clear(served: Served, tmp_path: Path) -> None:
    with _kserve_client(served, tmp_path) as client:
        _check_refusals(served, client)


def _check_refusals(served: Served, client: Any) -> None:
    version = served.version("sentiment")
    answer = {"label": "positive", "label_id": 1, "probabilities": {"negative": 0.4, "positive": 0.6}}
    records = [
        build_record(model="sentiment", version=version, task="text", door="torchserve", request_id="junk",
                     index=None, answer=answer, input=b"\xff\xfe not a request"),
        build_record(model="sentiment", version="sha256:another", task="text", door="torchserve",
                     request_id="older", index=None, answer=answer, input=b"a lovely film"),
        build_record(model="sentiment", version=version, task="text", door="kserve", request_id="bad-oip",
                     index=None, answer=answer,
                     input={"inputs": [{"name": "image", "datatype": "BYTES", "shape": [1], "data": ["x"]}]}),
        build_record(model="sentiment", version=version, task="text", door="torchserve", request_id="gone",
                     index=None, answer=answer, input=b"a lovely film"),
    ]  # fmt: skip
    with open_store(served.store_url, payload="full") as store:
        store.write(records)
    with open_store(served.store_url, payload="hash") as store:
        store.write([build_record(model="sentiment", version=version, task="text", door="torchserve",
                                  request_id="hashed", index=None, answer=answer, input=b"a lovely film")])  # fmt: skip
    assert client.delete("/v1/records/gone").json() == {"id": "gone", "erased": 1}
    ask = {"explain": {"method": "grad_x_input"}}
    expected = {
        "junk": (422, "unreadable_input"),
        "bad-oip": (422, "unreadable_input"),
        "older": (409, "model_version_changed"),
        "gone": (409, "payload_not_kept"),
        "hashed": (409, "payload_not_kept"),
    }
    for record_id, (status, code) in expected.items():
        reply = client.post(f"/v1/records/{record_id}/explain", json=ask)
        assert (reply.status_code, reply.json()["error"]["code"]) == (status, code), (record_id, reply.text)
    assert "unsupported_input" in client.post("/v1/records/bad-oip/explain", json=ask).json()["error"]["message"]


class StandInTorchServe:
    """TorchServe behind the router: the posted JSON document answered by the served model as TorchServe's REST route
    answers it, the row recorded by the handler's glue (:func:`doors.torchserve.row_records.record_rows`) with the
    headers the router sent."""

    def __init__(self, served: Served) -> None:
        self.served = served
        self.posted: list[dict[str, Any]] = []

    def request(self, method: str, path: str, body: bytes | None, headers: Mapping[str, str]) -> tuple[Any, bytes]:
        from dataclasses import dataclass

        @dataclass
        class Response:
            status: int

        name = path.rsplit("/", 1)[-1]
        model = self.served.models[name]
        document = json.loads(body or b"{}")
        self.posted.append(document)
        answer = asyncio.run(model.answer_documents([document], _no_records()))[0]
        recorder = model.recorder
        context = _fake_context([dict(headers)])
        data = [{"body": body}]
        ids: list[str | RowError] = [headers[REQUEST_ID_HEADER]]  # the id the router sent
        assert record_rows(recorder, task=model.settings.config.task, version=model.version, context=context,
                           data=data, answers=[answer], ids=ids) == [None]  # fmt: skip
        assert context.response_headers[0][REQUEST_ID_HEADER] == headers[REQUEST_ID_HEADER]
        status = int(answer["error"]["http_status"]) if "error" in answer else 200
        return Response(status), json.dumps(answer).encode()


def _no_records() -> Any:
    from doors.kserve.row_records import RequestRecords

    return RequestRecords("stand-in", ())


def test_torchserve_s_router_explains_raw_and_protobuf_rows_again(served: Served, tmp_path: Path) -> None:
    png = png_bytes(seed=3)
    answer = {"label": "3", "label_id": 3, "probabilities": {"3": 1.0}}
    digits = served.models["digits"].recorder
    sentiment = served.models["sentiment"].recorder
    assert digits is not None and sentiment is not None
    (raw_png,) = _record_torchserve_rows(digits, "image", served.version("digits"), [{"body": png}], answer)
    pair = _request(text="a lovely film", text_pair="fine", explain=explain_messages().ExplainOptions(method="rollout"))
    proto, plain = _record_torchserve_rows(sentiment, "text", served.version("sentiment"),
                                           [{"request": pair}, {"body": b"a dull film"}], answer)  # fmt: skip
    with open_store(served.store_url) as store:
        stored = store.get(proto)
        assert stored is not None and base64.b64decode(stored.event["data"]["input"]["base64"]) == pair
    key_file = tmp_path / "key_file.json"
    key_file.write_text(json.dumps({"inference": {"key": "inf-key"}, "management": {"key": "man-key"}}))
    versions = {name: served.version(name) for name in served.models}
    environ = {"EXPLAIN_RECORDS": served.store_url, "EXPLAIN_RECORDS_PAYLOAD": "full"}
    routes = RecordsRoutes(key_file, versions, environ=environ)
    upstream = StandInTorchServe(served)
    key = f"Bearer {ensure_records_key(key_file)}"
    ask = json.dumps({"explain": {"method": "grad_x_input"}}).encode()
    for parent, model in ((raw_png, "digits"), (proto, "sentiment"), (plain, "sentiment")):
        reply = routes.respond("POST", f"/v1/records/{parent}/explain", key, ask, upstream)  # type: ignore[arg-type]
        assert reply is not None and reply.status == 200, reply
        assert isinstance(reply.body, bytes)
        _check_explained_again(served, json.loads(reply.body), parent, model, "grad_x_input")
    assert upstream.posted == [
        {"image": base64.b64encode(png).decode(), "explain": {"method": "grad_x_input"}},
        {"text": "a lovely film", "text_pair": "fine", "explain": {"method": "grad_x_input"}},
        {"text": "a dull film", "explain": {"method": "grad_x_input"}},
    ]
    oip_row = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["x"]}], "parameters": {}}
    version = served.version("sentiment")
    with open_store(served.store_url, payload="full") as store:
        store.write([
            build_record(model="sentiment", version=version, task="text", door="torchserve", request_id="ts-junk",
                         index=None, answer=answer, input=b"\xff\xfe not a request"),
            build_record(model="sentiment", version=version, task="text", door="kserve", request_id="ts-oip",
                         index=None, answer=answer, input=oip_row),
        ])  # fmt: skip
    for parent in ("ts-junk", "ts-oip"):
        reply = routes.respond("POST", f"/v1/records/{parent}/explain", key, ask, upstream)  # type: ignore[arg-type]
        assert reply is not None and reply.status == 422 and isinstance(reply.body, bytes)
        assert json.loads(reply.body)["error"]["code"] == "unreadable_input"
    assert len(upstream.posted) == 3  # nothing sent upstream for them


def test_oip_rows_become_their_task_documents() -> None:
    """Each row of an OIP request, as the KServe door records it (``row_requests``), read back through the model's
    codec: the document decodes to the row's own input (what it asked to explain left out), for every task."""
    from doors.kserve import oip
    from doors.kserve.oip.stored import oip_row_document, stored_document
    from serving_core.config import HandlerConfig
    from serving_core.task import get_task

    png = png_bytes()
    cases: list[tuple[HandlerConfig, dict[str, tuple[str, list[Any]]], dict[str, Any]]] = [
        (HandlerConfig(task="text", labels=("negative", "positive")),
         {"text": ("BYTES", ["one", b"two"]), "text_pair": ("BYTES", ["a", "b"]),
          "explain_method": ("BYTES", ["rollout", ""])}, {"explain_target": 1}),
        (HandlerConfig(task="image", labels=("a", "b"), image_size=(16, 16)),
         {"image": ("BYTES", [png, base64.b64encode(png).decode()])}, {"explain_method": "rollout"}),
        (HandlerConfig(task="token_classification", labels=("O", "B-PER", "I-PER")),
         {"text": ("BYTES", ["Ada Lovelace", "Alan Turing"])}, {"explain_method": "rollout"}),
        (HandlerConfig(task="generation", labels=()),
         {"prompt": ("BYTES", ["Once", "Twice"]), "continuation": ("BYTES", ["", " upon"])},
         {"explain_method": "rollout", "explain_steps": "0", "max_new_tokens": 2, "do_sample": True, "seed": 3,
          "explain_deadline_ms": 1}),
    ]  # fmt: skip
    for config, inputs, parameters in cases:
        tensors = {name: oip.Tensor(name, kind, (len(data),), data) for name, (kind, data) in inputs.items()}
        request = oip.OipRequest(tensors, parameters)
        plain = oip.OipRequest(
            {name: tensor for name, tensor in tensors.items() if not name.startswith("explain_")},
            {key: value for key, value in parameters.items() if not key.startswith("explain_")},
        )
        served = oip.decode_request(plain, config)
        task = get_task(config.task)
        for index, stored in enumerate(oip.row_requests(request, 2)):
            stored = json.loads(json.dumps(stored))  # as the store gives it back
            document = oip_row_document(stored, config)
            assert stored_document(stored, config) == document
            assert "explain" not in document, document
            assert task.decode_document(document, False, config) == served[index], (config.task, document)
    with pytest.raises(UnreadableInputError, match="unsupported_input"):
        oip_row_document({"inputs": [{"name": "image", "datatype": "BYTES", "shape": [1], "data": ["x"]}]}, cases[0][0])
    with pytest.raises(UnreadableInputError):
        oip_row_document({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [2], "data": ["x"]}]}, cases[0][0])


@pytest.fixture(scope="module")
def torchserve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """TorchServe's door with records on (payload full): the router in front, the text and image models."""
    from doors.torchserve.config import Ports
    from doors.torchserve.process import start, stop
    from tests.serving_support import REPO_ROOT

    archives = tiny_archives()
    run_dir = tmp_path_factory.mktemp("reexplain-torchserve")
    models = {name: str(archives[name].resolve()) for name in ("sentiment", "digits")}
    with pytest.MonkeyPatch.context() as patch:  # what EXPLAIN_RECORDS=... make start gives the processes
        patch.setenv("EXPLAIN_RECORDS", f"sqlite:///{run_dir / 'records.sqlite3'}")
        patch.setenv("EXPLAIN_RECORDS_PAYLOAD", "full")
        server = start(run_dir, REPO_ROOT, models, Ports.free(), timeout=300)
    try:
        yield server
    finally:
        stop(run_dir)


def _http(base: str, method: str, path: str, body: bytes | None, headers: dict[str, str]) -> tuple[int, Any]:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(base + path, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=120) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


@pytest.mark.slow
def test_a_running_torchserve_explains_raw_and_grpc_rows_again(torchserve: Any) -> None:
    """On a running TorchServe door: a raw PNG body, a ``text/plain`` body and a gRPC row's ``ExplainRequest`` are
    recorded with their input as it came, and each is explained again through the router by another method."""
    from tests.ops_support import GrpcCaller

    inference = {"Authorization": f"Bearer {torchserve.keys['inference']}"}
    png = png_bytes(seed=5)
    status, _ = _http(torchserve.inference_url, "POST", "/predictions/digits", png,
                      {**inference, "Content-Type": "image/png", "X-Request-Id": "raw-png"})  # fmt: skip
    assert status == 200
    status, _ = _http(torchserve.inference_url, "POST", "/predictions/sentiment", b"a lovely film",
                      {**inference, "Content-Type": "text/plain", "X-Request-Id": "plain-text"})  # fmt: skip
    assert status == 200
    asked = explain_messages().ExplainOptions(method="rollout")
    serialized = _request(text="a dull film", text_pair="fine", explain=asked)
    caller = GrpcCaller(torchserve)
    try:
        reply = explain_messages().ExplainResponse.FromString(caller.predict("sentiment", {"request": serialized}))
    finally:
        caller.close()
    assert reply.explanation.method == "rollout", reply
    records = {"Authorization": f"Bearer {records_key(torchserve.run_dir / 'key_file.json')}"}
    status, page = _http(torchserve.inference_url, "GET", "/v1/records?model=sentiment&limit=1000", None, records)
    assert status == 200
    grpc_rows = [event["id"] for event in page["data"]
                 if event["data"]["input"].get("base64") == base64.b64encode(serialized).decode()]  # fmt: skip
    assert len(grpc_rows) == 1
    ask = json.dumps({"explain": {"method": "grad_x_input"}}).encode()
    for parent in ("raw-png", "plain-text", grpc_rows[0]):
        status, done = _http(torchserve.inference_url, "POST", f"/v1/records/{parent}/explain", ask,
                             {**records, "Content-Type": "application/json"})  # fmt: skip
        assert status == 200, (parent, done)
        assert done["parent"] == parent and done["answer"]["explanation"]["method"] == "grad_x_input"
        status, child = _http(torchserve.inference_url, "GET", f"/v1/records/{done['id']}", None, records)
        assert status == 200 and child["data"]["parent"] == parent and child["data"]["method"] == "grad_x_input"
    assert child["data"]["input"]["document"] == {"text": "a dull film", "text_pair": "fine",
                                                  "explain": {"method": "grad_x_input"}}  # fmt: skip


@pytest.fixture(scope="module")
def kserve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """The KServe door with records on (payload full), serving the text and image models: (its URL, its run folder)."""
    from doors.kserve import launch
    from doors.torchserve.config import Ports
    from tests.doors_support import missing_extras

    missing = missing_extras()
    if missing:
        pytest.skip(missing)
    archives = tiny_archives()
    run_dir = tmp_path_factory.mktemp("reexplain-kserve")
    env = {"OMP_NUM_THREADS": "1", "EXPLAIN_RECORDS": f"sqlite:///{run_dir / 'records.sqlite3'}",
           "EXPLAIN_RECORDS_PAYLOAD": "full"}  # fmt: skip
    ports = Ports.free()
    models = {name: archives[name] for name in ("sentiment", "digits")}
    launch.start("kserve", models, run_dir, ports.inference, ports.grpc_inference, timeout=400, env=env)
    try:
        yield f"http://127.0.0.1:{ports.inference}", run_dir
    finally:
        launch.stop(run_dir)


@pytest.mark.slow
def test_a_running_kserve_door_explains_its_oip_rows_again(kserve: tuple[str, Path]) -> None:
    """On a running KServe door: OIP ``infer`` rows (a text pair, an image as base64) are explained again through
    the door's records routes by another method."""
    url, run_dir = kserve

    png = png_bytes(seed=7)
    infers = {
        "sentiment": {"id": "oip-pair", "parameters": {"explain_method": "rollout"},
                      "inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a lovely film"]},
                                 {"name": "text_pair", "datatype": "BYTES", "shape": [1], "data": ["fine"]}]},
        "digits": {"id": "oip-png", "parameters": {"explain_method": "rollout"},
                   "inputs": [{"name": "image", "datatype": "BYTES", "shape": [1],
                               "data": [base64.b64encode(png).decode()]}]},
    }  # fmt: skip
    json_type = {"Content-Type": "application/json"}
    for model, body in infers.items():
        status, answer = _http(url, "POST", f"/v2/models/{model}/infer", json.dumps(body).encode(), json_type)
        assert status == 200 and answer["id"] == body["id"], answer
    records = {**json_type, "Authorization": f"Bearer {records_key(run_dir / 'key_file.json')}"}
    ask = json.dumps({"explain": {"method": "grad_x_input"}}).encode()
    for parent in ("oip-pair", "oip-png"):
        status, done = _http(url, "POST", f"/v1/records/{parent}/explain", ask, records)
        assert status == 200, (parent, done)
        assert done["parent"] == parent and done["answer"]["explanation"]["method"] == "grad_x_input"
        status, child = _http(url, "GET", f"/v1/records/{done['id']}", None, records)
        assert status == 200 and child["data"]["parent"] == parent and child["data"]["method"] == "grad_x_input"
    assert child["data"]["input"]["document"] == {"image": base64.b64encode(png).decode(),
                                                  "explain": {"method": "grad_x_input"}}  # fmt: skip
