"""The per-pod authenticating proxy (deploy/auth_proxy.py) in front of a real TorchServe: one shared secret opens
REST and gRPC inference whatever the pod's own random TorchServe key is, anything else is refused before it reaches
TorchServe, management stays closed, and a renewed TorchServe key is picked up without a restart."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from deploy.auth_proxy import AuthProxy, Credentials
from doors.torchserve import protos
from doors.torchserve.process import Server
from tests.ops_support import management, ops_server, rest_call
from tests.serving_support import http_post

pytestmark = pytest.mark.slow

SECRET = "shared-secret-for-all-replicas-0123456789"
DOCUMENT = {"text": "the crew were lovely", "explain": {"method": "rollout", "target": "positive"}}


@pytest.fixture(scope="session")
def server(request: pytest.FixtureRequest) -> Server:
    return ops_server(request)


@pytest.fixture(scope="module")
def proxy(server: Server) -> Iterator[tuple[int, int]]:
    credentials = Credentials(SECRET, server.run_dir / "key_file.json")
    running = AuthProxy(credentials, "127.0.0.1", 0, 0, server.ports.inference, server.ports.grpc_inference)
    running.start()
    try:
        yield running.ports
    finally:
        running.stop()


def _grpc(port: int, token: str | None, method: str = "Predictions") -> bytes:
    inference_pb2, inference_grpc = protos.inference_stubs()
    metadata = [("authorization", f"Bearer {token}")] if token else []
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = inference_grpc.InferenceAPIsServiceStub(channel)
        request = inference_pb2.PredictionsRequest(
            model_name="sentiment", input={"body": json.dumps(DOCUMENT).encode()}
        )
        reply = getattr(stub, method)(request, metadata=metadata, timeout=60)
        return bytes(reply.prediction)


def test_shared_secret_gets_the_same_answer_as_torchserve(server: Server, proxy: tuple[int, int]) -> None:
    rest_port, grpc_port = proxy
    body = json.dumps(DOCUMENT).encode()
    status, through = http_post(f"http://127.0.0.1:{rest_port}/predictions/sentiment", body, SECRET)
    direct_status, direct = rest_call(server, "sentiment", body)
    assert status == direct_status == 200
    assert through["explanation"]["scores"] == direct["explanation"]["scores"]
    assert through["explanation"]["target_label"] == "positive"
    reply = json.loads(_grpc(grpc_port, SECRET))
    assert reply["explanation"]["scores"] == direct["explanation"]["scores"]
    # Per-row errors and their statuses pass through unchanged.
    bad = json.dumps({"text": "hi", "explain": {"method": "lime"}}).encode()
    status, reply = http_post(f"http://127.0.0.1:{rest_port}/explanations/sentiment", bad, SECRET)
    assert status == 400 and reply["error"]["code"] == "unknown_method"


@pytest.mark.parametrize("token", [None, "wrong-token", "torchserve-key"])
def test_anything_but_the_shared_secret_is_refused(server: Server, proxy: tuple[int, int], token: str | None) -> None:
    rest_port, grpc_port = proxy
    key = server.keys["inference"] if token == "torchserve-key" else token
    status, reply = http_post(f"http://127.0.0.1:{rest_port}/predictions/sentiment", json.dumps(DOCUMENT).encode(), key)
    assert status == 401 and "explanation" not in reply and reply["type"] == "AuthProxy"
    with pytest.raises(grpc.RpcError) as error:
        _grpc(grpc_port, key)
    assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_management_is_not_reachable_through_the_proxy(server: Server, proxy: tuple[int, int]) -> None:
    _, grpc_port = proxy
    _, management_grpc = protos.management_stubs()
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        stub = management_grpc.ManagementAPIsServiceStub(channel)
        pb2, _ = protos.management_stubs()
        with pytest.raises(grpc.RpcError) as error:
            stub.ListModels(pb2.ListModelsRequest(), metadata=[("authorization", f"Bearer {SECRET}")], timeout=30)
    assert error.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_renewed_torchserve_key_is_picked_up(server: Server, proxy: tuple[int, int]) -> None:
    rest_port, _ = proxy
    before = server.keys["inference"]
    status, reply = management(server, "/token?type=inference", token="API")  # the token API takes the API key
    assert status == 200, reply
    after = server.keys["inference"]
    assert after != before
    status, reply = http_post(
        f"http://127.0.0.1:{rest_port}/predictions/sentiment", json.dumps(DOCUMENT).encode(), SECRET
    )
    assert status == 200 and reply["explanation"]["method"] == "rollout"
    with urllib.request.urlopen(
        urllib.request.Request(f"http://127.0.0.1:{rest_port}/ping", headers={"Authorization": f"Bearer {SECRET}"}),
        timeout=30,
    ) as response:
        assert json.loads(response.read())["status"] == "Healthy"


def test_short_secrets_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="at least 16"):
        Credentials("short", tmp_path / "key_file.json")
