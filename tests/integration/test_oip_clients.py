"""Any OIP client: NVIDIA's ``tritonclient`` (the most used one) against the KServe door, for every task (text,
sentence pairs, multi-label and regression heads, images as PNG and JPEG files, token classification, generation),
in every mode it has — HTTP in JSON mode (no ``Content-Type``; JSON data both ways), HTTP with the binary data
extension (BYTES inputs as raw bytes; every output in the binary tail after ``Inference-Header-Content-Length``), the
same gzip-compressed, and gRPC (raw contents; in a process of its own: :mod:`tests.tritonclient_grpc_probe`) — each
answer equal to the project's own OIP client's (:class:`bench.oip_client.RestOip`, REST JSON) on the same request,
and errors answered with the error table's codes.
"""

from __future__ import annotations

import http.client
import io
import json
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from PIL import Image

from bench.oip_client import Input, Outputs, RestOip
from tests.doors_support import EXTRAS, WRITER, start_door
from tests.generation_checkpoint import PROMPTS
from tests.integration.test_doors import HYPOTHESIS, PREMISE, TEXT
from tests.integration.test_doors_tasks import SENTENCE
from tests.serving_support import REPO_ROOT, b64, png_bytes

pytestmark = [pytest.mark.slow, EXTRAS]

MODES = ("http-json", "http-binary", "http-gzip", "grpc")


def jpeg_bytes(seed: int = 0) -> bytes:
    """A deterministic RGB JPEG file."""
    buffer = io.BytesIO()
    Image.open(io.BytesIO(png_bytes(seed=seed))).convert("RGB").save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


@dataclass(frozen=True)
class Case:
    """One request: the model, its inputs (name, datatype, flat values: ``bytes`` for a file) and parameters."""

    name: str
    model: str
    inputs: tuple[tuple[str, str, tuple[Any, ...]], ...]
    parameters: dict[str, Any] = field(default_factory=dict)


CASES = [
    Case(
        "text-per-row",
        "sentiment",
        (
            ("text", "BYTES", (TEXT, "a slow rude waiter")),
            ("explain_method", "BYTES", ("relevance", "")),
            ("explain_target", "INT64", (2, -1)),
        ),
    ),
    Case("text-plain", "sentiment", (("text", "BYTES", (TEXT,)),)),
    Case(
        "pair",
        "pairs",
        (("text", "BYTES", (PREMISE,)), ("text_pair", "BYTES", (HYPOTHESIS,))),
        {"explain_method": "default"},
    ),
    Case("multi-label", "topics", (("text", "BYTES", (TEXT,)),), {"explain_method": "attention"}),
    Case("regression", "rating", (("text", "BYTES", (TEXT,)),), {"explain_method": "grad_x_input"}),
    Case(
        "image-png",
        "digits",
        (("image", "BYTES", (png_bytes(seed=3), png_bytes(seed=5))),),
        {"explain_method": "attention"},
    ),
    Case("image-jpeg", "digits", (("image", "BYTES", (jpeg_bytes(seed=4),)),), {"explain_method": "rollout"}),
    Case("tokens", "entities", (("text", "BYTES", (SENTENCE,)),), {"explain_method": "attnlrp"}),
    Case(
        "generation",
        WRITER,
        (("prompt", "BYTES", (PROMPTS[0],)),),
        {"max_new_tokens": 4, "explain_method": "attention"},
    ),
]


@pytest.fixture(scope="module")
def door(request: pytest.FixtureRequest) -> Any:
    return start_door(request, "kserve")


_REFERENCES: dict[str, Outputs] = {}


def reference(door: Any, case: Case) -> Outputs:
    """The case answered through the project's own OIP client (REST JSON; files as base64 text)."""
    if case.name not in _REFERENCES:
        inputs = [
            Input(name, datatype, [b64(v) if isinstance(v, bytes) else v for v in values])
            for name, datatype, values in case.inputs
        ]
        client = RestOip("127.0.0.1", door.rest_port)
        try:
            _REFERENCES[case.name] = client.infer(case.model, inputs, case.parameters)
        finally:
            client.close()
    return _REFERENCES[case.name]


def _array(datatype: str, values: tuple[Any, ...], json_mode: bool) -> np.ndarray:
    if datatype == "BYTES":
        # JSON carries text only: a file travels as base64 there, as raw bytes in the binary extension and on gRPC
        items = [b64(v) if isinstance(v, bytes) and json_mode else v for v in values]
        return np.array([v.encode() if isinstance(v, str) and not json_mode else v for v in items], dtype=np.object_)
    return np.array(values, dtype={"INT64": np.int64, "FP64": np.float64, "FP32": np.float32}[datatype])


def _flat(array: np.ndarray, datatype: str) -> list[Any]:
    values = array.reshape(-1).tolist()
    if datatype == "BYTES":
        return [v.decode("utf-8") if isinstance(v, bytes) else v for v in values]
    return values


def triton_http(door: Any, case: Case, mode: str, outputs: list[str]) -> tuple[Outputs, list[dict[str, Any]]]:
    """The case through ``tritonclient.http``: (outputs as ``(shape, flat data)``, the response's output headers)."""
    import tritonclient.http as httpclient

    json_mode = mode == "http-json"
    inputs = []
    for name, datatype, values in case.inputs:
        tensor = httpclient.InferInput(name, [len(values)], datatype)
        tensor.set_data_from_numpy(_array(datatype, values, json_mode), binary_data=not json_mode)
        inputs.append(tensor)
    # JSON mode asks for every output as JSON; the binary modes ask for none, so every output comes binary
    requested = [httpclient.InferRequestedOutput(name, binary_data=False) for name in outputs] if json_mode else None
    client = httpclient.InferenceServerClient(f"127.0.0.1:{door.rest_port}", network_timeout=120.0)
    try:
        result = client.infer(
            case.model, inputs, outputs=requested, parameters=case.parameters or None,
            request_compression_algorithm="gzip" if mode == "http-gzip" else None,
        )  # fmt: skip
    finally:
        client.close()
    described = result.get_response()["outputs"]
    answer = {o["name"]: (list(o["shape"]), _flat(result.as_numpy(o["name"]), o["datatype"])) for o in described}
    return answer, described


def grpc_probe(request: dict[str, Any]) -> dict[str, Any]:
    """One call of :mod:`tests.tritonclient_grpc_probe` (``tritonclient.grpc`` in a process of its own)."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.tritonclient_grpc_probe"], input=json.dumps(request), capture_output=True,
        text=True, cwd=REPO_ROOT, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer


def triton_grpc(door: Any, case: Case) -> Outputs:
    """The case through ``tritonclient.grpc`` (BYTES and the other inputs as raw contents).

    Raises:
        InferenceServerException: the door's error answer.
    """
    from tritonclient.utils import InferenceServerException

    inputs = [
        [name, datatype, [b64(v if isinstance(v, bytes) else v.encode()) for v in values] if datatype == "BYTES"
         else list(values)]
        for name, datatype, values in case.inputs
    ]  # fmt: skip
    answer = grpc_probe({"action": "infer", "target": f"127.0.0.1:{door.grpc_port}", "model": case.model,
                         "inputs": inputs, "parameters": case.parameters})  # fmt: skip
    if "error" in answer:
        raise InferenceServerException(answer["error"], answer.get("status"))
    return {name: (list(shape), list(data)) for name, (shape, data) in answer["outputs"].items()}


def assert_same(actual: Outputs, expected: Outputs) -> None:
    """The same outputs, shapes and elements (floats as FP32 carries them)."""
    assert sorted(actual) == sorted(expected)
    for name, (shape, data) in expected.items():
        assert actual[name][0] == shape, name
        got = actual[name][1]
        if any(isinstance(value, float) for value in data):
            assert got == pytest.approx(data, rel=1e-5, abs=1e-6), name
        else:
            assert got == data, name


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_tritonclient_answers_equal_the_projects_client(door: Any, case: Case, mode: str) -> None:
    expected = reference(door, case)
    if mode == "grpc":
        assert_same(triton_grpc(door, case), expected)
        return
    actual, described = triton_http(door, case, mode, list(expected))
    assert_same(actual, expected)
    binary = [o["name"] for o in described if "binary_data_size" in (o.get("parameters") or {})]
    assert binary == ([] if mode == "http-json" else [o["name"] for o in described])


@pytest.mark.parametrize("content_type", [None, "application/octet-stream", "application/json"])
def test_binary_outputs_carry_the_header_and_the_tail(door: Any, content_type: str | None) -> None:
    """A binary request, whatever its ``Content-Type``; one output asked for in binary, one in JSON: the answer's JSON
    length is in ``Inference-Header-Content-Length`` and the binary output's bytes follow it."""
    import tritonclient.http as httpclient

    text = httpclient.InferInput("text", [1], "BYTES")
    text.set_data_from_numpy(np.array([TEXT.encode()], dtype=np.object_))
    outputs = [httpclient.InferRequestedOutput("label", binary_data=True),
               httpclient.InferRequestedOutput("probabilities", binary_data=False)]  # fmt: skip
    body, json_size = httpclient.InferenceServerClient.generate_request_body([text], outputs=outputs)
    headers = {"Inference-Header-Content-Length": str(json_size)}
    if content_type is not None:
        headers["Content-Type"] = content_type
    connection = http.client.HTTPConnection("127.0.0.1", door.rest_port, timeout=120)
    try:
        connection.request("POST", "/v2/models/sentiment/infer", body, headers)
        response = connection.getresponse()
        header_length, raw = response.getheader("Inference-Header-Content-Length"), response.read()
    finally:
        connection.close()
    assert response.status == 200, raw
    assert header_length is not None and int(header_length) < len(raw)
    result = httpclient.InferenceServerClient.parse_response_body(raw, header_length=int(header_length))
    described = {o["name"]: o for o in result.get_response()["outputs"]}
    assert sorted(described) == ["label", "probabilities"]
    assert "data" not in described["label"] and described["label"]["parameters"]["binary_data_size"] > 0
    assert "data" in described["probabilities"]
    expected = reference(door, CASES[1])
    assert _flat(result.as_numpy("label"), "BYTES") == expected["label"][1]
    assert result.as_numpy("probabilities").reshape(-1).tolist() == pytest.approx(expected["probabilities"][1])


ERRORS = [
    ("unknown method", "sentiment", [("text", "BYTES", (TEXT,))], {"explain_method": "lime"}, "unknown_method"),
    ("text not UTF-8", "sentiment", [("text", "BYTES", (b"\xff\xfe not text",))], {}, "non_utf8"),
    ("image to a text model", "sentiment", [("image", "BYTES", (png_bytes(),))], {}, "unsupported_input"),
    ("not an image file", "digits", [("image", "BYTES", (b"\x89PNG\r\n\x1a\n cut short",))], {}, "invalid_image"),
    ("prompt not UTF-8", WRITER, [("prompt", "BYTES", (b"the \xc3",))], {"max_new_tokens": 2}, "non_utf8"),
]


@pytest.mark.parametrize("mode", ["http-binary", "grpc"])
@pytest.mark.parametrize(("model", "inputs", "parameters", "code"), [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS])
def test_errors_carry_the_error_tables_code(
    door: Any, mode: str, model: str, inputs: list[Any], parameters: dict[str, Any], code: str
) -> None:
    from tritonclient.utils import InferenceServerException

    case = Case("error", model, tuple(inputs), parameters)
    with pytest.raises(InferenceServerException) as refused:
        if mode == "grpc":
            triton_grpc(door, case)
        else:
            triton_http(door, case, mode, [])
    assert f"[{code}]" in refused.value.message(), refused.value


def test_health_and_metadata(door: Any) -> None:
    import tritonclient.http as httpclient

    http = httpclient.InferenceServerClient(f"127.0.0.1:{door.rest_port}")
    try:
        assert http.is_server_ready() and http.is_model_ready("digits")
        assert http.get_model_metadata("digits")["inputs"][0]["name"] == "image"
        assert "explain" in http.get_server_metadata()["extensions"]
    finally:
        http.close()
    metadata = grpc_probe({"action": "metadata", "target": f"127.0.0.1:{door.grpc_port}", "model": WRITER})
    assert metadata["server_ready"] and metadata["model_ready"]
    assert metadata["inputs"][0] == "prompt" and "generated_tokens" in metadata["outputs"]


def _docs_examples() -> list[str]:
    """The Python examples of docs/SERVING.md's "OIP clients" section."""
    text = (REPO_ROOT / "docs" / "SERVING.md").read_text()
    section = text[text.index("### OIP clients\n") :]
    section = section[: section.index("\n### ", 1)]
    return [block.split("```", 1)[0] for block in section.split("```python\n")[1:]]


def test_the_docs_examples_run_as_written(door: Any, tmp_path: Any) -> None:
    """Each example of docs/SERVING.md's "OIP clients" on the door's ports (its models have the default models'
    names and the demo writer's), in a process of its own (one of them imports ``tritonclient.grpc``)."""
    examples = _docs_examples()
    assert len(examples) == 3
    (tmp_path / "digit.png").write_bytes(png_bytes(seed=2))
    for example in examples:
        code = example.replace("127.0.0.1:8080", f"127.0.0.1:{door.rest_port}")
        code = code.replace("127.0.0.1:7070", f"127.0.0.1:{door.grpc_port}")
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                              timeout=300, check=False)  # fmt: skip
        assert done.returncode == 0, f"{example}\n{done.stderr}"
        assert done.stdout.strip()
