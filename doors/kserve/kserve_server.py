"""KServe's model server (``kserve.ModelServer``) as this service runs it: REST and gRPC bound to one address
(127.0.0.1 unless ``INFERENCE_ADDRESS`` says otherwise), requests bounded in size, the error table's statuses on
both transports, ``explain`` listed among the server's OIP extensions, an OIP REST body read as every OIP client sends
it (JSON without a ``Content-Type``, the binary data extension, a compressed body: :mod:`doors.kserve.rest_body`), and
the OpenAI API for the generation models (:mod:`doors.kserve.openai_routes`), and every REST answer's
``X-Request-Id`` (:mod:`doors.kserve.request_ids`; an OIP answer's ``id`` is the request's, else that id).

KServe's own server binds REST to 0.0.0.0 and gRPC to ``[::]``, with no way to choose; this module starts the same
REST application and gRPC servicer on the address given instead. Everything else — the routes (OIP v2, v1
``:predict``/``:explain``, health, metadata, ``/metrics`` with KServe's request histograms), the data plane, the
model registry — is KServe's.

Traces (:mod:`serving_core.tracing`, on when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set): each REST request
(:class:`TraceRequests`) and gRPC call (:class:`TraceCalls`) is a span in its caller's trace (``traceparent``
header or metadata); the rows' batch and its stages are traced by the backend (:mod:`doors.kserve.batching`).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import re
from collections.abc import Awaitable, Callable, MutableMapping
from concurrent import futures
from typing import Any

import grpc
from fastapi import Request
from fastapi.responses import JSONResponse
from grpc import aio
from kserve import ModelServer
from kserve.constants.constants import FASTAPI_APP_IMPORT_STRING, INFERENCE_CONTENT_LENGTH_HEADER
from kserve.model_server import app as kserve_app
from kserve.protocol.dataplane import DataPlane
from kserve.protocol.grpc import grpc_predict_v2_pb2_grpc
from kserve.protocol.grpc.interceptors import ExceptionToStatusInterceptor
from kserve.protocol.grpc.server import GRPCServer
from kserve.protocol.grpc.servicer import InferenceServicer
from kserve.protocol.infer_type import InferRequest
from kserve.protocol.rest.server import RESTServer

from serving_core import tracing
from serving_core.errors import RowError

from .generate_routes import add_generate_routes
from .kserve_model import ExplainModel, RequestError, RetryableError
from .oip import EXTENSION
from .openai_routes import add_openai_routes
from .request_ids import RequestIds, oip_request_id
from .rest_body import infer_request_from_body

logger = logging.getLogger(__name__)

#: Largest request body accepted, in bytes, on REST and gRPC (TorchServe's door uses the same bound).
MAX_REQUEST_BYTES = 3_000_000

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class ExplainDataPlane(DataPlane):
    """KServe's data plane, with ``explain`` (this service's OIP extension) in the server metadata, and a raw REST
    body read as every OIP client sends it (:mod:`doors.kserve.rest_body`)."""

    def metadata(self) -> dict[str, Any]:
        """Server metadata: KServe's, plus the ``explain`` extension."""
        document: dict[str, Any] = dict(super().metadata())
        document["extensions"] = [*document.get("extensions", []), EXTENSION]
        return document

    def decode_inference_request(self, body: Any, headers: dict[str, str], model_name: str) -> InferRequest:
        """An OIP ``infer`` request not marked as JSON (``tritonclient`` sends no ``Content-Type``; the binary data
        extension; a compressed body) read by :func:`~doors.kserve.rest_body.infer_request_from_body`, BYTES
        elements of binary inputs kept as bytes; a request FastAPI parsed as JSON: KServe's own reading.

        Raises:
            RequestError: ``invalid_request`` (or ``request_too_large``) for a body that is not such a request.
        """
        if not isinstance(body, bytes):
            request = super().decode_inference_request(body, headers, model_name)
        else:
            try:
                request = infer_request_from_body(body, headers or {}, model_name, MAX_REQUEST_BYTES)
            except RowError as error:
                raise RequestError(error) from None
        request.id = oip_request_id(request.id, headers)  # the answer's id: the OIP id, else the X-Request-Id
        return request


class BodyLimit:
    """ASGI middleware: a request body over ``limit`` bytes gets 413 before the application reads it."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]], limit: int = MAX_REQUEST_BYTES) -> None:
        """Wrap ``app``."""
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Refuse a declared or streamed body over the limit."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await self._refuse(send)
            return
        received = 0

        async def limited() -> MutableMapping[str, Any]:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.limit:
                raise RequestError(_too_large(self.limit))
            return message

        await self.app(scope, limited, send)

    async def _refuse(self, send: Send) -> None:
        response = JSONResponse(RequestError(_too_large(self.limit)).to_dict(), status_code=413)
        await send({"type": "http.response.start", "status": 413, "headers": response.raw_headers})
        await send({"type": "http.response.body", "body": response.body})


#: The REST routes a span is named after (the model's name replaced by ``{model}``); any other path: the method only.
_ROUTES = re.compile(r"/v2/models/[^/]+/infer|/v1/models/[^/:]+:(predict|explain)|/v1/(chat/)?completions")


def route_name(method: str, path: str) -> str:
    """A request span's name: ``POST /v2/models/{model}/infer`` for the inference routes, else the method alone
    (span names never carry request text)."""
    if not _ROUTES.fullmatch(path):
        return method
    return f"{method} {re.sub(r'/models/[^/:]+', '/models/{model}', path)}"


class TraceRequests:
    """ASGI middleware: each HTTP request runs inside its request span
    (:func:`serving_core.tracing.start_request_span`), with the response's status; a no-op while tracing is off."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        """Wrap ``app``."""
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve the request inside its span."""
        if scope["type"] != "http" or not tracing.active():
            await self.app(scope, receive, send)
            return
        method = str(scope.get("method", ""))
        attributes = {"http.request.method": method}
        with tracing.start_request_span(scope.get("headers"), route_name(method, str(scope.get("path", ""))),
                                        attributes) as span:  # fmt: skip

            async def traced_send(message: MutableMapping[str, Any]) -> None:
                if message.get("type") == "http.response.start":
                    span.set_attribute("http.response.status_code", int(message.get("status", 0)))
                await send(message)

            await self.app(scope, receive, traced_send)


class TraceCalls(aio.ServerInterceptor):
    """gRPC interceptor: each unary call runs inside its request span (the caller's ``traceparent`` metadata); a
    no-op while tracing is off."""

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:  # fmt: skip
        """The call's handler, its unary behaviour wrapped in a span."""
        handler = await continuation(details)
        if handler is None or handler.unary_unary is None or not tracing.active():
            return handler
        inner = handler.unary_unary
        method = str(details.method)
        attributes = {"rpc.system": "grpc", "rpc.method": method.rpartition("/")[2]}

        async def traced(request: Any, context: aio.ServicerContext) -> Any:
            with tracing.start_request_span(details.invocation_metadata, method.lstrip("/"), attributes):
                answer = inner(request, context)
                return await answer if inspect.isawaitable(answer) else answer

        return grpc.unary_unary_rpc_method_handler(
            traced, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer
        )


class RawInferBodies:
    """ASGI middleware: an OIP ``infer`` request whose body is not plain JSON — it has the binary data extension's
    ``Inference-Header-Content-Length`` or a ``Content-Encoding`` — reaches the data plane as raw bytes whatever its
    ``Content-Type`` says (FastAPI would otherwise parse a body marked ``application/json`` as JSON and refuse it);
    :meth:`ExplainDataPlane.decode_inference_request` reads it."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        """Wrap ``app``."""
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Drop the ``Content-Type`` of such a request."""
        if scope["type"] == "http" and scope.get("method") == "POST" and str(scope.get("path", "")).endswith("/infer"):
            headers = scope.get("headers") or []
            names = {name.lower() for name, _ in headers}
            if INFERENCE_CONTENT_LENGTH_HEADER.encode() in names or b"content-encoding" in names:
                kept = [(name, value) for name, value in headers if name.lower() != b"content-type"]
                scope = {**scope, "headers": kept}
        await self.app(scope, receive, send)


def _too_large(limit: int) -> RowError:
    return RowError("request_too_large", f"the request body exceeds {limit} bytes; send fewer or smaller rows")


async def _door_error(_: Request, error: Exception) -> JSONResponse:
    """REST answer of a :class:`RequestError` or :class:`RetryableError`: its status and JSON body."""
    assert isinstance(error, RequestError | RetryableError)
    headers = {"Retry-After": "1"} if isinstance(error, RetryableError) else None
    return JSONResponse(error.to_dict(), status_code=error.http_status, headers=headers)


class BoundGRPCServer(GRPCServer):
    """KServe's gRPC server (its servicer and exception-to-status interceptor) on a chosen address."""

    def __init__(self, address: str, port: int, data_plane: DataPlane, server: ModelServer) -> None:
        """Serve ``data_plane`` on ``address:port``."""
        super().__init__(port, data_plane, server.model_repository_extension, kwargs={}, grace_period=5)
        self._address = address

    async def start(self, max_workers: int) -> None:
        """Start serving and wait until stopped."""
        servicer = InferenceServicer(self._data_plane, self._model_repository_extension)
        self._server = aio.server(
            futures.ThreadPoolExecutor(max_workers=max_workers),
            interceptors=(TraceCalls(), ExceptionToStatusInterceptor()),
            options=[
                ("grpc.max_receive_message_length", MAX_REQUEST_BYTES),
                ("grpc.max_send_message_length", 4 * MAX_REQUEST_BYTES),
            ],
        )
        grpc_predict_v2_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, self._server)
        host = f"[{self._address}]" if ":" in self._address else self._address
        self._server.add_insecure_port(f"{host}:{self._port}")
        logger.info("gRPC (OIP) on %s:%d", self._address, self._port)
        await self._server.start()
        await self._server.wait_for_termination()


class ExplainModelServer(ModelServer):
    """``kserve.ModelServer`` bound to ``address`` (see the module docstring)."""

    def __init__(self, address: str, http_port: int, grpc_port: int, max_threads: int = 4) -> None:
        """Create the server (nothing is bound until :meth:`serve`)."""
        super().__init__(http_port=http_port, grpc_port=grpc_port, workers=1, max_threads=max_threads,
                         enable_grpc=True, enable_docs_url=False, enable_latency_logging=False)  # fmt: skip
        self.address = address
        self.dataplane = ExplainDataPlane(model_registry=self.registered_models)

    def serve(self, models: list[ExplainModel]) -> None:
        """Register the loaded models and serve REST and gRPC until SIGTERM/SIGINT."""
        self._register_and_check_atleast_one_model_is_ready(models)
        add_openai_routes(kserve_app, {model.name: model for model in models})
        add_generate_routes(kserve_app, {model.name: model for model in models})
        kserve_app.add_exception_handler(RequestError, _door_error)
        kserve_app.add_exception_handler(RetryableError, _door_error)
        kserve_app.add_middleware(RawInferBodies)
        kserve_app.add_middleware(BodyLimit)
        kserve_app.add_middleware(RequestIds)  # every answer's X-Request-Id (the caller's, or one made)
        kserve_app.add_middleware(TraceRequests)  # outermost: the span covers the body limit's refusals too
        rest = RESTServer(FASTAPI_APP_IMPORT_STRING, self.dataplane, self.model_repository_extension, self.http_port,
                          grace_period=5, timeout_keep_alive=self.timeout_keep_alive)  # fmt: skip
        rest.config.host = self.address
        self._rest_server = rest
        self._grpc_server = BoundGRPCServer(self.address, self.grpc_port, self.dataplane, self)
        self.servers = [rest.start(), self._grpc_server.start(self.max_threads)]
        logger.info("REST (OIP v2, v1) on %s:%d", self.address, self.http_port)
        self.setup_event_loop()
        self.register_signal_handler()
        asyncio.run(self._serve())
