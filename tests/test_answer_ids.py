"""Every answer of TorchServe's door carries its id, the id of its record: the handler with a fake TorchServe context
(per-row headers, TorchServe's own row ids, the gRPC input map), in-process.

JSON answers have ``"id"`` (errors included), protobuf answers ``ExplainResponse.request_id``, the ``X-Request-Id``
response header the same id; the caller's valid id is used (a REST header, or a gRPC row's ``x-request-id`` entry),
else TorchServe's own id of the row; a path-like id is refused (``invalid_request``) and the refusal answered under
TorchServe's id. The record is stored under that id, with a well-formed ``traceparent`` only. A streamed row's every
event carries its id. The log lines name the ids, never the request text. And the router's forwarder carries a gRPC
call's ``x-request-id`` and trace context into the input map (:mod:`forwarding.metadata`).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from doors.torchserve.handler import ExplanationHandler
from explain_client import protos
from explain_client.results import Prediction, ServiceError
from explain_client.wire import prediction_from_protobuf
from serving_core.config import HandlerConfig
from serving_core.tasks.classify_service import ExplanationService
from tests.serving_support import tiny_archives

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
SECRET = "a sentence nobody may log"


class FakeContext:
    """TorchServe's context of one batch: each row's request headers and TorchServe's own id; what the handler sets.
    As TorchServe does, a row's headers also list each of its inputs (a REST body, a gRPC input map's entries) with
    its content type, as a mapping."""

    def __init__(self, headers: list[dict[str, str]], data: list[dict[str, Any]]) -> None:
        self.headers: list[dict[str, Any]] = [
            {**{name: {"content-type": None} for name in row}, **given}
            for given, row in zip(headers, data, strict=True)
        ]
        self.request_ids = {index: f"ts-own-{index}" for index in range(len(headers))}
        self.response_headers: dict[int, dict[str, str]] = {}
        self.statuses: dict[int, int] = {}
        self.content_types: dict[int, str] = {}

    def get_request_header(self, index: int, name: str) -> str | None:
        return self.headers[index].get(name)

    def get_all_request_header(self, index: int) -> dict[str, str]:
        return self.headers[index]

    def set_response_header(self, index: int, name: str, value: str) -> None:
        self.response_headers.setdefault(index, {})[name] = value

    def set_response_status(self, status: int, phrase: str, index: int) -> None:
        self.statuses[index] = status

    def set_response_content_type(self, index: int, content_type: str) -> None:
        self.content_types[index] = content_type


@pytest.fixture(scope="module")
def handler() -> ExplanationHandler:
    archive = tiny_archives()["sentiment"]
    config = HandlerConfig.from_model_yaml(yaml.safe_load((archive / "model-config.yaml").read_text()))
    served = ExplanationHandler()
    served.service = ExplanationService(config, archive / "model", torch.device("cpu"))
    served.config, served.model_name = config, "sentiment"
    return served


def _request(text: str, method: str | None = None) -> bytes:
    messages = protos.explain_messages()
    message = messages.ExplainRequest(text=text)
    if method is not None:
        message.explain.CopyFrom(messages.ExplainOptions(method=method))
    return bytes(message.SerializeToString())


def _reply(body: bytes) -> Any:
    return protos.explain_messages().ExplainResponse.FromString(body)


def test_every_answer_carries_its_id_json_and_protobuf_errors_included(
    handler: ExplanationHandler, caplog: pytest.LogCaptureFixture
) -> None:
    data: list[dict[str, Any]] = [
        {"body": {"text": SECRET}},  # the caller's id
        {"body": b'{"text": "fine"}'},  # no id: TorchServe's own
        {"body": {"text": "fine"}},  # a path-like id: refused, answered under TorchServe's own id
        {"request": _request(SECRET), "x-request-id": b"grpc-7", "traceparent": TRACEPARENT.encode()},
        {"request": b"\xff not a message"},  # an undecodable protobuf row
        {"request": _request("fine"), "x-request-id": b"../../etc/passwd"},  # a path-like id in the input map
        {"body": b"{not json"},  # an undecodable JSON row
    ]
    context = FakeContext([{"X-Request-Id": "caller-1"}, {}, {"X-Request-Id": "../escape"}, {}, {}, {}, {}], data)
    with caplog.at_level(logging.INFO, logger="doors.torchserve.handler"):
        answers = handler.handle(data, context)
    header = {index: headers["X-Request-Id"] for index, headers in context.response_headers.items()}
    assert header == {0: "caller-1", 1: "ts-own-1", 2: "ts-own-2", 3: "grpc-7", 4: "ts-own-4", 5: "ts-own-5",
                      6: "ts-own-6"}  # fmt: skip

    first = json.loads(answers[0])
    assert handler.config is not None
    assert next(iter(first)) == "id" and first["id"] == "caller-1" and first["label"] in handler.config.labels
    assert Prediction.from_dict(first).request_id == "caller-1"
    assert json.loads(answers[1])["id"] == "ts-own-1"
    refused = json.loads(answers[2])
    assert refused["id"] == "ts-own-2" and refused["error"]["code"] == "invalid_request" and context.statuses[2] == 400
    assert set(refused) == {"id", "error"}

    served = _reply(answers[3])
    assert served.request_id == "grpc-7" and served.label and not served.HasField("error")
    assert prediction_from_protobuf(served).request_id == "grpc-7"
    broken = _reply(answers[4])
    assert broken.request_id == "ts-own-4" and broken.error.code == "invalid_protobuf"
    path_like = _reply(answers[5])
    assert path_like.request_id == "ts-own-5" and path_like.error.code == "invalid_request" and not path_like.label
    with pytest.raises(ServiceError) as raised:
        prediction_from_protobuf(path_like)
    assert raised.value.request_id == "ts-own-5"
    not_json = json.loads(answers[6])
    assert not_json == {"id": "ts-own-6", "error": not_json["error"]} and not_json["error"]["code"] == "invalid_json"
    with pytest.raises(ServiceError) as raised:
        Prediction.from_dict(not_json)
    assert raised.value.request_id == "ts-own-6"

    lines = [record.getMessage() for record in caplog.records if record.levelno >= logging.INFO]
    batch = next(line for line in lines if "batch of 7" in line)
    assert all(name in batch for name in header.values()), batch
    failed = [line for line in lines if "failed" in line]
    assert len(failed) == 4 and any("ts-own-5" in line and "invalid_request" in line for line in failed), failed
    assert not any(SECRET in line or "passwd" in line for line in lines), lines


def test_the_record_is_stored_under_the_answers_id(handler: ExplanationHandler, tmp_path: Path) -> None:
    from records import open_store
    from records.recorder import Recorder, close_writers

    store_url = f"sqlite:///{tmp_path / 'records.sqlite3'}"
    handler.recorder = Recorder.open("sentiment", {"store": store_url, "payload": "full"}, environ={})
    data: list[dict[str, Any]] = [
        {"body": {"text": "good"}},
        {"request": _request("good"), "x-request-id": b"grpc-9", "traceparent": TRACEPARENT.encode()},
        {
            "request": _request("good"),
            "traceparent": b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\r\nX: 1",
        },
    ]
    context = FakeContext([{"X-Request-Id": "rest-9", "traceparent": TRACEPARENT}, {}, {}], data)
    try:
        answers = handler.handle(data, context)
    finally:
        handler.recorder = None
        close_writers()
    ids = [json.loads(answers[0])["id"], _reply(answers[1]).request_id, _reply(answers[2]).request_id]
    assert ids == ["rest-9", "grpc-9", "ts-own-2"]
    assert [context.response_headers[index]["X-Request-Id"] for index in range(3)] == ids
    with open_store(store_url) as store:
        records = [store.get(name) for name in ids]
        assert all(record is not None for record in records)
        assert records[0] is not None and records[0].event["traceparent"] == TRACEPARENT
        assert records[1] is not None and records[1].event["traceparent"] == TRACEPARENT  # from the input map
        assert records[2] is not None and "traceparent" not in records[2].event  # malformed: not kept
        assert "id" not in (records[0].event["data"]["prediction"] or {})  # the record's own id is the answer's


def test_a_streamed_rows_every_event_carries_its_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import ts.handler_utils.utils as ts_utils

    from serving_core.tasks.generation_service import GenerationService
    from tests.generation_checkpoint import causal_lm

    config = HandlerConfig.from_model_yaml(
        {"handler": {"task": "generation", "default_method": "grad_x_input", "max_length": 16, "max_new_tokens": 8,
                     "default_new_tokens": 3, "device": "cpu"}}
    )  # fmt: skip
    writer = ExplanationHandler()
    writer.service = GenerationService(config, causal_lm(tmp_path / "lm"), torch.device("cpu"))
    writer.config, writer.model_name = config, "writer"
    sent: list[dict[str, Any]] = []

    def send(responses: dict[int, bytes], request_ids: Any, message: str, code: int, context: Any) -> None:
        sent.extend(json.loads(line) for body in responses.values() for line in body.splitlines())

    monkeypatch.setattr(ts_utils, "send_intermediate_predict_response", send)
    data: list[dict[str, Any]] = [{"body": {"prompt": "the staff were", "stream": True}}, {"body": {"prompt": "the"}}]
    context = FakeContext([{"X-Request-Id": "stream-1"}, {}], data)
    answers = writer.handle(data, context)
    last = json.loads(answers[0])
    assert sent and all(event["event"] == "token" and event["id"] == "stream-1" for event in sent), sent
    assert last["event"] == "answer" and last["id"] == "stream-1"
    assert "".join(event["text"] for event in sent) == last["text"]
    whole = json.loads(answers[1])
    assert whole["id"] == "ts-own-1" and "event" not in whole


def test_the_forwarder_carries_a_grpc_calls_id_and_trace_into_the_input_map() -> None:
    from forwarding.metadata import carried_entries, carry_metadata
    from records import InvalidRecordIdError

    messages, _ = protos.inference_stubs()
    request = messages.PredictionsRequest(model_name="sentiment", input={"data": b"fine"})
    raw = bytes(request.SerializeToString())
    metadata = [("authorization", "Bearer k"), ("x-request-id", "call-3"), ("traceparent", TRACEPARENT),
                ("tracestate", "vendor=1")]  # fmt: skip
    carried = messages.PredictionsRequest.FromString(carry_metadata(raw, metadata))
    assert dict(carried.input) == {"data": b"fine", "x-request-id": b"call-3", "traceparent": TRACEPARENT.encode(),
                                   "tracestate": b"vendor=1"}  # fmt: skip
    assert carried.model_name == "sentiment" and "authorization" not in carried.input
    own = messages.PredictionsRequest(model_name="m", input={"data": b"x", "X-Request-Id": b"mine"})
    kept = messages.PredictionsRequest.FromString(carry_metadata(bytes(own.SerializeToString()), metadata))
    assert kept.input["X-Request-Id"] == b"mine" and "x-request-id" not in kept.input  # the caller's entry wins
    assert carry_metadata(raw, [("authorization", "Bearer k")]) == raw  # nothing to carry: the bytes unchanged
    assert carry_metadata(b"\xff\xff", metadata) == b"\xff\xff"  # not a PredictionsRequest: TorchServe answers it
    for bad in ("../escape", "a/b", " ", "x" * 129):
        if bad.strip():
            with pytest.raises(InvalidRecordIdError):
                carried_entries([("x-request-id", bad)])
    malformed = [("traceparent", "00-zz-b7ad6b7169203331-01"), ("tracestate", "vendor=1")]
    assert carried_entries(malformed) == {}  # a malformed trace context is not carried
    assert carried_entries([("traceparent", f"{TRACEPARENT}\r\nX-Evil: 1")]) == {}


def test_a_grpc_rows_deadline_is_read_from_its_input_map(handler: ExplanationHandler) -> None:
    import time

    later = str(int((time.time() + 600) * 1000)).encode()
    data: list[dict[str, Any]] = [
        {"request": _request("fine", "grad_x_input"), "explain-deadline-ms": b"1"},  # long past
        {"request": _request("fine", "grad_x_input"), "Explain-Deadline-Ms": later},
        {"request": _request("fine", "grad_x_input"), "explain-deadline-ms": b"soon"},
    ]
    answers = handler.handle(data, FakeContext([{}, {}, {}], data))
    codes = [_reply(answer).error.code for answer in answers]
    assert codes == ["deadline_exceeded", "", "invalid_request"], codes
