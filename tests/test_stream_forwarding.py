"""Streams through the forwarder (forwarding/forwarder.py) and the router's gRPC policy, against stand-ins on
loopback: an upstream's chunked answer reaches the client chunk by chunk (the client reads the first chunk before the
upstream has written the last: the upstream waits for the client to have read it), a policy's own streamed reply
likewise, the upstream connection is kept for the next request after a stream; a gRPC ``StreamPredictions`` call is
forwarded message by message where the policy allows it and refused with its code where not; the router lets
through only streaming generation requests."""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Iterator, Mapping
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import grpc
import pytest

from doors.torchserve.router import PoolRouter
from explain_client.protos import inference_stubs
from forwarding import Forwarder, Policy, RefusedError, Reply, Upstream

STREAM = "/org.pytorch.serve.grpc.inference.InferenceAPIsService/StreamPredictions"


class _Chunked(BaseHTTPRequestHandler):
    """``/stream``: three chunks, the last once :attr:`release` is set; anything else: a plain answer."""

    protocol_version = "HTTP/1.1"
    release: ClassVar[threading.Event] = threading.Event()
    ports: ClassVar[list[int]] = []

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.ports.append(self.client_address[1])
        if self.path != "/stream":
            payload = b'{"plain": true}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/jsonl")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for index, line in enumerate([b'{"n": 0}\n', b'{"n": 1}\n', b'{"n": 2}\n']):
            if index == 2:
                assert self.release.wait(10), "the client never read the first chunks"
            self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")


class _Own(Policy):
    """Answers ``/own`` itself with a streamed reply (two chunks, the second once released)."""

    released = threading.Event()

    def respond(
        self,
        method: str,
        path: str,
        authorization: str | None,
        body: bytes,
        upstream: Upstream,
        headers: Mapping[str, str] | None = None,
    ) -> Reply | None:
        if path != "/own":
            return None

        def chunks() -> Iterator[bytes]:
            yield b"data: first\n\n"
            assert self.released.wait(10)
            yield b"data: second\n\n"

        return Reply(200, chunks(), "text/event-stream")


@pytest.fixture()
def forwarder() -> Iterator[int]:
    upstream = ThreadingHTTPServer(("127.0.0.1", 0), _Chunked)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    running = Forwarder(_Own(), "127.0.0.1", 0, 0, upstream.server_address[1], 1)
    running.start()
    _Chunked.release.clear()
    _Chunked.ports.clear()
    _Own.released.clear()
    try:
        yield running.ports[0]
    finally:
        running.stop()
        upstream.shutdown()
        upstream.server_close()


def test_an_upstream_stream_is_passed_on_chunk_by_chunk(forwarder: int) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", forwarder, timeout=10)
    connection.request("POST", "/stream", body=b"{}")
    response = connection.getresponse()
    assert response.status == 200 and response.getheader("Transfer-Encoding") == "chunked"
    assert response.getheader("Content-Type") == "application/jsonl"
    first = response.readline()
    assert json.loads(first) == {"n": 0}  # read while the upstream still holds its last chunk back
    assert json.loads(response.readline()) == {"n": 1}
    _Chunked.release.set()
    assert json.loads(response.read()) == {"n": 2}
    connection.request("POST", "/plain", body=b"{}")
    assert json.loads(connection.getresponse().read()) == {"plain": True}
    assert len(set(_Chunked.ports)) == 1  # the upstream connection was kept after the stream


def test_a_policy_streams_its_own_reply(forwarder: int) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", forwarder, timeout=10)
    connection.request("POST", "/own", body=b"{}")
    response = connection.getresponse()
    assert response.getheader("Content-Type") == "text/event-stream"
    assert response.readline() == b"data: first\n"
    _Own.released.set()
    assert response.read() == b"\ndata: second\n\n"


class _Streams(Policy):
    grpc_streams = frozenset({"StreamPredictions"})

    def grpc_stream_request(self, method: str, request: bytes) -> bytes:
        if request == b"refuse":
            raise RefusedError(400, grpc.StatusCode.INVALID_ARGUMENT, "not a stream")
        return request


def _echo_stream(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
    for index in range(3):
        yield request + b"-%d" % index


class _Upstream(grpc.GenericRpcHandler):
    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        if handler_call_details.method == STREAM:
            return grpc.unary_stream_rpc_method_handler(_echo_stream)
        return None


def _grpc_forwarder(policy: Policy) -> tuple[Forwarder, grpc.Server]:
    upstream = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    upstream.add_generic_rpc_handlers((_Upstream(),))
    port = upstream.add_insecure_port("127.0.0.1:0")
    upstream.start()
    running = Forwarder(policy, "127.0.0.1", 0, 0, 1, port)
    running.start()
    return running, upstream


@pytest.mark.parametrize("policy", [_Streams(), Policy()], ids=["forwarded", "refused"])
def test_stream_predictions_is_forwarded_where_the_policy_allows_it(policy: Policy) -> None:
    running, upstream = _grpc_forwarder(policy)
    channel = grpc.insecure_channel(f"127.0.0.1:{running.ports[1]}")
    try:
        call = channel.unary_stream(STREAM)
        if policy.grpc_streams:
            assert list(call(b"hi", timeout=10)) == [b"hi-0", b"hi-1", b"hi-2"]
            with pytest.raises(grpc.RpcError) as refused:
                list(call(b"refuse", timeout=10))
            assert (
                refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and refused.value.details() == "not a stream"
            )
        else:
            with pytest.raises(grpc.RpcError) as refused:
                list(call(b"hi", timeout=10))
            assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        channel.close()
        running.stop()
        upstream.stop(None)


def test_the_router_streams_generation_requests_that_ask_for_a_stream_only() -> None:
    router = PoolRouter([], generation=["writer"])
    messages, _ = inference_stubs()

    def request(model: str, document: dict[str, Any], key: str = "body") -> bytes:
        return bytes(
            messages.PredictionsRequest(
                model_name=model, input={key: json.dumps(document).encode()}
            ).SerializeToString()
        )

    streaming = request("writer", {"prompt": "hi", "stream": True})
    assert router.grpc_stream_request("StreamPredictions", streaming) == streaming
    assert router.grpc_stream_request("StreamPredictions", request("writer", {"stream": True}, "data"))
    for refused in (request("writer", {"prompt": "hi"}), request("sentiment", {"text": "hi", "stream": True}),
                    request("writer", {"prompt": "hi", "stream": "yes"}), b"\xff\xff"):  # fmt: skip
        with pytest.raises(RefusedError) as raised:
            router.grpc_stream_request("StreamPredictions", refused)
        assert raised.value.code == grpc.StatusCode.INVALID_ARGUMENT
