"""The KServe door's reading of an OIP REST body (doors/kserve/rest_body.py) and its writing of outputs
(doors/kserve/kserve_model.py ``infer_output``), without a server: bodies as NVIDIA's ``tritonclient.http`` encodes
them (JSON without a ``Content-Type``, the binary data extension, gzip and deflate) read into the same request as
their JSON form, BYTES elements of binary inputs kept as bytes (a PNG file is not text), malformed bodies refused
with ``invalid_request``, and answers in JSON, in the binary extension and as gRPC raw contents read back by
``tritonclient``'s own response parser."""

from __future__ import annotations

import gzip
import json
import struct
import zlib
from typing import Any

import numpy as np
import pytest

from tests.doors_support import EXTRAS
from tests.serving_support import png_bytes

pytestmark = EXTRAS

PNG = png_bytes(seed=1)
LIMIT = 3_000_000


def _inputs(binary: bool) -> list[Any]:
    import tritonclient.http as httpclient

    image = httpclient.InferInput("image", [2], "BYTES")
    image.set_data_from_numpy(np.array([PNG, "héllo".encode()], dtype=np.object_), binary_data=binary)
    target = httpclient.InferInput("explain_target", [2], "INT64")
    target.set_data_from_numpy(np.array([1, -1], dtype=np.int64), binary_data=binary)
    scale = httpclient.InferInput("explain_option_stdev", [2], "FP64")
    scale.set_data_from_numpy(np.array([0.25, -1.0]), binary_data=binary)
    return [image, target, scale]


def _read(body: bytes, headers: dict[str, str]) -> Any:
    from doors.kserve.kserve_model import to_oip_request
    from doors.kserve.rest_body import infer_request_from_body

    return to_oip_request(infer_request_from_body(body, headers, "digits", LIMIT))


def _binary_body() -> tuple[bytes, int]:
    import tritonclient.http as httpclient

    body, json_size = httpclient.InferenceServerClient.generate_request_body(
        _inputs(binary=True), parameters={"explain_method": "attention"}
    )
    assert json_size is not None
    return body, json_size


def test_binary_inputs_keep_bytes_as_bytes() -> None:
    body, json_size = _binary_body()
    request = _read(body, {"inference-header-content-length": str(json_size)})
    assert request.inputs["image"].data == [PNG, "héllo".encode()]
    assert request.inputs["explain_target"].data == [1, -1]
    assert request.inputs["explain_option_stdev"].data == [0.25, -1.0]
    assert request.inputs["image"].shape == (2,)
    assert request.parameters == {"explain_method": "attention", "binary_data_output": True}


def test_json_without_content_type_is_read_as_the_json_request() -> None:
    import tritonclient.http as httpclient
    from kserve.protocol.infer_type import InferRequest
    from kserve.protocol.rest.v2_datamodels import InferenceRequest

    from doors.kserve.kserve_model import to_oip_request

    text = httpclient.InferInput("text", [1], "BYTES")
    text.set_data_from_numpy(np.array(["the staff were lovely"], dtype=np.object_), binary_data=False)
    body, json_size = httpclient.InferenceServerClient.generate_request_body(
        [text], outputs=[httpclient.InferRequestedOutput("label", binary_data=False)]
    )
    assert json_size is None
    as_json = InferRequest.from_inference_request(InferenceRequest.model_validate(json.loads(body)), "sentiment")
    assert _read(body, {}) == to_oip_request(as_json)
    assert _read(body, {}).inputs["text"].data == ["the staff were lovely"]


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_compressed_bodies_are_read_as_the_plain_ones(encoding: str) -> None:
    body, json_size = _binary_body()
    packed = gzip.compress(body) if encoding == "gzip" else zlib.compress(body)
    headers = {"inference-header-content-length": str(json_size), "content-encoding": encoding}
    assert _read(packed, headers) == _read(body, {"inference-header-content-length": str(json_size)})


def _header(inputs: list[dict[str, Any]]) -> bytes:
    return json.dumps({"inputs": inputs}).encode()


def _element(data: bytes) -> bytes:
    return struct.pack("<I", len(data)) + data


TEXT_INPUT = {"name": "text", "shape": [1], "datatype": "BYTES"}
INT64_INPUT = {"name": "t", "shape": [1], "datatype": "INT64", "parameters": {"binary_data_size": 3}}
INT128_INPUT = {"name": "t", "shape": [1], "datatype": "INT128", "parameters": {"binary_data_size": 0}}
TOO_LARGE = gzip.compress(b" " * (LIMIT + 1))
MALFORMED = [
    ("not JSON", b"{not json", {}, "invalid_request"),
    ("not an object", b"[1, 2]", {}, "invalid_request"),
    ("not a request", b'{"inputs": [{"name": "text"}]}', {}, "invalid_request"),
    ("header past the body", _header([]), {"inference-header-content-length": "999"}, "invalid_request"),
    ("header not a length", _header([]), {"inference-header-content-length": "ten"}, "invalid_request"),
    ("no data and no size", _header([TEXT_INPUT]), "header", "invalid_request"),
    ("size past the end", _header([{**TEXT_INPUT, "parameters": {"binary_data_size": 50}}]) + _element(b"hi"),
     "header", "invalid_request"),
    ("bytes left over", _header([{**TEXT_INPUT, "parameters": {"binary_data_size": 6}}]) + _element(b"hi") + b"x",
     "header", "invalid_request"),
    ("element cut short", _header([{**TEXT_INPUT, "parameters": {"binary_data_size": 6}}]) + struct.pack("<I", 9)
     + b"hi", "header", "invalid_request"),
    ("length cut short", _header([{**TEXT_INPUT, "parameters": {"binary_data_size": 2}}]) + b"\x01\x00",
     "header", "invalid_request"),
    ("not whole INT64s", _header([INT64_INPUT]) + b"abc", "header", "invalid_request"),
    ("unknown datatype", _header([INT128_INPUT]), "header", "invalid_request"),
    ("unknown encoding", b"{}", {"content-encoding": "br"}, "invalid_request"),
    ("corrupt gzip", b"\x1f\x8b not gzip", {"content-encoding": "gzip"}, "invalid_request"),
    ("truncated gzip", gzip.compress(b'{"inputs": []}')[:-12], {"content-encoding": "gzip"}, "invalid_request"),
    ("over the limit once inflated", TOO_LARGE, {"content-encoding": "gzip"}, "request_too_large"),
]  # fmt: skip


@pytest.mark.parametrize(("body", "headers", "code"), [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED])
def test_malformed_bodies_are_refused(body: bytes, headers: Any, code: str) -> None:
    from doors.kserve.rest_body import infer_request_from_body
    from serving_core.errors import RowError

    if headers == "header":  # the JSON header is everything up to the binary data
        headers = {"inference-header-content-length": str(body.index(b"}]}") + 3)}
    with pytest.raises(RowError) as refused:
        infer_request_from_body(body, headers, "sentiment", LIMIT)
    assert refused.value.code == code, refused.value.message


def _outputs() -> list[Any]:
    from doors.kserve import oip

    return [
        oip.Tensor("label", "BYTES", (2,), ["positive", "négatif"]),
        oip.Tensor("label_id", "INT64", (2,), [2, 0]),
        oip.Tensor("probabilities", "FP32", (2, 2), [0.125, 0.875, 0.5, 0.5]),
        oip.Tensor("predicted", "BOOL", (2, 2), [False, True, True, False]),
        oip.Tensor("tokens", "BYTES", (2, 0), []),
        oip.Tensor("explain_option_stdev", "FP64", (2,), [0.25, -1.0]),
    ]


EXPECTED = {
    "label": [["positive", "négatif"]],
    "label_id": [[2, 0]],
    "probabilities": [[0.125, 0.875, 0.5, 0.5]],
    "predicted": [[False, True, True, False]],
    "tokens": [[]],
    "explain_option_stdev": [[0.25, -1.0]],
}


def _values(array: np.ndarray) -> list[Any]:
    return [v.decode() if isinstance(v, bytes) else v for v in array.reshape(-1).tolist()]


def test_binary_outputs_are_read_back_by_tritonclient() -> None:
    import tritonclient.http as httpclient

    from doors.kserve.kserve_model import to_infer_response
    from doors.kserve.rest_body import infer_request_from_body

    body, json_size = _binary_body()
    request = infer_request_from_body(body, {"inference-header-content-length": str(json_size)}, "digits", LIMIT)
    raw, header_length = to_infer_response("digits", request, _outputs()).to_rest()
    assert isinstance(raw, bytes) and header_length is not None
    result = httpclient.InferenceServerClient.parse_response_body(raw, header_length=header_length)
    described = result.get_response()["outputs"]
    assert all("data" not in o and "binary_data_size" in o["parameters"] for o in described)
    assert {o["name"]: [_values(result.as_numpy(o["name"]))] for o in described} == EXPECTED
    assert result.as_numpy("tokens").shape == (2, 0)


def test_json_outputs_are_unchanged() -> None:
    """A JSON request's answer: every output's ``data`` as the list it always was."""
    from kserve.protocol.infer_type import InferInput, InferRequest

    from doors.kserve.kserve_model import to_infer_response

    request = InferRequest("sentiment", [InferInput("text", [1], "BYTES", data=["hi"])])
    document, header_length = to_infer_response("sentiment", request, _outputs()).to_rest()
    assert header_length is None and isinstance(document, dict)
    assert {o["name"]: [o["data"]] for o in document["outputs"]} == EXPECTED
    assert [o["shape"] for o in document["outputs"]] == [[2], [2], [2, 2], [2, 2], [2, 0], [2]]


def test_grpc_outputs_are_raw_for_raw_inputs_and_typed_otherwise() -> None:
    from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb
    from kserve.protocol.infer_type import InferRequest

    from doors.kserve.kserve_model import to_infer_response

    tensor = pb.ModelInferRequest.InferInputTensor(name="text", datatype="BYTES", shape=[1])
    raw = InferRequest.from_grpc(
        pb.ModelInferRequest(model_name="m", inputs=[tensor], raw_input_contents=[_element(b"hi")])
    )
    reply = to_infer_response("m", raw, _outputs()).to_grpc()
    assert len(reply.raw_output_contents) == len(reply.outputs) == 6  # one entry per output, the empty one included
    assert reply.raw_output_contents[0] == _element(b"positive") + _element("négatif".encode())
    assert np.frombuffer(reply.raw_output_contents[2], dtype=np.float32).tolist() == [0.125, 0.875, 0.5, 0.5]
    assert reply.raw_output_contents[4] == b""
    typed = pb.ModelInferRequest.InferInputTensor(
        name="text", datatype="BYTES", shape=[1], contents=pb.InferTensorContents(bytes_contents=[b"hi"])
    )
    reply = to_infer_response(
        "m", InferRequest.from_grpc(pb.ModelInferRequest(model_name="m", inputs=[typed])), _outputs()
    ).to_grpc()
    assert not reply.raw_output_contents
    assert list(reply.outputs[0].contents.bytes_contents) == [b"positive", "négatif".encode()]
    assert list(reply.outputs[3].contents.bool_contents) == [False, True, True, False]
