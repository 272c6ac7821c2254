"""A model with an explanation pool, on a real TorchServe behind the router (the session's ``server``: ``sentiment``
has the pool ``sentiment.explain``, ``digits`` has none). Every request is sent exactly as without a pool; TorchServe's
own per-model request counters show which pool answered."""

from __future__ import annotations

import json
import re
import threading
import urllib.request
from typing import Any

import grpc
import pytest

from doors.torchserve.process import Server
from explain_client import protos
from supervise.processes import pid_alive
from tests.ops_support import worker_pids
from tests.serving_support import b64, http_post, png_bytes

pytestmark = pytest.mark.slow

TEXT = "the crew were lovely and the food was fine"


def _counts(server: Server) -> dict[str, float]:
    """TorchServe's ``ts_inference_requests_total`` per served name."""
    with urllib.request.urlopen(f"http://127.0.0.1:{server.ports.metrics}/metrics", timeout=30) as response:
        text = response.read().decode()
    counts: dict[str, float] = {}
    for match in re.finditer(
        r'^ts_inference_requests_total\{[^}]*model_name="([^"]+)"[^}]*\} ([0-9.eE+]+)$', text, re.M
    ):
        counts[match.group(1)] = counts.get(match.group(1), 0.0) + float(match.group(2))
    return counts


def _rest(server: Server, route: str, model: str, body: bytes, token: str | None = "inference", **kwargs: Any) -> Any:
    key = server.keys[token] if token else None
    return http_post(f"{server.inference_url}/{route}/{model}", body, key, **kwargs)


def _grpc(server: Server, model: str, inputs: dict[str, bytes], token: str | None = None) -> bytes:
    inference_pb2, inference_grpc = protos.inference_stubs()
    metadata = [("authorization", f"Bearer {token or server.keys['inference']}")]
    with grpc.insecure_channel(f"127.0.0.1:{server.ports.grpc_inference}") as channel:
        stub = inference_grpc.InferenceAPIsServiceStub(channel)
        request = inference_pb2.PredictionsRequest(model_name=model, input=inputs)
        return bytes(stub.Predictions(request, metadata=metadata, timeout=60).prediction)


def test_the_pool_is_registered_behind_the_router(server: Server) -> None:
    assert server.pools == ("sentiment",) and server.router_pid is not None and pid_alive(server.router_pid)
    assert _rest(server, "predictions", "sentiment", json.dumps({"text": TEXT}).encode())[0] == 200


def test_each_request_is_answered_by_its_pool(server: Server) -> None:
    messages = protos.explain_messages()
    predictions = [
        lambda: _rest(server, "predictions", "sentiment", json.dumps({"text": TEXT}).encode()),
        lambda: _rest(server, "predictions", "sentiment", json.dumps({"text": TEXT, "explain": False}).encode()),
        lambda: _rest(server, "predictions", "sentiment", TEXT.encode(), content_type="text/plain"),
        lambda: (200, _grpc(server, "sentiment", {"body": json.dumps({"text": TEXT}).encode()})),
        lambda: (200, _grpc(server, "sentiment", {"request": messages.ExplainRequest(text=TEXT).SerializeToString()})),
    ]
    request = messages.ExplainRequest(text=TEXT, explain=messages.ExplainOptions(method="rollout"))
    explanations = [
        lambda: _rest(server, "predictions", "sentiment", json.dumps({"text": TEXT, "explain": {}}).encode()),
        lambda: _rest(
            server, "predictions", "sentiment", json.dumps({"text": TEXT, "explain": {"below": 0.9}}).encode()
        ),
        lambda: _rest(server, "explanations", "sentiment", json.dumps({"text": TEXT}).encode()),
        lambda: _rest(server, "explanations", "sentiment", TEXT.encode(), content_type="text/plain"),
        lambda: (200, _grpc(server, "sentiment", {"body": json.dumps({"text": TEXT, "explain": True}).encode()})),
        lambda: (200, _grpc(server, "sentiment", {"request": request.SerializeToString()})),
    ]
    image = [
        lambda: _rest(server, "predictions", "digits", json.dumps({"image": b64(png_bytes()), "explain": {}}).encode())
    ]
    before = _counts(server)
    for call in predictions + explanations + image:
        status, _ = call()
        assert status == 200
    after = _counts(server)
    gained = {name: after.get(name, 0.0) - before.get(name, 0.0) for name in after}
    assert gained == {"sentiment": len(predictions), "sentiment.explain": len(explanations), "digits": len(image)}


def test_answers_are_those_of_the_model(server: Server) -> None:
    """Both pools serve the same archive: the explanation's prediction is the prediction pool's; REST and gRPC agree."""
    status, predicted = _rest(server, "predictions", "sentiment", json.dumps({"text": TEXT}).encode())
    document = {"text": TEXT, "explain": {"method": "grad_x_input", "target": "positive"}}
    status_explained, explained = _rest(server, "predictions", "sentiment", json.dumps(document).encode())
    assert status == status_explained == 200
    assert explained["label"] == predicted["label"] and explained["probabilities"] == predicted["probabilities"]
    over_grpc = json.loads(_grpc(server, "sentiment", {"body": json.dumps(document).encode()}))
    timeless = [
        {key: value for key, value in reply["explanation"].items() if key != "seconds"}
        for reply in (over_grpc, explained)
    ]
    assert timeless[0] == timeless[1] and timeless[0]["scores"] and "explanation" not in predicted


def test_errors_and_tokens_are_torchserves(server: Server) -> None:
    status, reply = _rest(server, "predictions", "sentiment", b"{not json")
    assert status == 400 and reply["error"]["code"] == "invalid_json"
    bad_method = json.dumps({"text": TEXT, "explain": {"method": "lime"}}).encode()
    status, reply = _rest(server, "predictions", "sentiment", bad_method)
    assert status == 400 and reply["error"]["code"] == "unknown_method"
    explain = json.dumps({"text": TEXT, "explain": True}).encode()
    for token in (None, "management"):  # TorchServe says 400 without a token, 401 with a wrong one
        status, reply = _rest(server, "predictions", "sentiment", explain, token=token)
        assert status in (400, 401) and "label" not in str(reply)
    with pytest.raises(grpc.RpcError) as refused:
        _grpc(server, "sentiment", {"body": explain}, token="not-the-token")
    assert refused.value.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)
    status, _ = _rest(server, "predictions", "sentiment", b'{"text": "' + b"a" * 3_200_000 + b'"}')
    assert status == 413


def test_a_concurrent_mix_is_answered_in_kind(server: Server) -> None:
    """Eight clients, every third request an explanation: each answer is what its request asked for."""
    results: list[tuple[bool, int, Any]] = []
    lock = threading.Lock()

    def client(offset: int) -> None:
        for index in range(offset, 24, 8):
            asks = index % 3 == 0
            document = {"text": f"{TEXT} {index}", **({"explain": {"method": "attnlrp"}} if asks else {})}
            status, reply = _rest(server, "predictions", "sentiment", json.dumps(document).encode())
            with lock:
                results.append((asks, status, reply))

    threads = [threading.Thread(target=client, args=(offset,)) for offset in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert len(results) == 24
    for asks, status, reply in results:
        assert status == 200 and ("explanation" in reply) == asks


def test_streaming_rpcs_are_refused_and_the_worker_lives(server: Server) -> None:
    """TorchServe 0.12 kills a worker whose handler answers a streaming call with one plain message; the router refuses
    ``StreamPredictions`` of a request that does not stream (here a classifier's: only a generation request with
    ``"stream": true`` streams) with INVALID_ARGUMENT and ``StreamPredictions2`` with UNIMPLEMENTED, before they reach
    it (called as raw methods: the client's stubs have ``Predictions`` only)."""
    inference_pb2, _ = protos.inference_stubs()
    service = "/org.pytorch.serve.grpc.inference.InferenceAPIsService"
    metadata = [("authorization", f"Bearer {server.keys['inference']}")]
    document = {"text": TEXT, "explain": {"method": "rollout"}}
    request = inference_pb2.PredictionsRequest(model_name="sentiment", input={"body": json.dumps(document).encode()})
    workers = {name: worker_pids(server, name) for name in ("sentiment", "sentiment.explain")}
    with grpc.insecure_channel(f"127.0.0.1:{server.ports.grpc_inference}") as channel:
        stream = channel.unary_stream(f"{service}/StreamPredictions")
        bidi = channel.stream_stream(f"{service}/StreamPredictions2")
        payload = request.SerializeToString()
        calls = (
            (lambda: list(stream(payload, metadata=metadata, timeout=60)), grpc.StatusCode.INVALID_ARGUMENT),
            (lambda: list(bidi(iter([payload]), metadata=metadata, timeout=60)), grpc.StatusCode.UNIMPLEMENTED),
        )
        for call, code in calls:
            with pytest.raises(grpc.RpcError) as refused:
                call()
            assert refused.value.code() == code and "Predictions" in str(refused.value.details())
    assert json.loads(_grpc(server, "sentiment", {"body": json.dumps(document).encode()}))["explanation"]
    assert {name: worker_pids(server, name) for name in workers} == workers
