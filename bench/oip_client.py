"""A small Open Inference Protocol client for the doors' tests and benchmarks: REST over one kept-alive HTTP/1.1
connection, gRPC over plain ``grpcio`` with the OIP's ``GRPCInferenceService`` stubs (the ones the ``kserve`` wheel
ships, generated from the OIP's ``grpc_predict_v2.proto``). It sends typed tensors and returns each output as
``(shape, flat data)``; an error answer raises :class:`OipCallError` with the HTTP status or gRPC code.

docs/SERVING.md shows the same calls with KServe's own ``InferenceRESTClient`` / ``InferenceGRPCClient``.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

Outputs = dict[str, tuple[list[int], list[Any]]]


class OipCallError(Exception):
    """An error answer: ``status`` is the HTTP status (REST) or the gRPC code's name (gRPC)."""

    def __init__(self, status: int | str, message: str) -> None:
        """Create the error."""
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message

    @property
    def retryable(self) -> bool:
        """Whether the request may succeed if sent again (503 / ``UNAVAILABLE``, or no connection)."""
        return self.status in (503, "UNAVAILABLE", 0)


@dataclass(frozen=True)
class Input:
    """One input tensor: ``data`` flat, ``shape`` defaults to ``[len(data)]``."""

    name: str
    datatype: str
    data: Sequence[Any]
    shape: Sequence[int] | None = None

    @property
    def dims(self) -> list[int]:
        """The shape."""
        return list(self.shape) if self.shape is not None else [len(self.data)]


class RestOip:
    """OIP v2 over REST JSON (one connection; not shared between threads)."""

    def __init__(self, host: str, port: int, timeout: float = 120.0) -> None:
        """Connect lazily to ``host:port``."""
        self.host, self.port, self.timeout = host, port, timeout
        self._connection: http.client.HTTPConnection | None = None

    def request(
        self, method: str, path: str, body: Any = None, extra_headers: Mapping[str, str] | None = None
    ) -> tuple[int, Any]:
        """Send a JSON request (with ``extra_headers``); returns (status, parsed JSON body)."""
        if self._connection is None:
            self._connection = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        payload = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if payload is not None else {}
        headers.update(extra_headers or {})
        try:
            self._connection.request(method, path, payload, headers)
            response = self._connection.getresponse()
            raw = response.read()
        except (OSError, http.client.HTTPException) as error:
            self.close()
            raise OipCallError(0, f"no answer: {error}") from error
        try:
            return response.status, json.loads(raw) if raw else None
        except ValueError:
            return response.status, raw.decode(errors="replace")

    def infer(
        self,
        model: str,
        inputs: Sequence[Input],
        parameters: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Outputs:
        """``POST /v2/models/<model>/infer`` (with ``headers``, e.g. ``Explain-Deadline-Ms``).

        Raises:
            OipCallError: on a non-200 answer.
        """
        body: dict[str, Any] = {
            "inputs": [{"name": i.name, "datatype": i.datatype, "shape": i.dims, "data": list(i.data)} for i in inputs]
        }
        if parameters:
            body["parameters"] = dict(parameters)
        status, answer = self.request("POST", f"/v2/models/{model}/infer", body, headers)
        if status != 200:
            message = answer.get("error", answer) if isinstance(answer, dict) else answer
            raise OipCallError(status, str(message))
        return {o["name"]: (list(o["shape"]), list(o["data"])) for o in answer["outputs"]}

    def close(self) -> None:
        """Close the connection."""
        if self._connection is not None:
            self._connection.close()
            self._connection = None


_CONTENTS = {"BYTES": "bytes_contents", "FP32": "fp32_contents", "FP64": "fp64_contents", "INT64": "int64_contents",
             "INT32": "int_contents", "BOOL": "bool_contents"}  # fmt: skip


class GrpcOip:
    """OIP v2 over gRPC (``inference.GRPCInferenceService``; thread-safe)."""

    def __init__(self, target: str, timeout: float = 120.0) -> None:
        """Open a channel to ``target`` (``host:port``)."""
        from kserve.protocol.grpc import grpc_predict_v2_pb2, grpc_predict_v2_pb2_grpc

        self.pb = grpc_predict_v2_pb2
        self.channel = grpc.insecure_channel(target)
        self.stub = grpc_predict_v2_pb2_grpc.GRPCInferenceServiceStub(self.channel)
        self.timeout = timeout

    def _parameter(self, value: Any) -> Any:
        if isinstance(value, bool):
            return self.pb.InferParameter(bool_param=value)
        if isinstance(value, int):
            return self.pb.InferParameter(int64_param=value)
        if isinstance(value, float):
            return self.pb.InferParameter(double_param=value)
        return self.pb.InferParameter(string_param=str(value))

    def infer(
        self,
        model: str,
        inputs: Sequence[Input],
        parameters: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Outputs:
        """``ModelInfer`` (``headers`` sent as metadata, e.g. ``explain-deadline-ms``).

        Raises:
            OipCallError: on a non-OK status.
        """
        tensors = []
        for item in inputs:
            data = (
                [v.encode() if isinstance(v, str) else v for v in item.data] if item.datatype == "BYTES" else item.data
            )
            contents = self.pb.InferTensorContents(**{_CONTENTS[item.datatype]: data})
            tensors.append(self.pb.ModelInferRequest.InferInputTensor(
                name=item.name, datatype=item.datatype, shape=item.dims, contents=contents))  # fmt: skip
        request = self.pb.ModelInferRequest(
            model_name=model, inputs=tensors,
            parameters={key: self._parameter(value) for key, value in (parameters or {}).items()},
        )  # fmt: skip
        try:
            metadata = [(key.lower(), value) for key, value in (headers or {}).items()]
            reply = self.stub.ModelInfer(request, timeout=self.timeout, metadata=metadata)
        except grpc.RpcError as error:
            raise OipCallError(error.code().name, str(error.details())) from error
        outputs: Outputs = {}
        for output in reply.outputs:
            values = list(getattr(output.contents, _CONTENTS[output.datatype]))
            if output.datatype == "BYTES":
                values = [bytes(v).decode("utf-8") for v in values]
            outputs[output.name] = (list(output.shape), values)
        return outputs

    def close(self) -> None:
        """Close the channel."""
        self.channel.close()
