"""A REST and gRPC forwarder in front of TorchServe's inference ports, with a :class:`Policy` that decides, per
request, who may pass, with which token, and to which served model.

Two programs are built on it: the per-pod authenticating proxy (:mod:`deploy.auth_proxy`: a shared secret in, the
pod's own TorchServe key out) and the explanation-pool router (:mod:`doors.torchserve.router`: the client's token
passes unchanged, explanation requests go to the model's explanation pool).

REST: any method and path is forwarded with its body and headers (hop-by-hop ones dropped), over one kept-alive
connection per listener thread; bodies (``Content-Length`` or chunked) over ``max_body`` bytes get 413. A policy may
answer a REST request itself instead (:meth:`Policy.respond`: the router's OpenAI API, which calls the upstream's own
routes through the same :class:`Upstream`). gRPC:
TorchServe's inference service only (``Predictions``, ``Ping``, and ``StreamPredictions`` where the policy forwards it,
each message as it comes), as raw bytes; the other streaming RPCs, management and anything else are UNIMPLEMENTED
(:data:`_STREAMS` says why). REST answers TorchServe streams (chunked) are passed on chunk by chunk as they come.
Status, headers, body, gRPC status and details come back as TorchServe sent them.

Traces (:mod:`serving_core.tracing`): each request is a span in its caller's trace (W3C ``traceparent``) when
tracing is on, and the upstream request carries that span as its parent; when it is off, the caller's
``traceparent``/``tracestate`` pass on unchanged (REST headers and gRPC metadata alike).

Request ids: a REST answer's ``X-Request-Id`` is the caller's valid one (TorchServe echoes its own id over the
handler's). TorchServe drops a gRPC call's metadata, so a ``Predictions``/``StreamPredictions`` call's ``x-request-id``
and trace context are carried in its ``PredictionsRequest``'s input map (:mod:`forwarding.metadata`; a call whose
``x-request-id`` is not a valid id is refused with ``INVALID_ARGUMENT``).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent import futures
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc

from records import InvalidRecordIdError
from records.ids import check_request_id
from serving_core import tracing
from serving_core.recording import REQUEST_ID_HEADER

from .metadata import carry_metadata

logger = logging.getLogger(__name__)

#: Hop-by-hop headers (RFC 9110 §7.6.1) and the ones the forwarder sets itself.
DROPPED_HEADERS = frozenset(
    {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade", "host",
     "authorization", "content-length"}
)  # fmt: skip
#: TorchServe's gRPC inference service: the only one forwarded.
GRPC_INFERENCE_SERVICE = "org.pytorch.serve.grpc.inference.InferenceAPIsService"
#: TorchServe's streaming RPCs, by whether the client streams too. Refused unless the policy forwards them
#: (:attr:`Policy.grpc_streams`, and then only the requests its :meth:`Policy.grpc_stream_request` lets through):
#: TorchServe 0.12 kills the worker (NullPointerException in GRPCJob.response) when a streaming call reaches a handler
#: that does not mark its replies as stream parts, and only a streaming row does (its events).
_STREAMS = {"StreamPredictions": False, "StreamPredictions2": True}
#: The most bytes of a refused request body read and dropped so that its client can read the refusal.
_DISCARD_LIMIT = 64 * 2**20
_STREAM_REFUSAL = "the explanation handlers answer one message per request: call Predictions"
#: The RPCs whose request is a ``PredictionsRequest``: the caller's metadata is carried in its input map.
_CARRIED = frozenset({"Predictions", "StreamPredictions"})


def _refuse_stream(bidirectional: bool) -> grpc.RpcMethodHandler:
    def refuse(request: Any, context: grpc.ServicerContext) -> Iterator[bytes]:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, _STREAM_REFUSAL)
        raise AssertionError("unreachable: abort raises")

    if bidirectional:
        return grpc.stream_stream_rpc_method_handler(refuse)
    return grpc.unary_stream_rpc_method_handler(refuse)


class RefusedError(Exception):
    """A request the policy does not forward: answered with ``status`` (REST) or ``code`` (gRPC) and ``message``."""

    def __init__(self, status: int, code: grpc.StatusCode, message: str) -> None:
        """Say how to answer."""
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Reply:
    """A REST answer a policy gives itself instead of forwarding the request (:meth:`Policy.respond`): its body whole
    (``bytes``), or its chunks as they are made (sent chunked, each as soon as it comes: a stream); ``headers`` are
    sent with it (an ``X-Request-Id``)."""

    status: int
    body: bytes | Iterable[bytes]
    content_type: str = "application/json"
    headers: Mapping[str, str] = field(default_factory=dict)


class Policy:
    """What the forwarder does with each request. The default forwards everything unchanged, token included."""

    #: ``type`` of the forwarder's own JSON error replies (REST).
    name = "Forwarder"

    def authorization(self, presented: str | None) -> str | None:
        """The ``Authorization`` value to send upstream for a request that presented ``presented`` (``None``: send
        none).

        Raises:
            RefusedError: if the request must not be forwarded.
        """
        return presented

    def rest_path(self, path: str, body: bytes) -> str:
        """The upstream path of a REST request to ``path`` with ``body``."""
        return path

    def respond(
        self,
        method: str,
        path: str,
        authorization: str | None,
        body: bytes,
        upstream: Upstream,
        headers: Mapping[str, str] | None = None,
    ) -> Reply | None:
        """Answer a REST request here instead of forwarding it (``None``, the default: forward it).

        Args:
            method: the HTTP method.
            path: the request's path and query.
            authorization: the ``Authorization`` value :meth:`authorization` chose to send upstream.
            body: the request body.
            upstream: the upstream server, for the requests the answer needs (any thread may call it).
            headers: the request's headers as received.
        """
        return None

    def refusal(self, path: str, refused: RefusedError) -> Reply | None:
        """The REST answer to a request to ``path`` the forwarder refused (its token, its body's size), when the
        policy answers that path in a shape of its own (``None``, the default: the forwarder's JSON error)."""
        return None

    #: The server-streaming RPCs forwarded (``StreamPredictions``), each call as :meth:`grpc_stream_request` says;
    #: the others are refused.
    grpc_streams: frozenset[str] = frozenset()

    def grpc_request(self, method: str, request: bytes) -> bytes:
        """The upstream request bytes of a gRPC call of ``method`` (e.g. ``Predictions``)."""
        return request

    def grpc_stream_request(self, method: str, request: bytes) -> bytes:
        """The upstream request bytes of a server-streaming call of ``method`` (one of :attr:`grpc_streams`).

        Raises:
            RefusedError: if the call must not be forwarded (its gRPC code and message are the answer).
        """
        return request


class Upstream:
    """The upstream REST server: one kept-alive HTTP connection per calling thread; a connection the upstream closed
    while idle is reopened once."""

    def __init__(self, address: tuple[str, int], timeout: float) -> None:
        self._address = address
        self._timeout = timeout
        self._local = threading.local()

    def request(self, method: str, path: str, body: bytes | None, headers: Mapping[str, str]) -> tuple[Any, bytes]:
        """Send one request on this thread's connection; returns the ``http.client`` response and its whole body.

        Raises:
            OSError, http.client.HTTPException: if the upstream cannot be reached or answers garbage.
        """
        response, chunks = self.stream(method, path, body, headers)
        return response, b"".join(chunks)

    def stream(
        self, method: str, path: str, body: bytes | None, headers: Mapping[str, str]
    ) -> tuple[Any, Iterator[bytes]]:
        """Send one request on this thread's connection; returns the ``http.client`` response and its body's chunks
        as they arrive (read them on this thread; a body left unread closes the connection).

        Raises:
            OSError, http.client.HTTPException: if the upstream cannot be reached or answers garbage (before its
                body; while it is read, from the chunks).
        """
        for attempt in (0, 1):
            connection = getattr(self._local, "connection", None)
            reused = connection is not None
            if connection is None:
                connection = http.client.HTTPConnection(*self._address, timeout=self._timeout)
                self._local.connection = connection
            try:
                connection.request(method, path, body=body, headers=dict(headers))
                response = connection.getresponse()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                connection.close()
                self._local.connection = None
                if reused and attempt == 0:
                    continue  # the upstream closed the idle connection before reading this request
                raise
            except BaseException:
                connection.close()
                self._local.connection = None
                raise
            return response, self._chunks(connection, response)
        raise AssertionError("unreachable")

    def _chunks(self, connection: http.client.HTTPConnection, response: Any) -> Iterator[bytes]:
        """The response's body as it arrives; the connection is kept for the next request once it is read whole."""
        whole = False
        try:
            while not response.isclosed():
                chunk = response.read1(65536)
                if not chunk:
                    chunk = response.read()  # the end: marks the response read, so the connection takes the next
                if chunk:
                    yield chunk
            whole = True
        finally:
            if not whole or response.will_close:
                connection.close()
                if getattr(self._local, "connection", None) is connection:
                    self._local.connection = None


def _read_chunked(stream: Any, limit: int) -> bytes:
    """A chunked request body (RFC 9112 §7.1; trailers are read and dropped).

    Raises:
        RefusedError: 413 past ``limit`` bytes, 400 for a malformed chunk.
    """
    body = bytearray()
    while True:
        line = stream.readline(1026)
        try:
            size = int(line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise RefusedError(400, grpc.StatusCode.INVALID_ARGUMENT, "malformed chunked body") from None
        if size == 0:
            while stream.readline(65538) not in (b"\r\n", b"\n", b""):
                pass
            return bytes(body)
        if size < 0 or len(body) + size > limit:
            raise RefusedError(413, grpc.StatusCode.RESOURCE_EXHAUSTED, f"request body exceeds {limit} bytes")
        chunk = stream.read(size)
        if len(chunk) != size or stream.readline(3) not in (b"\r\n", b"\n"):
            raise RefusedError(400, grpc.StatusCode.INVALID_ARGUMENT, "malformed chunked body")
        body += chunk


def _upstream_chunks(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """An upstream stream's chunks; one that breaks mid-way ends where it broke (its client sees the stream end)."""
    try:
        yield from chunks
    except (OSError, http.client.HTTPException) as error:
        logger.warning("upstream stream broke: %s", error)


def _rest_handler(policy: Policy, upstream: Upstream, max_body: int) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # The reply goes out in two writes (headers, body): without TCP_NODELAY the body waits for the client's
        # delayed ACK of the headers (~40 ms on Linux).
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: Any) -> None:
            logger.debug("rest %s " + format, self.client_address[0], *args)

        def _reply(self, status: int, message: str) -> None:
            body = json.dumps({"code": status, "type": policy.name, "message": message}).encode()
            self._send(Reply(status, body))

        def _send(self, reply: Reply) -> None:
            self.send_response(reply.status)
            self.send_header("Content-Type", reply.content_type)
            for name, value in reply.headers.items():
                self.send_header(name, value)
            if isinstance(reply.body, bytes):
                self.send_header("Content-Length", str(len(reply.body)))
                self.end_headers()
                self.wfile.write(reply.body)
                return
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self._write_chunks(reply.body)

        def _write_chunks(self, chunks: Iterable[bytes]) -> None:
            """A chunked body, each chunk sent as it comes (a client that went away ends it)."""
            try:
                for chunk in chunks:
                    if chunk:
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                        self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
            except OSError:  # the client went away mid-stream
                self.close_connection = True
            finally:
                close = getattr(chunks, "close", None)
                if callable(close):
                    close()

        def _body(self) -> bytes:
            """The request body, ``Content-Length`` or chunked, at most ``max_body`` bytes."""
            if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                return _read_chunked(self.rfile, max_body)
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                raise RefusedError(400, grpc.StatusCode.INVALID_ARGUMENT, "invalid Content-Length") from None
            if length < 0:
                raise RefusedError(400, grpc.StatusCode.INVALID_ARGUMENT, "invalid Content-Length")
            if length > max_body:
                message = f"request body of {length} bytes exceeds {max_body}"
                raise RefusedError(413, grpc.StatusCode.RESOURCE_EXHAUSTED, message)
            return self.rfile.read(length) if length else b""

        def _discard_body(self) -> None:
            """After a refusal of a ``Content-Length`` body: read what the client is still sending (at most
            :data:`_DISCARD_LIMIT` bytes, 10 s), so that it can finish and read the reply instead of a broken pipe."""
            try:
                left = min(int(self.headers.get("Content-Length") or 0), _DISCARD_LIMIT)
            except ValueError:
                return
            if left <= 0 or "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                return
            self.connection.settimeout(10)
            with contextlib.suppress(OSError):
                while left > 0:
                    chunk = self.rfile.read(min(left, 65536))
                    if not chunk:
                        break
                    left -= len(chunk)

        def _forward(self) -> None:
            attributes = {"http.request.method": self.command}
            with tracing.start_request_span(self.headers.items(), f"{policy.name} {self.command}", attributes) as span:
                status = self._forward_traced()
                span.set_attribute("http.response.status_code", status)

        def _forward_traced(self) -> int:
            """Forward (or answer, or refuse) the request; returns the status answered."""
            try:
                authorization = policy.authorization(self.headers.get("Authorization"))
                body = self._body()
            except RefusedError as refused:
                self.close_connection = True
                own = policy.refusal(self.path, refused)
                if own is not None:
                    self._send(own)
                else:
                    self._reply(refused.status, refused.message)
                self._discard_body()
                return own.status if own is not None else refused.status
            reply = policy.respond(self.command, self.path, authorization, body, upstream, dict(self.headers.items()))
            if reply is not None:
                self._send(reply)
                return reply.status
            headers = {
                name: value
                for name, value in self.headers.items()
                if name.lower() not in DROPPED_HEADERS and name.lower() not in tracing.PROPAGATED
            }
            headers.update(tracing.outgoing_headers(self.headers.items()))
            if authorization is not None:
                headers["Authorization"] = authorization
            try:
                response, chunks = upstream.stream(
                    self.command, policy.rest_path(self.path, body), body or None, headers
                )
                payload = None if response.chunked else b"".join(chunks)
            except (OSError, http.client.HTTPException, ValueError) as error:
                logger.warning("upstream failed: %s", error)
                self._reply(503, "the model server is not reachable yet; retry")
                return 503
            self.send_response(response.status, response.reason)
            given = _valid_id(self.headers.get(REQUEST_ID_HEADER))
            for name, value in response.getheaders():
                if name.lower() == REQUEST_ID_HEADER.lower() and given:
                    value = given  # TorchServe echoes its own id: the caller's is the one its record has
                if name.lower() not in DROPPED_HEADERS:
                    self.send_header(name, value)
            if payload is not None:
                self.send_header("Content-Length", str(len(payload)))
            else:  # a stream (TorchServe's chunked answer): each chunk passed on as it comes
                self.send_header("Transfer-Encoding", "chunked")
            if response.will_close:  # TorchServe closes after an error reply: so does the forwarder, as it would
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            if payload is not None:
                self.wfile.write(payload)
            else:
                self._write_chunks(_upstream_chunks(chunks))
            return int(response.status)

        do_GET = do_POST = do_PUT = do_DELETE = do_OPTIONS = _forward  # noqa: N815 - http.server's naming

    return Handler


def _valid_id(value: str | None) -> str | None:
    """A caller's ``X-Request-Id`` when it is a valid id (the one its answer and record carry), else None (the
    handler refuses it and answers under TorchServe's own id, the one TorchServe echoes)."""
    if not value:
        return None
    try:
        return check_request_id(value.strip())
    except InvalidRecordIdError:
        return None


class _GrpcForwarder(grpc.GenericRpcHandler):
    """Forwards TorchServe's inference RPCs as raw bytes, as the policy says."""

    def __init__(self, policy: Policy, channel: grpc.Channel) -> None:
        self._policy = policy
        self._channel = channel

    def _metadata(self, context: grpc.ServicerContext) -> list[tuple[str, str]]:
        """The upstream call's metadata: the policy's token and the trace context."""
        incoming = dict(context.invocation_metadata())
        presented = incoming.get("authorization")
        try:
            authorization = self._policy.authorization(None if presented is None else str(presented))
        except RefusedError as refused:
            context.abort(refused.code, refused.message)
        traced = list(tracing.outgoing_headers(incoming).items())
        return [("authorization", authorization), *traced] if authorization is not None else traced

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        method = str(handler_call_details.method)
        service, _, name = method.lstrip("/").rpartition("/")
        if service != GRPC_INFERENCE_SERVICE:
            return None  # UNIMPLEMENTED: management and anything else stay closed
        if name in _STREAMS and (_STREAMS[name] or name not in self._policy.grpc_streams):
            return _refuse_stream(_STREAMS[name])
        if name in _STREAMS:
            return grpc.unary_stream_rpc_method_handler(self._streaming(method, name))
        upstream_unary: Callable[..., bytes] = self._channel.unary_unary(method)

        def unary(request: bytes, context: grpc.ServicerContext) -> bytes:
            attributes = {"rpc.system": "grpc", "rpc.method": name}
            with tracing.start_request_span(context.invocation_metadata(), f"{self._policy.name} {name}", attributes):
                metadata = self._metadata(context)
                forwarded = self._forwarded(name, request, context)
                try:
                    return upstream_unary(forwarded, metadata=metadata, timeout=context.time_remaining())
                except grpc.RpcError as error:
                    context.abort(error.code(), error.details() or "")
                    raise  # unreachable: abort raises

        return grpc.unary_unary_rpc_method_handler(unary)

    def _forwarded(self, name: str, request: bytes, context: grpc.ServicerContext) -> bytes:
        """The policy's upstream request, carrying the call's ``x-request-id`` and trace context in its input map
        (:func:`forwarding.metadata.carry_metadata`); the policy's refusal, or an ``x-request-id`` that is not a valid
        id, aborts the call."""
        try:
            if name in _STREAMS:
                forwarded = self._policy.grpc_stream_request(name, request)
            else:
                forwarded = self._policy.grpc_request(name, request)
        except RefusedError as refused:
            context.abort(refused.code, refused.message)
            raise  # unreachable: abort raises
        if name not in _CARRIED:
            return forwarded
        try:
            return carry_metadata(forwarded, context.invocation_metadata())
        except InvalidRecordIdError as error:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
            raise  # unreachable: abort raises

    def _streaming(self, method: str, name: str) -> Callable[[bytes, grpc.ServicerContext], Iterator[bytes]]:
        """A server-streaming RPC forwarded message by message, each as it comes."""
        upstream_stream: Callable[..., Iterator[bytes]] = self._channel.unary_stream(method)

        def stream(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
            metadata = self._metadata(context)
            forwarded = self._forwarded(name, request, context)
            try:
                yield from upstream_stream(forwarded, metadata=metadata, timeout=context.time_remaining())
            except grpc.RpcError as error:
                context.abort(error.code(), error.details() or "")

        return stream


class Forwarder:
    """The REST and gRPC listeners, forwarding to TorchServe's inference ports on 127.0.0.1."""

    def __init__(
        self,
        policy: Policy,
        listen: str,
        rest_port: int,
        grpc_port: int,
        upstream_rest_port: int,
        upstream_grpc_port: int,
        max_body: int = 3_100_000,
    ) -> None:
        """Bind both listeners (``rest_port``/``grpc_port`` 0 = any free port; see :attr:`ports`)."""
        upstream = Upstream(("127.0.0.1", upstream_rest_port), timeout=300)
        self._http = ThreadingHTTPServer((listen, rest_port), _rest_handler(policy, upstream, max_body))
        self._http.daemon_threads = True
        options = [("grpc.max_receive_message_length", max_body), ("grpc.max_send_message_length", 64 * 2**20)]
        self._channel = grpc.insecure_channel(f"127.0.0.1:{upstream_grpc_port}", options=options)
        self._grpc = grpc.server(futures.ThreadPoolExecutor(max_workers=64), options=options)
        self._grpc.add_generic_rpc_handlers((_GrpcForwarder(policy, self._channel),))
        bound = self._grpc.add_insecure_port(f"{listen}:{grpc_port}")
        if bound == 0:
            raise OSError(f"cannot bind gRPC {listen}:{grpc_port}")
        self.ports = (int(self._http.server_address[1]), bound)
        self._thread = threading.Thread(target=self._http.serve_forever, name="rest-forwarder", daemon=True)

    def start(self) -> None:
        """Start serving in background threads."""
        self._grpc.start()
        self._thread.start()

    def stop(self) -> None:
        """Stop both listeners (in-flight gRPC calls get 5 s)."""
        self._http.shutdown()
        self._http.server_close()
        self._grpc.stop(grace=5).wait()
        self._channel.close()


def serve_until_signalled(forwarder: Forwarder) -> None:
    """Start ``forwarder``, wait for SIGTERM or SIGINT, stop it (the programs' main loop)."""
    import signal

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    forwarder.start()
    stop.wait()
    forwarder.stop()
