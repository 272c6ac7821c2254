"""The two transports of :class:`~explain_client.client.ExplainClient`: one call's bytes to the service and back.

REST (:class:`RestBackend`) posts the JSON document of docs/SERVING.md to ``/predictions/{model}`` (the ``explain``
field says what to explain, so the route never decides it) over urllib3's pool of kept-alive connections. gRPC
(:class:`GrpcBackend`) calls TorchServe's ``Predictions`` RPC with ``input["request"]`` = a serialized
``ExplainRequest`` (proto/explain.proto) and reads the ``ExplainResponse``; TorchServe answers ``OK`` for a row that
failed, so the row's ``error`` field is turned into the same :class:`~explain_client.results.ServiceError` a REST
caller gets. Transport failures are ``ServiceError``s too (``timeout``, ``unavailable``, ``unauthorized``, …); whether
to try again is the client's decision, not the transport's.

A streamed generation (``"stream": true``) is read as it comes: REST's chunked JSON lines, or the messages of
TorchServe's ``StreamPredictions`` RPC (its JSON document as ``input["body"]``).

Each call tells the service when the client stops waiting: the ``Explain-Deadline-Ms`` header (REST) or
``ExplainRequest.deadline_ms`` (gRPC) holds now + ``timeout`` in Unix milliseconds, so the worker abandons work nobody
waits for (docs/SERVING.md, "Time budgets and deadlines").
"""

from __future__ import annotations

import json
import time
import urllib.parse
from collections.abc import Iterator
from types import TracebackType
from typing import Any, Literal, Protocol

import urllib3
from urllib3.exceptions import ProtocolError

from .auth import refused_token
from .generation import Generation, GenerationCall
from .results import Prediction, ServiceError
from .streams import json_lines
from .wire import Request, prediction_from_protobuf

#: The header a REST call carries its deadline in.
DEADLINE_HEADER = "Explain-Deadline-Ms"
#: TorchServe's server-streaming RPC (not in the client's stubs: called by its full name).
STREAM_PREDICTIONS = "/org.pytorch.serve.grpc.inference.InferenceAPIsService/StreamPredictions"


def deadline_ms(timeout: float) -> int:
    """The Unix time in milliseconds ``timeout`` seconds from now: when the caller stops waiting."""
    return int((time.time() + float(timeout)) * 1000)


DEFAULT_REST_URL = "http://127.0.0.1:8080"
DEFAULT_GRPC_ADDRESS = "127.0.0.1:7070"
#: TorchServe's default max_request_size / max_response_size (bytes).
MAX_MESSAGE_BYTES = 6_553_500

Transport = Literal["rest", "grpc"]


class Backend(Protocol):
    """One transport: sends a :class:`~explain_client.wire.Request` with the current ``token`` (which the client
    replaces when the service renews its keys)."""

    token: str | None

    def call(self, model: str, request: Request, timeout: float) -> Prediction:
        """The prediction for ``request``, or raise its row error or a transport failure as a ``ServiceError``."""
        ...

    def close(self) -> None:
        """Close the connections."""
        ...


_HTTP_CODES = {404: "model_not_found", 413: "request_too_large", 500: "internal", 503: "unavailable"}


class ResendOnDroppedConnection(urllib3.Retry):
    """urllib3's retry rule for the REST pool: send a request once more when its connection broke before an answer
    came back (``ProtocolError``: the server closed a kept-alive connection just as it was reused, a connection
    reset); raise every other failure at once. urllib3 already replaces a pooled connection it can see was closed;
    this covers the moment between that check and the server's close. A timeout, a refused connection or an HTTP
    status is never retried here: whether to try those again is the client's policy
    (:func:`~explain_client.client.is_retryable`)."""

    def increment(
        self,
        method: str | None = None,
        url: str | None = None,
        response: Any = None,
        error: Exception | None = None,
        _pool: Any = None,
        _stacktrace: TracebackType | None = None,
    ) -> ResendOnDroppedConnection:
        """The next retry state for a broken connection; any other ``error`` is raised as it is."""
        if error is not None and not isinstance(error, ProtocolError):
            raise error
        return super().increment(method, url, response, error, _pool, _stacktrace)


#: One resend, of a broken connection only (any method: every call is a pure function of its request).
_RESEND = ResendOnDroppedConnection(
    total=1, connect=0, read=1, other=0, status=0, redirect=False, allowed_methods=None, raise_on_status=False
)


class RestBackend:
    """JSON over HTTP/1.1 with urllib3's connection pool: kept-alive connections reused across calls and threads,
    a pooled connection the server has closed replaced by a new one (:class:`ResendOnDroppedConnection`)."""

    #: Connections kept for reuse; more concurrent calls open more, and close the surplus when they finish.
    MAX_IDLE = 64

    def __init__(self, url: str, token: str | None) -> None:
        """A pool for the service at ``url`` (``http(s)://host[:port][/path]``); no connection is opened yet.

        Raises:
            ValueError: if ``url`` is not such a URL.
        """
        self.url = url.rstrip("/")
        parts = urllib.parse.urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"url must be http(s)://host[:port][/path], got {url!r}")
        self._path = parts.path
        self.pool = urllib3.connection_from_url(self.url, maxsize=self.MAX_IDLE, block=False, retries=_RESEND)
        self.token = token

    def call(self, model: str, request: Request, timeout: float) -> Prediction:
        """POST ``request``'s JSON document to ``/predictions/{model}``; the prediction (see :class:`Backend`)."""
        return Prediction.from_dict(self._exchange(model, request.to_json(), timeout))  # raises a row error

    def generate(self, model: str, call: GenerationCall, timeout: float) -> Generation:
        """POST a generation call's JSON document; the generation (or raise as :meth:`call`)."""
        return Generation.from_dict(self._exchange(model, call.to_json(), timeout))

    def _exchange(self, model: str, document: dict[str, Any], timeout: float) -> dict[str, Any]:
        """POST one JSON document; the answer row's document (which may carry a row ``error``)."""
        body = json.dumps(document).encode("utf-8")
        headers = {"Content-Type": "application/json", DEADLINE_HEADER: str(deadline_ms(timeout))}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        try:
            response = self.pool.urlopen(
                "POST",
                f"{self._path}/predictions/{model}",
                body=body,
                headers=headers,
                timeout=urllib3.Timeout(connect=timeout, read=timeout),
                redirect=False,
            )
        except urllib3.exceptions.NewConnectionError as error:  # refused, unresolvable (a ConnectTimeoutError too)
            raise ServiceError("unavailable", f"cannot reach {self.url}: {error}") from error
        except urllib3.exceptions.TimeoutError as error:
            raise ServiceError("timeout", f"no answer from {self.url} within {timeout:g} s") from error
        except (OSError, urllib3.exceptions.HTTPError) as error:  # incl. MaxRetryError: broken again on the resend
            raise ServiceError("unavailable", f"cannot reach {self.url}: {error}") from error
        status, payload = int(response.status), response.data
        try:
            answer = json.loads(payload)
        except ValueError:
            answer = None
        if isinstance(answer, dict) and ("error" in answer or status == 200):
            return answer
        message = payload.decode("utf-8", "replace")[:500]
        if isinstance(answer, dict) and "message" in answer:
            message = str(answer["message"])
        code = _HTTP_CODES.get(status, f"http_{status}")
        if status in (400, 401) and refused_token(message):
            code = "unauthorized"
        raise ServiceError(code, message, http_status=status)

    def stream(self, model: str, call: GenerationCall, timeout: float) -> Iterator[dict[str, Any]]:
        """POST a generation call with ``"stream": true``; its events (:mod:`explain_client.streams`) as they arrive
        (an error before the first: raised as :meth:`call` raises it)."""
        body = json.dumps({**call.to_json(), "stream": True}).encode("utf-8")
        headers = {"Content-Type": "application/json", DEADLINE_HEADER: str(deadline_ms(timeout))}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        try:
            response = self.pool.urlopen(
                "POST", f"{self._path}/predictions/{model}", body=body, headers=headers,
                timeout=urllib3.Timeout(connect=timeout, read=timeout), redirect=False, preload_content=False,
            )  # fmt: skip
        except urllib3.exceptions.TimeoutError as error:
            raise ServiceError("timeout", f"no answer from {self.url} within {timeout:g} s") from error
        except (OSError, urllib3.exceptions.HTTPError) as error:
            raise ServiceError("unavailable", f"cannot reach {self.url}: {error}") from error
        if response.status != 200:
            payload = response.read()
            response.release_conn()
            try:
                document = json.loads(payload)
            except ValueError:
                document = None
            if isinstance(document, dict) and isinstance(document.get("error"), dict):
                return iter([document])  # the stream's one event: its error
            raise ServiceError(_HTTP_CODES.get(response.status, f"http_{response.status}"),
                               payload.decode("utf-8", "replace")[:500], http_status=response.status)  # fmt: skip
        return self._events(response, timeout)

    def _events(self, response: Any, timeout: float) -> Iterator[dict[str, Any]]:
        try:
            chunks = response.read_chunked() if response.chunked else response.stream()
            yield from json_lines(chunks)
        except urllib3.exceptions.TimeoutError as error:
            raise ServiceError("timeout", f"the stream stopped for {timeout:g} s") from error
        except (OSError, urllib3.exceptions.HTTPError) as error:
            raise ServiceError("unavailable", f"the stream from {self.url} broke: {error}") from error
        finally:
            response.release_conn()

    def close(self) -> None:
        """Close the pooled connections."""
        self.pool.close()


class GrpcBackend:
    """Protobuf ``ExplainRequest`` inside TorchServe's ``Predictions`` RPC (one channel, shared by threads); the
    stubs are the client's own (:mod:`explain_client.protos`)."""

    def __init__(self, address: str, token: str | None) -> None:
        """A channel to ``address`` (``host:port``); gRPC connects on the first call."""
        import grpc

        from .protos import explain_messages, inference_stubs

        self._grpc = grpc
        self.address = address
        self.messages = explain_messages()
        self.inference_pb2, inference_grpc = inference_stubs()
        options = [
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ]
        self.channel = grpc.insecure_channel(address, options=options)
        self.stub = inference_grpc.InferenceAPIsServiceStub(self.channel)
        self.token = token

    def call(self, model: str, request: Request, timeout: float) -> Prediction:
        """Send ``request`` as an ``ExplainRequest``; the prediction (see :class:`Backend`)."""
        return prediction_from_protobuf(
            self._predict(model, request.fill_message(self.messages.ExplainRequest()), timeout)
        )

    def generate(self, model: str, call: GenerationCall, timeout: float) -> Generation:
        """Send a generation call as an ``ExplainRequest``; the generation (or raise as :meth:`call`)."""
        return Generation.from_protobuf(
            self._predict(model, call.fill_message(self.messages.ExplainRequest()), timeout)
        )

    def _predict(self, model: str, message: Any, timeout: float) -> Any:
        """One ``Predictions`` call carrying ``message`` (an ``ExplainRequest``); the ``ExplainResponse``."""
        grpc = self._grpc
        message.deadline_ms = deadline_ms(timeout)
        payload = message.SerializeToString()
        predictions_request = self.inference_pb2.PredictionsRequest(model_name=model, input={"request": payload})
        try:
            metadata = [("authorization", f"Bearer {self.token}")] if self.token else []
            reply = self.stub.Predictions(predictions_request, metadata=metadata, timeout=timeout)
        except grpc.RpcError as error:
            status = error.code()
            details = error.details() or str(status)
            if status == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise ServiceError(
                    "timeout", f"no answer from {self.address} within {timeout:g} s", None, "DEADLINE_EXCEEDED"
                ) from None
            if status == grpc.StatusCode.UNAVAILABLE:
                raise ServiceError(
                    "unavailable", f"cannot reach {self.address}: {details}", None, status.name
                ) from None
            code = "unauthorized" if refused_token(details) else status.name.lower()
            if "not found" in details.lower():
                code = "model_not_found"
            raise ServiceError(code, details, None, status.name) from None
        return self.messages.ExplainResponse.FromString(reply.prediction)

    def stream(self, model: str, call: GenerationCall, timeout: float) -> Iterator[dict[str, Any]]:
        """A generation call's events through TorchServe's ``StreamPredictions`` (its JSON document with
        ``"stream": true`` as ``input["body"]``), each message as it arrives."""
        grpc = self._grpc
        body = json.dumps({**call.to_json(), "stream": True}).encode("utf-8")
        request = self.inference_pb2.PredictionsRequest(model_name=model, input={"body": body})
        metadata = [("authorization", f"Bearer {self.token}")] if self.token else []
        stream = self.channel.unary_stream(
            STREAM_PREDICTIONS,
            request_serializer=self.inference_pb2.PredictionsRequest.SerializeToString,
            response_deserializer=self.inference_pb2.PredictionResponse.FromString,
        )
        try:
            for reply in stream(request, metadata=metadata, timeout=timeout):
                yield from json_lines([reply.prediction])
        except grpc.RpcError as error:
            status = error.code()
            code = "timeout" if status == grpc.StatusCode.DEADLINE_EXCEEDED else status.name.lower()
            raise ServiceError(code, error.details() or str(status), None, status.name) from None

    def close(self) -> None:
        """Close the channel."""
        self.channel.close()
