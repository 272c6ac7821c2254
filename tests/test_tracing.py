"""Traces (serving_core/tracing.py) in process, received by a real OTLP/HTTP receiver (tests/otlp_receiver.py): the
request span continues the caller's W3C trace, stages are its children, a batch span links its rows' spans, the
explanation and GenAI attributes are set; the forwarder (the router's base) carries the trace on over REST and gRPC;
and with no endpoint set nothing of OpenTelemetry is even imported. The doors' spans end to end:
tests/integration/test_traces_served.py."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import grpc
import pytest

from forwarding import Forwarder, Policy
from forwarding.forwarder import GRPC_INFERENCE_SERVICE
from serving_core import tracing
from tests.otlp_receiver import OtlpReceiver, ReceivedSpan
from tests.serving_support import REPO_ROOT

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{CALLER_SPAN}-01"
SERVER, INTERNAL = 2, 1  # OTLP's SpanKind numbers


@pytest.fixture()
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[OtlpReceiver]:
    """A receiver, and tracing on in this process towards it (set up afresh; off again afterwards)."""
    with OtlpReceiver() as running:
        tracing.shutdown()
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", running.endpoint)
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
        monkeypatch.delenv("OTEL_SDK_DISABLED", raising=False)
        yield running
        tracing.shutdown()
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT")
    tracing.shutdown()


def _by_name(spans: list[ReceivedSpan]) -> dict[str, ReceivedSpan]:
    return {span.name: span for span in spans}


def test_off_costs_no_import_and_yields_no_op_spans() -> None:
    script = (
        "import sys\n"
        "from serving_core import tracing\n"
        "assert not tracing.enabled() and not tracing.active()\n"
        "with tracing.start_request_span({'traceparent': '" + TRACEPARENT + "'}, 'r') as span:\n"
        "    assert span is tracing.NO_SPAN and not span.is_recording()\n"
        "    with tracing.stage('decode'):\n"
        "        tracing.record_explanation('attnlrp', 1, 0.1)\n"
        "    assert tracing.current_span_context() is None\n"
        "with tracing.batch_span([None]) as batch:\n"
        "    assert batch is tracing.NO_SPAN\n"
        "assert tracing.outgoing_headers({'Traceparent': '"
        + TRACEPARENT
        + "'}) == {'traceparent': '"
        + TRACEPARENT
        + "'}\n"
        "loaded = sorted(name for name in sys.modules if name.startswith('opentelemetry'))\n"
        "assert not loaded, loaded\n"
    )
    env = {key: value for key, value in os.environ.items() if not key.startswith("OTEL_")}
    env["PYTHONPATH"] = str(REPO_ROOT)
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_disabled_sdk_wins_over_an_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert not tracing.enabled()
    monkeypatch.setenv("OTEL_SDK_DISABLED", "false")
    assert tracing.enabled()


def test_request_stages_explanations_and_a_linked_batch(receiver: OtlpReceiver) -> None:
    with tracing.start_request_span({"TraceParent": TRACEPARENT}, "POST /v2/models/{model}/infer") as request:
        assert request.is_recording()
        with tracing.stage("decode"):
            pass
        row = tracing.current_span_context()
        tracing.record_explanation("attnlrp", 1, 0.25)
        tracing.set_attributes(tracing.generation_attributes("chat", "writer", 7, 3))
    with tracing.start_request_span([(b"traceparent", b"garbage")], "other request"):
        other = tracing.current_span_context()
    batch_attributes = {"explain.batch_rows": 2}
    with tracing.batch_span([row, other, None, row], attributes=batch_attributes), tracing.stage("forward"):
        pass
    with tracing.stage("stray"):  # outside any span: not sent
        pass
    tracing.shutdown()  # flushes
    spans = _by_name(receiver.received())
    assert set(spans) == {"POST /v2/models/{model}/infer", "decode", "explanation", "other request", "batch", "forward"}
    request_span = spans["POST /v2/models/{model}/infer"]
    assert (request_span.trace_id, request_span.parent_span_id, request_span.kind) == (TRACE_ID, CALLER_SPAN, SERVER)
    assert request_span.service == tracing.DEFAULT_SERVICE_NAME
    assert request_span.attributes == {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "writer",
        "gen_ai.usage.input_tokens": 7,
        "gen_ai.usage.output_tokens": 3,
    }
    for child in ("decode", "explanation"):
        assert (spans[child].trace_id, spans[child].parent_span_id) == (TRACE_ID, request_span.span_id)
    explanation = spans["explanation"]
    assert explanation.attributes == {"explain.method": "attnlrp", "explain.targets": 1, "explain.seconds": 0.25}
    assert abs((explanation.end_ns - explanation.start_ns) - 0.25e9) < 1e6
    unrelated = spans["other request"]  # a malformed traceparent: a trace of its own
    assert unrelated.trace_id != TRACE_ID and unrelated.parent_span_id == ""
    batch = spans["batch"]
    assert batch.trace_id not in (TRACE_ID, unrelated.trace_id) and batch.parent_span_id == ""
    assert set(batch.links) == {(TRACE_ID, request_span.span_id), (unrelated.trace_id, unrelated.span_id)}
    assert len(batch.links) == 2 and batch.kind == INTERNAL and batch.attributes == {"explain.batch_rows": 2}
    assert (spans["forward"].trace_id, spans["forward"].parent_span_id) == (batch.trace_id, batch.span_id)
    assert spans["forward"].kind == INTERNAL


def test_row_spans_of_one_batch_from_two_callers(receiver: OtlpReceiver) -> None:
    """TorchServe's handler gets one batch of rows from several callers: each row a span in its caller's trace,
    its stages inside it, the batch linked to both."""
    second = "5bf92f3577b34da6a3ce929d0e0e4736"
    rows = [
        tracing.start_row_span({"traceparent": TRACEPARENT}, "TorchServe text"),
        tracing.start_row_span({"traceparent": f"00-{second}-{CALLER_SPAN}-01"}, "TorchServe text"),
    ]
    for span in rows:
        with tracing.within(span), tracing.stage("decode"):
            pass
    with tracing.batch_span([tracing.span_context(span) for span in rows]), tracing.stage("forward"):
        pass
    for span in rows:
        with tracing.within(span):
            tracing.record_explanation("relevance", 1, 0.01)
        tracing.end_span(span)
    tracing.shutdown()
    spans = receiver.received()
    requests = {span.trace_id: span for span in spans if span.name == "TorchServe text"}
    assert set(requests) == {TRACE_ID, second}
    assert all(span.parent_span_id == CALLER_SPAN for span in requests.values())
    for name in ("decode", "explanation"):
        children = {(span.trace_id, span.parent_span_id) for span in spans if span.name == name}
        assert children == {(trace, span.span_id) for trace, span in requests.items()}
    batch = next(span for span in spans if span.name == "batch")
    assert set(batch.links) == {(trace, span.span_id) for trace, span in requests.items()}


def test_row_spans_are_no_ops_while_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    tracing.shutdown()
    span = tracing.start_row_span({"traceparent": TRACEPARENT}, "row")
    assert span is tracing.NO_SPAN and tracing.span_context(span) is None
    with tracing.within(span) as current:
        assert current is tracing.NO_SPAN
    tracing.end_span(span)


def test_record_explanations_reads_every_tasks_outcome(receiver: OtlpReceiver) -> None:
    from serving_core.errors import RowError
    from serving_core.tasks.classify_schema import RowOutcome
    from serving_core.tasks.generation_schema import GenerationOutcome, GenerationStepOutcome
    from serving_core.tasks.token_schema import EntityOutcome, TokenOutcome
    from serving_core.wire import Encoding

    assert {"steps", "summed"} <= set(GenerationOutcome.__dataclass_fields__)
    assert "entities" in TokenOutcome.__dataclass_fields__ and "attribution_seconds" in RowOutcome.__dataclass_fields__
    classified = RowOutcome(encoding=Encoding.JSON, method="relevance", attribution_seconds=0.5)
    failed = RowOutcome(encoding=Encoding.JSON, method="relevance", error=RowError("internal", "x"))
    predicted = RowOutcome(encoding=Encoding.JSON)
    entity = EntityOutcome.__new__(EntityOutcome)
    tagged = TokenOutcome(encoding=Encoding.JSON, method="grad_x_input", entities=[entity, entity])
    step = GenerationStepOutcome.__new__(GenerationStepOutcome)
    written = GenerationOutcome(encoding=Encoding.JSON, method="attnlrp", steps=[step, step, step])
    with tracing.start_request_span({"traceparent": TRACEPARENT}, "request"):
        tracing.record_explanations([classified, failed, predicted, tagged, written])
    tracing.shutdown()
    explained = [span for span in receiver.received() if span.name == "explanation"]
    assert sorted((span.attributes["explain.method"], span.attributes["explain.targets"]) for span in explained) == [
        ("attnlrp", 3),
        ("grad_x_input", 2),
        ("relevance", 1),
    ]


class _Upstream(BaseHTTPRequestHandler):
    """Records the trace headers of what it is sent."""

    protocol_version = "HTTP/1.1"
    seen: ClassVar[list[dict[str, str]]] = []

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.seen.append(tracing.trace_headers(self.headers.items()))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")


class _GrpcUpstream(grpc.GenericRpcHandler):
    """TorchServe's inference service as raw bytes, recording each call's trace metadata."""

    seen: ClassVar[list[dict[str, str]]] = []

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        def answer(request: bytes, context: grpc.ServicerContext) -> bytes:
            self.seen.append(tracing.trace_headers(context.invocation_metadata()))
            return b""

        return grpc.unary_unary_rpc_method_handler(answer)


@pytest.fixture()
def forwarder() -> Iterator[tuple[int, int]]:
    """A forwarder (default policy) in front of a REST and a gRPC stand-in: its (REST, gRPC) ports."""
    _Upstream.seen.clear()
    _GrpcUpstream.seen.clear()
    rest = ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
    threading.Thread(target=rest.serve_forever, daemon=True).start()
    upstream_grpc = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    upstream_grpc.add_generic_rpc_handlers((_GrpcUpstream(),))
    grpc_port = upstream_grpc.add_insecure_port("127.0.0.1:0")
    upstream_grpc.start()
    running = Forwarder(Policy(), "127.0.0.1", 0, 0, rest.server_address[1], grpc_port)
    running.start()
    try:
        yield running.ports
    finally:
        running.stop()
        upstream_grpc.stop(grace=None)
        rest.shutdown()
        rest.server_close()


def _through(ports: tuple[int, int]) -> None:
    """One REST request and one gRPC call through the forwarder, each with the caller's traceparent."""
    connection = http.client.HTTPConnection("127.0.0.1", ports[0], timeout=30)
    connection.request("POST", "/predictions/sentiment", body=json.dumps({"text": "hi"}),
                       headers={"Traceparent": TRACEPARENT, "Tracestate": "vendor=1"})  # fmt: skip
    assert connection.getresponse().status == 200
    connection.close()
    with grpc.insecure_channel(f"127.0.0.1:{ports[1]}") as channel:
        call = channel.unary_unary(f"/{GRPC_INFERENCE_SERVICE}/Predictions")
        call(b"", metadata=[("traceparent", TRACEPARENT)], timeout=30)


def test_the_forwarder_passes_the_callers_trace_on_when_it_does_not_trace(
    forwarder: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    tracing.shutdown()
    _through(forwarder)
    assert _Upstream.seen == [{"traceparent": TRACEPARENT, "tracestate": "vendor=1"}]
    assert _GrpcUpstream.seen == [{"traceparent": TRACEPARENT}]


def test_the_forwarder_continues_the_callers_trace_and_parents_the_upstream_request(
    receiver: OtlpReceiver, forwarder: tuple[int, int]
) -> None:
    _through(forwarder)
    tracing.shutdown()
    spans = receiver.received()
    rest = next(span for span in spans if span.name == "Forwarder POST")
    call = next(span for span in spans if span.name == "Forwarder Predictions")
    for span in (rest, call):
        assert (span.trace_id, span.parent_span_id, span.kind) == (TRACE_ID, CALLER_SPAN, SERVER), span
    assert rest.attributes == {"http.request.method": "POST", "http.response.status_code": 200}
    assert call.attributes == {"rpc.system": "grpc", "rpc.method": "Predictions"}
    assert _Upstream.seen[0]["traceparent"] == f"00-{TRACE_ID}-{rest.span_id}-01"
    assert _Upstream.seen[0]["tracestate"] == "vendor=1"
    assert _GrpcUpstream.seen == [{"traceparent": f"00-{TRACE_ID}-{call.span_id}-01"}]


def test_kserve_span_names_never_carry_request_text() -> None:
    pytest.importorskip("kserve")
    from doors.kserve.kserve_server import route_name

    assert route_name("POST", "/v2/models/sentiment/infer") == "POST /v2/models/{model}/infer"
    assert route_name("POST", "/v1/models/sentiment:explain") == "POST /v1/models/{model}:explain"
    assert route_name("POST", "/v1/chat/completions") == "POST /v1/chat/completions"
    assert route_name("GET", "/secret/text/of/a/caller") == "GET"
