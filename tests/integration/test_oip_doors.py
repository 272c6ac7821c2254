"""What only the KServe and Ray Serve doors speak: the OIP with several rows per request (per-row methods, targets and
options; failed rows named beside the good ones), KServe's own clients, KServe v1 ``:predict``/``:explain``, the
OIP health and metadata endpoints, dynamic batching of concurrent requests, the metrics on ``/metrics``, the
request-size bound and the loopback binding."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import psutil
import pytest
import torch

from bench.oip_client import GrpcOip, Input, OipCallError, RestOip
from tests.doors_support import EXTRAS, Row, door_models, from_oip, start_door, stop_doors
from tests.integration.test_doors import PREMISE, TEXT, assert_matches, reference
from tests.serving_support import png_bytes

pytestmark = [pytest.mark.slow, EXTRAS]


@pytest.fixture(scope="module", autouse=True)
def _stop_doors_after_this_module() -> Iterator[None]:
    """The last module that uses the doors (after test_doors.py) stops them when it is done."""
    yield
    stop_doors()


@pytest.fixture(params=["kserve", "ray"])
def door(request: pytest.FixtureRequest) -> Any:
    return start_door(request, request.param)


@pytest.fixture(scope="session")
def models(request: pytest.FixtureRequest) -> dict[str, Path]:
    return door_models(request)


def clients(door: Any) -> list[Any]:
    return [RestOip("127.0.0.1", door.rest_port), GrpcOip(f"127.0.0.1:{door.grpc_port}")]


def get(door: Any, path: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{door.rest_port}{path}", timeout=30) as response:
            body = response.read()
            return response.status, json.loads(body) if body[:1] in (b"{", b"[") else body.decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_per_row_methods_targets_and_options_in_one_request(door: Any, models: dict[str, Path]) -> None:
    texts = [TEXT, "a slow rude waiter", "food cold not warm good", PREMISE]
    inputs = [
        Input("text", "BYTES", texts),
        Input("explain_method", "BYTES", ["relevance", "", "rollout", "default"]),
        Input("explain_target", "INT64", [0, -1, 2, -1]),
        Input("explain_option_start_layer", "INT64", [-1, -1, 1, -1]),
    ]
    plans = [Row(text=texts[0], method="relevance", target=0), None,
             Row(text=texts[2], method="rollout", target=2, options={"start_layer": 1}),
             Row(text=texts[3], method="attnlrp")]  # fmt: skip
    for client in clients(door):
        outputs = client.infer("sentiment", inputs)
        assert outputs["explain_method"][1] == ["relevance", "", "rollout", "attnlrp"]
        assert outputs["scores"][0][0] == 4 and outputs["tokens"][0] == outputs["scores"][0]
        for index, plan in enumerate(plans):
            answer = from_oip(outputs, index)
            if plan is None:
                assert answer.method is None and answer.label_id >= 0
                continue
            assert_matches(answer, reference(models["sentiment"], plan))
        client.close()


def test_failed_rows_are_named_beside_the_good_ones(door: Any, models: dict[str, Path]) -> None:
    for client in clients(door):
        outputs = client.infer(
            "sentiment", [Input("text", "BYTES", [TEXT, "   ", TEXT])], {"explain_method": "gae", "explain_target": 1}
        )
        assert outputs["error_code"][1] == ["", "missing_text", ""] and outputs["error_message"][1][1]
        assert outputs["label_id"][1][1] == -1 and outputs["explain_method"][1] == ["gae", "", "gae"]
        assert_matches(from_oip(outputs, 2), reference(models["sentiment"], Row(text=TEXT, method="gae", target=1)))
        with pytest.raises(OipCallError) as refused:  # no good row: the request fails with the first row's status
            client.infer("sentiment", [Input("text", "BYTES", ["   ", ""])])
        assert refused.value.status in (400, "INVALID_ARGUMENT") and "missing_text" in refused.value.message
        client.close()


def test_images_as_raw_bytes_and_base64(door: Any, models: dict[str, Path]) -> None:
    image = png_bytes(seed=3)
    expected = reference(models["digits"], Row(image=image, method="attention"))
    rest, grpc_client = clients(door)
    for client, data in ((rest, base64.b64encode(image).decode()), (grpc_client, image)):
        outputs = client.infer("digits", [Input("image", "BYTES", [data, data])], {"explain_method": "attention"})
        assert outputs["scores"][0] == [2, 8, 8]
        for row in (0, 1):
            answer = from_oip(outputs, row)
            assert answer.grid == (8, 8)
            assert_matches(answer, expected)
        client.close()


def test_request_level_errors(door: Any) -> None:
    rest, grpc_client = clients(door)
    cases = [
        ([Input("txt", "BYTES", [TEXT])], {}, "missing_text", 400, "INVALID_ARGUMENT"),
        ([Input("text", "BYTES", [TEXT]), Input("colour", "BYTES", ["red"])], {}, "invalid_request", 400, None),
        ([Input("text", "INT64", [1])], {}, "invalid_request", 400, None),
        ([Input("text", "BYTES", [TEXT])], {"explain_method": 3}, "invalid_request", 400, None),
        ([Input("text", "BYTES", [TEXT])], {"explain_target": 1}, "invalid_request", 400, None),
        ([Input("text", "BYTES", [TEXT])], {"explain_colour": "red"}, "invalid_request", 400, None),
        ([Input("text", "BYTES", [TEXT] * 65)], {}, "invalid_request", 400, None),
        ([Input("image", "BYTES", ["AAAA"])], {}, "unsupported_input", 415, "INVALID_ARGUMENT"),
    ]
    for inputs, parameters, code, http_status, grpc_code in cases:
        for client, status in ((rest, http_status), (grpc_client, grpc_code or "INVALID_ARGUMENT")):
            with pytest.raises(OipCallError) as refused:
                client.infer("sentiment", inputs, parameters)
            assert refused.value.status == status and f"[{code}]" in refused.value.message, refused.value
    with pytest.raises(OipCallError) as missing:
        rest.infer("nosuchmodel", [Input("text", "BYTES", [TEXT])])
    assert missing.value.status == 404
    rest.close()
    grpc_client.close()


PARAMETERS = {"explain_method": "relevance", "explain_target": 2}


def test_kserve_clients(door: Any, models: dict[str, Path]) -> None:
    from kserve import InferenceGRPCClient, InferenceRESTClient, InferInput, InferRequest
    from kserve.inference_client import RESTConfig

    expected = reference(models["sentiment"], Row(text=TEXT, method="relevance", target=2))

    async def calls() -> list[Any]:
        answers = []
        rest = InferenceRESTClient(RESTConfig(protocol="v2", timeout=120))
        for binary in (False, True):
            tensor = InferInput("text", [1], "BYTES")
            tensor.set_data_from_numpy(np.array([TEXT], dtype=object), binary_data=binary)
            request = InferRequest(
                "sentiment", [tensor], parameters={"explain_method": "relevance", "explain_target": 2}
            )
            answers.append(await rest.infer(f"http://127.0.0.1:{door.rest_port}", request, model_name="sentiment"))
        assert await rest.is_server_ready(f"http://127.0.0.1:{door.rest_port}")
        await rest.close()
        client = InferenceGRPCClient(f"127.0.0.1:{door.grpc_port}", timeout=120)
        tensor = InferInput("text", [1], "BYTES")
        tensor.set_data_from_numpy(np.array([TEXT], dtype=object), binary_data=False)
        request = InferRequest("sentiment", [tensor], parameters=PARAMETERS)
        answers.append(await client.infer(request))
        assert await client.is_model_ready("sentiment")
        try:
            await client.infer(InferRequest("sentiment", [tensor], parameters={"explain_method": "lime"}))
        except grpc.RpcError as error:
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "unknown_method" in str(error.details())
        else:
            raise AssertionError("an unknown method was accepted")
        await client.close()
        return answers

    for response in asyncio.run(calls()):
        outputs = {
            o.name: (list(o.shape), [_text(v) for v in o.as_numpy().reshape(-1).tolist()]) for o in response.outputs
        }
        assert_matches(from_oip(outputs, 0), expected)


def _text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


def test_kserve_v1_predict_and_explain(door: Any, models: dict[str, Path]) -> None:
    url = f"http://127.0.0.1:{door.rest_port}/v1/models/sentiment"

    def post(verb: str, body: Any) -> tuple[int, Any]:
        request = urllib.request.Request(
            f"{url}:{verb}", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())

    status, reply = post("predict", {"instances": [TEXT, {"text": TEXT, "explain": {"method": "gae", "target": 1}}]})
    assert status == 200 and "explanation" not in reply["predictions"][0]
    explanation = reply["predictions"][1]["explanation"]
    expected = reference(models["sentiment"], Row(text=TEXT, method="gae", target=1))
    torch.testing.assert_close(torch.tensor(explanation["scores"]), expected.scores[0].float(), rtol=1e-3, atol=1e-5)
    status, reply = post("explain", {"instances": [TEXT, {"text": "  "}]})
    assert status == 200 and reply["explanations"][0]["method"] == "attnlrp" and reply["explanations"][1] is None
    assert reply["predictions"][1]["error"]["code"] == "missing_text"
    status, reply = post("explain", {"instances": [{"text": TEXT, "explain": {"method": "lime"}}]})
    assert status == 400 and reply["code"] == "unknown_method"
    status, _ = get(door, "/v1/models/sentiment")
    assert status == 200


def test_health_and_metadata(door: Any) -> None:
    assert get(door, "/v2/health/live")[0] == 200 and get(door, "/v2/health/ready")[0] == 200
    status, server = get(door, "/v2")
    assert status == 200 and "explain" in server["extensions"]
    status, model = get(door, "/v2/models/sentiment")
    names = {tensor["name"] for tensor in model["outputs"]}
    assert {"label", "probabilities", "tokens", "scores", "explain_method"} <= names
    assert {tensor["name"] for tensor in model["inputs"]} >= {"text", "explain_method"}
    status, digits = get(door, "/v2/models/digits")
    assert [tensor["shape"] for tensor in digits["outputs"] if tensor["name"] == "scores"] == [[-1, -1, -1]]
    status, rating = get(door, "/v2/models/rating")
    assert "value" in {tensor["name"] for tensor in rating["outputs"]}
    from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb
    from kserve.protocol.grpc import grpc_predict_v2_pb2_grpc as pb_grpc

    with grpc.insecure_channel(f"127.0.0.1:{door.grpc_port}") as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        assert stub.ServerLive(pb.ServerLiveRequest(), timeout=30).live
        assert stub.ModelReady(pb.ModelReadyRequest(name="sentiment"), timeout=30).ready
        assert "explain" in stub.ServerMetadata(pb.ServerMetadataRequest(), timeout=30).extensions
        metadata = stub.ModelMetadata(pb.ModelMetadataRequest(name="pairs"), timeout=30)
        assert "text_pair" in {tensor.name for tensor in metadata.inputs}


def test_concurrent_requests_are_batched_and_metrics_exported(door: Any, models: dict[str, Path]) -> None:
    texts = [f"{TEXT} number {index}" for index in range(12)]
    methods = ["relevance", "rollout", None, "attnlrp"]
    results: list[Any] = [None] * len(texts)
    barrier = threading.Barrier(len(texts))

    def call(index: int) -> None:
        client = RestOip("127.0.0.1", door.rest_port) if index % 2 else GrpcOip(f"127.0.0.1:{door.grpc_port}")
        method = methods[index % len(methods)]
        barrier.wait()
        try:
            results[index] = client.infer("sentiment", [Input("text", "BYTES", [texts[index]])],
                                          {"explain_method": method} if method else {})  # fmt: skip
        finally:
            client.close()

    def batches() -> tuple[float, float]:
        text = get(door, "/metrics")[1]
        total = single = 0.0
        for line in text.splitlines():
            if line.startswith("explain_batch_size_bucket") and 'model="sentiment"' in line:
                single += float(line.split()[-1]) if 'le="1.0"' in line else 0.0
                total += float(line.split()[-1]) if 'le="+Inf"' in line else 0.0
        return total, single

    before = batches()
    threads = [threading.Thread(target=call, args=(index,)) for index in range(len(texts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    for index, outputs in enumerate(results):
        assert outputs is not None, f"request {index} got no answer"
        method = methods[index % len(methods)]
        answer = from_oip(outputs, 0)
        if method is None:
            assert answer.method is None
        else:
            assert_matches(answer, reference(models["sentiment"], Row(text=texts[index], method=method)))
    after = batches()
    count, singles = after[0] - before[0], after[1] - before[1]
    assert count < len(texts) and singles < count, f"{count} batches, {singles} of one row: no batching seen"
    text = get(door, "/metrics")[1]
    assert 'request_predict_seconds_count{model_name="sentiment"}' in text  # KServe's own histograms
    for stage in ("forward", "backward", "attribution", "encode"):
        assert f'model="sentiment",stage="{stage}"' in text.replace('method="relevance",', ""), stage
    assert 'explain_errors_total{code="missing_text"' in text or "explain_errors_total" in text


def test_oversized_request_is_refused(door: Any) -> None:
    rest, grpc_client = clients(door)
    big = [Input("text", "BYTES", ["x" * 3_100_000])]
    with pytest.raises(OipCallError) as refused:
        rest.infer("sentiment", big)
    assert refused.value.status in (413, 0)  # the server may close the connection after answering
    with pytest.raises(OipCallError) as refused:
        grpc_client.infer("sentiment", big)
    assert refused.value.status == "RESOURCE_EXHAUSTED"
    rest.close()
    grpc_client.close()


def test_binds_loopback_only(door: Any) -> None:
    process = psutil.Process(door.pid)
    ports = {door.rest_port, door.grpc_port}
    listening = [c for c in process.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
    ours = [c for c in listening if c.laddr.port in ports]
    assert {c.laddr.port for c in ours} == ports
    assert all(c.laddr.ip in ("127.0.0.1", "::ffff:127.0.0.1") for c in ours), ours
