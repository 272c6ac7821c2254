"""Traces end to end: a door started with ``OTEL_EXPORTER_OTLP_ENDPOINT`` pointing at an OTLP/HTTP receiver in the test
(tests/otlp_receiver.py) sends spans in the caller's W3C trace.

- The KServe door: an OIP ``infer`` over REST and over gRPC, each with the caller's ``traceparent``: the request span
  continues the caller's trace; the batch span (a trace of its own) links it and parents the service's ``forward``
  stage; the door's ``decode`` and ``encode`` stages and the explained row's ``explanation`` span
  (``explain.method``, ``explain.targets``, ``explain.seconds``) are the request span's children. An OpenAI
  completion's span carries the GenAI attributes.
- TorchServe behind the router: a REST prediction and a gRPC ``Predictions`` call with the caller's ``traceparent``:
  the router's spans continue the caller's trace, and TorchServe's handler continues the router's: each row's span
  (``TorchServe <task>``) is the router span's child, with its ``decode``, ``encode`` and ``explanation`` spans, and
  the batch span (``explain.batch_rows``) links it. On gRPC, whose metadata TorchServe drops, the router carries its
  span's ``traceparent`` in the ``PredictionsRequest``'s input map (:mod:`forwarding.metadata`).
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from bench.oip_client import GrpcOip, Input, RestOip
from doors.torchserve.config import Ports
from explain_client import protos
from tests.doors_support import EXTRAS
from tests.otlp_receiver import OtlpReceiver, ReceivedSpan
from tests.serving_support import tiny_archives

pytestmark = pytest.mark.slow
TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
CALLER_SPAN = "b7ad6b7169203331"
TRACEPARENT = f"00-{TRACE_ID}-{CALLER_SPAN}-01"
TEXT = "the service was quick and the staff were lovely"
#: The exporter's batch delay in the servers (ms): spans arrive within a second of their end.
FAST_EXPORT = {"OTEL_BSP_SCHEDULE_DELAY": "100", "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as running:
        yield running


def _in_caller_trace(spans: list[ReceivedSpan]) -> list[ReceivedSpan]:
    return [span for span in spans if span.trace_id == TRACE_ID]


def _trace_id(number: int) -> str:
    return f"{number:032x}"


def _writer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from model_store.package import package, validate
    from tests.generation_checkpoint import causal_lm

    store = tmp_path_factory.mktemp("traced-writer")
    folder = causal_lm(store / "checkpoint")
    return package(folder, "writer", store / "packages", None, validate(folder, "writer")).archive


@pytest.fixture(scope="module")
def kserve_door(receiver: OtlpReceiver, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ports]:
    from doors.kserve import launch

    ports = Ports.free()
    run_dir = tmp_path_factory.mktemp("traced-kserve")
    models = {"sentiment": tiny_archives()["sentiment"], "writer": _writer(tmp_path_factory)}
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, **FAST_EXPORT}
    launch.start("kserve", models, run_dir, ports.inference, ports.grpc_inference, replicas=1, timeout=400, env=env)
    try:
        yield ports
    finally:
        launch.stop(run_dir)


@EXTRAS
@pytest.mark.parametrize("transport", ["rest", "grpc"])
def test_the_kserve_door_traces_a_request_in_the_callers_trace(
    kserve_door: Ports, receiver: OtlpReceiver, transport: str
) -> None:
    trace_id = _trace_id(1 if transport == "rest" else 2)
    traceparent = f"00-{trace_id}-{CALLER_SPAN}-01"
    inputs = [Input("text", "BYTES", [TEXT])]
    parameters = {"explain_method": "grad_x_input"}
    if transport == "rest":
        client: Any = RestOip("127.0.0.1", kserve_door.inference)
    else:
        client = GrpcOip(f"127.0.0.1:{kserve_door.grpc_inference}")
    try:
        client.infer("sentiment", inputs, parameters, headers={"traceparent": traceparent})
    finally:
        client.close()

    def complete(spans: list[ReceivedSpan]) -> bool:
        ours = [span for span in spans if span.trace_id == trace_id]
        roots = {span.span_id for span in ours if span.parent_span_id == CALLER_SPAN}
        linked = [span for span in spans if span.name == "batch" and any(link[1] in roots for link in span.links)]
        explained = any(span.name == "explanation" for span in ours) and any(span.name == "encode" for span in ours)
        return bool(roots) and explained and bool(linked)

    spans = receiver.wait_for(complete, timeout=30)
    ours = [span for span in spans if span.trace_id == trace_id]
    request = [span for span in ours if span.parent_span_id == CALLER_SPAN]
    assert len(request) == 1, ours
    request_span = request[0]
    expected = "POST /v2/models/{model}/infer" if transport == "rest" else "inference.GRPCInferenceService/ModelInfer"
    assert request_span.name == expected and request_span.kind == 2 and request_span.service == "explain-service"
    explanation = next(span for span in ours if span.name == "explanation")
    assert explanation.parent_span_id == request_span.span_id
    stages = {span.name for span in ours if span.parent_span_id == request_span.span_id}
    assert {"decode", "encode"} <= stages, stages  # the door's own stages of the request
    assert explanation.attributes["explain.method"] == "grad_x_input"
    assert explanation.attributes["explain.targets"] == 1 and explanation.attributes["explain.seconds"] > 0
    batch = next(span for span in spans if span.name == "batch" and (trace_id, request_span.span_id) in span.links)
    assert batch.trace_id != trace_id and batch.attributes["explain.batch_rows"] >= 1
    forward = [span for span in spans if span.name == "forward" and span.parent_span_id == batch.span_id]
    assert len(forward) == 1 and forward[0].trace_id == batch.trace_id


@EXTRAS
def test_the_kserve_openai_route_carries_the_gen_ai_attributes(kserve_door: Ports, receiver: OtlpReceiver) -> None:
    trace_id = _trace_id(3)
    connection = http.client.HTTPConnection("127.0.0.1", kserve_door.inference, timeout=120)
    body = {"model": "writer", "prompt": "the staff were", "max_tokens": 3}
    headers = {"Content-Type": "application/json", "traceparent": f"00-{trace_id}-{CALLER_SPAN}-01"}
    connection.request("POST", "/v1/completions", json.dumps(body), headers)
    response = connection.getresponse()
    answer = json.loads(response.read())
    connection.close()
    assert response.status == 200, answer
    spans = receiver.wait_for(
        lambda spans: any(span.trace_id == trace_id and "gen_ai.operation.name" in span.attributes for span in spans),
        timeout=30,
    )
    request_span = next(span for span in spans if span.trace_id == trace_id and span.parent_span_id == CALLER_SPAN)
    assert request_span.name == "POST /v1/completions"
    attributes = request_span.attributes
    assert attributes["gen_ai.operation.name"] == "text_completion" and attributes["gen_ai.request.model"] == "writer"
    assert attributes["gen_ai.usage.input_tokens"] == answer["usage"]["prompt_tokens"] > 0
    assert attributes["gen_ai.usage.output_tokens"] == answer["usage"]["completion_tokens"] > 0


@pytest.fixture(scope="module")
def torchserve(
    receiver: OtlpReceiver, tmp_path_factory: pytest.TempPathFactory, monkeypatch_module: pytest.MonkeyPatch
) -> Iterator[Any]:
    from doors.torchserve.process import start, stop
    from tests.serving_support import REPO_ROOT

    for name, value in {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, **FAST_EXPORT}.items():
        monkeypatch_module.setenv(name, value)  # the router, TorchServe and its workers inherit them
    run_dir = tmp_path_factory.mktemp("traced-torchserve")
    models = {"sentiment": str(tiny_archives()["sentiment"].resolve())}
    server = start(run_dir, REPO_ROOT, models, Ports.free(), timeout=300, router=True)
    try:
        yield server
    finally:
        stop(run_dir)


@pytest.fixture(scope="module")
def monkeypatch_module() -> Iterator[pytest.MonkeyPatch]:
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def test_torchserve_behind_the_router_continues_the_callers_trace(torchserve: Any, receiver: OtlpReceiver) -> None:
    token = torchserve.keys["inference"]
    connection = http.client.HTTPConnection("127.0.0.1", torchserve.ports.inference, timeout=120)
    document = {"text": TEXT, "explain": {"method": "grad_x_input"}}
    connection.request("POST", "/predictions/sentiment", json.dumps(document),
                       {"Content-Type": "application/json", "Authorization": f"Bearer {token}",
                        "traceparent": TRACEPARENT})  # fmt: skip
    response = connection.getresponse()
    assert response.status == 200, response.read()
    response.read()
    connection.close()
    grpc_trace = _trace_id(4)
    messages, stubs = protos.inference_stubs()
    with grpc.insecure_channel(f"127.0.0.1:{torchserve.ports.grpc_inference}") as channel:
        stub = stubs.InferenceAPIsServiceStub(channel)
        request = messages.PredictionsRequest(model_name="sentiment", input={"data": TEXT.encode()})
        metadata = [("authorization", f"Bearer {token}"), ("traceparent", f"00-{grpc_trace}-{CALLER_SPAN}-01")]
        stub.Predictions(request, metadata=metadata, timeout=120)

    def both(spans: list[ReceivedSpan]) -> bool:
        traces = {span.trace_id for span in spans if span.parent_span_id == CALLER_SPAN}
        workers = {span.trace_id for span in spans if span.name == "TorchServe text"}
        return {TRACE_ID, grpc_trace} <= traces and {TRACE_ID, grpc_trace} <= workers

    spans = receiver.wait_for(both, timeout=30)
    rest = [span for span in _in_caller_trace(spans) if span.parent_span_id == CALLER_SPAN]
    assert [span.name for span in rest] == ["Router POST"], rest
    assert rest[0].attributes == {"http.request.method": "POST", "http.response.status_code": 200}
    call = [span for span in spans if span.trace_id == grpc_trace and span.parent_span_id == CALLER_SPAN]
    assert [span.name for span in call] == ["Router Predictions"], call
    # TorchServe drops gRPC metadata: the router carries the trace context in the input map, and the worker continues it
    grpc_worker = [span for span in spans if span.trace_id == grpc_trace and span.name == "TorchServe text"]
    assert [span.parent_span_id for span in grpc_worker] == [call[0].span_id], grpc_worker
    assert {"decode", "encode"} <= {span.name for span in spans if span.parent_span_id == grpc_worker[0].span_id}
    worker = [span for span in spans if span.trace_id == TRACE_ID and span.name == "TorchServe text"]
    assert [span.parent_span_id for span in worker] == [rest[0].span_id], worker  # the handler's row span
    stages = {span.name for span in spans if span.parent_span_id == worker[0].span_id}
    assert {"decode", "encode", "explanation"} <= stages, stages
    batch = [span for span in spans if span.name == "batch" and (TRACE_ID, worker[0].span_id) in span.links]
    assert len(batch) == 1 and batch[0].attributes["explain.batch_rows"] >= 1, batch
