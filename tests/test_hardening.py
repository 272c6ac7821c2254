"""Hardening of the shipped configuration, proved against a real TorchServe started by the launcher:

- nobody can load code: model registration (REST and gRPC management, any URL) and ``POST /workflows`` (a real
  workflow archive whose handler would leave a marker file) are refused, and the marker never appears;
- a request without a valid token gets nothing: no prediction body on REST inference, gRPC inference, ``/ping``,
  or management;
- management and metrics listen on loopback only (rendered config, and a connection through a non-loopback
  address of this machine is refused);
- request and response sizes are bounded (413 from the frontend);
- keys last a year, not TorchServe's hour, and rotate with the API key without stranding a key-file client.
"""

from __future__ import annotations

import json
import socket
import zipfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import psutil
import pytest

from doors.torchserve import protos
from doors.torchserve.config import Ports, write_config
from doors.torchserve.process import Server, start, stop
from explain_client import ExplainClient
from tests.ops_support import management, ops_server, rest_call, worker_pids
from tests.serving_support import http_post, tiny_archives

pytestmark = pytest.mark.slow

TEXT = b'{"text": "the crew were lovely", "explain": {"method": "rollout"}}'


@pytest.fixture(scope="session")
def server(request: pytest.FixtureRequest) -> Server:
    return ops_server(request)


def _properties(server: Server) -> dict[str, str]:
    text = (server.run_dir / "config.properties").read_text()
    return dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))


def test_rendered_config_is_hardened(server: Server) -> None:
    properties = _properties(server)
    for key in ("management_address", "metrics_address", "inference_address"):
        assert properties[key].startswith("http://127.0.0.1:"), (key, properties[key])
    assert properties["grpc_management_address"] == properties["grpc_inference_address"] == "127.0.0.1"
    assert "disable_token_authorization" not in properties and properties["enable_model_api"] == "false"
    assert int(properties["max_request_size"]) <= 4_000_000 and int(properties["max_response_size"]) <= 8_000_000
    workflow_store = Path(properties["workflow_store"])
    assert workflow_store.is_dir() and not any(workflow_store.iterdir())
    assert workflow_store.stat().st_mode & 0o222 == 0, "workflow store must be read-only"
    # allowed_urls admits no URL outside the model store (here: none at all).
    allowed = properties["allowed_urls"]
    assert allowed.startswith("^file:///") and allowed.endswith("$") and "http" not in allowed


def test_container_addresses_never_open_management(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """INFERENCE_ADDRESS/METRICS_ADDRESS (containers, pods) move those ports only; management stays on loopback,
    and anything but an IP literal is refused."""
    monkeypatch.setenv("INFERENCE_ADDRESS", "0.0.0.0")
    monkeypatch.setenv("METRICS_ADDRESS", "0.0.0.0")
    from doors.torchserve.config import Ports

    text = write_config(tmp_path, Ports(1, 2, 3, 4, 5, 6), tmp_path / "store").read_text()
    properties = dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))
    assert properties["inference_address"] == "http://0.0.0.0:1" and properties["metrics_address"] == "http://0.0.0.0:3"
    assert properties["management_address"] == "http://127.0.0.1:2" and properties["grpc_management_address"] == (
        "127.0.0.1"
    )
    monkeypatch.setenv("METRICS_ADDRESS", "0.0.0.0\nmanagement_address=http://0.0.0.0:2")
    with pytest.raises(ValueError, match="not an IP address"):
        write_config(tmp_path, Ports(1, 2, 3, 4, 5, 6), tmp_path / "store")


@pytest.mark.parametrize(
    "url",
    [
        "sentiment",
        "https://example.com/evil.mar",
        "http://169.254.169.254/latest/meta-data/",
        "file:///etc/passwd",
        "file:///nonexistent-explain-service/",
    ],
)
def test_model_registration_is_refused(server: Server, url: str) -> None:
    before = management(server, "/models")[1]
    status, reply = management(server, f"/models?url={url}&model_name=evil&initial_workers=1", method="POST")
    assert status in (403, 405), (status, reply)
    assert management(server, "/models")[1] == before


def test_grpc_model_registration_is_refused(server: Server) -> None:
    pb2, stubs = protos.management_stubs()
    metadata = [("authorization", f"Bearer {server.keys['management']}")]
    with grpc.insecure_channel(f"127.0.0.1:{server.ports.grpc_management}") as channel:
        stub = stubs.ManagementAPIsServiceStub(channel)
        with pytest.raises(grpc.RpcError) as error:
            stub.RegisterModel(
                pb2.RegisterModelRequest(url="https://example.com/evil.mar", model_name="evil", initial_workers=1),
                metadata=metadata,
                timeout=30,
            )
    assert error.value.code() != grpc.StatusCode.OK
    assert {model["modelName"] for model in management(server, "/models")[1]["models"]} == set(server.models)


def _workflow_archive(directory: Path, marker: Path) -> Path:
    """A real TorchServe workflow archive (.war) whose handler would write ``marker`` when loaded."""
    spec = "models:\n  min-workers: 1\n  evil:\n    url: evil.mar\ndag:\n  pre_processing: [evil]\n"
    handler = (
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('loaded')\n\n"
        "def pre_processing(data, context):\n    return data\n"
    )
    manifest = {
        "createdOn": "01/01/2024 00:00:00",
        "workflowModel": {"workflowName": "evil", "specFile": "spec.yaml", "handler": "handler.py"},
        "archiverVersion": "0.2.0",
    }
    path = directory / "evil.war"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("spec.yaml", spec)
        archive.writestr("handler.py", handler)
        archive.writestr("WAR-INF/MANIFEST.json", json.dumps(manifest))
    return path


def test_workflow_registration_is_refused(server: Server, tmp_path: Path) -> None:
    marker = tmp_path / "workflow-code-ran"
    archive = _workflow_archive(tmp_path, marker)
    for url in (f"file://{archive}", archive.name, "https://example.com/evil.war", "evil.war"):
        status, reply = management(server, f"/workflows?url={url}&workflow_name=evil", method="POST")
        assert status >= 400, (url, status, reply)
    status, reply = management(server, "/workflows")
    assert status == 200 and reply["workflows"] == []
    assert not marker.exists(), "workflow code was executed"


@pytest.mark.parametrize("token", [None, "wrong", "management"], ids=["none", "wrong", "management-key"])
def test_request_without_a_valid_token_gets_nothing(server: Server, token: str | None) -> None:
    key = None if token is None else (server.keys["management"] if token == "management" else "not-a-key")
    for route in ("predictions", "explanations"):
        status, reply = http_post(f"{server.inference_url}/{route}/sentiment", TEXT, key)
        assert status in (400, 401, 403), (route, status, reply)
        assert not (isinstance(reply, dict) and ("label" in reply or "explanation" in reply)), reply
    status, reply = http_post(f"{server.inference_url}/ping", b"", key)
    assert status in (400, 401, 403, 405) and "Healthy" not in str(reply)
    inference_pb2, inference_grpc = protos.inference_stubs()
    metadata = [] if key is None else [("authorization", f"Bearer {key}")]
    with grpc.insecure_channel(f"127.0.0.1:{server.ports.grpc_inference}") as channel:
        stub = inference_grpc.InferenceAPIsServiceStub(channel)
        with pytest.raises(grpc.RpcError) as error:
            stub.Predictions(
                inference_pb2.PredictionsRequest(model_name="sentiment", input={"body": TEXT}),
                metadata=metadata,
                timeout=30,
            )
    assert error.value.code() != grpc.StatusCode.OK
    # The inference key does not open management either.
    status, reply = management(server, "/models", token="inference")
    assert status in (400, 401, 403) and "models" not in str(reply)
    # And the valid inference token does work, so the refusals above are about the token.
    status, reply = rest_call(server, "sentiment", TEXT)
    assert status == 200 and reply["explanation"]["method"] == "rollout"


def _non_loopback_addresses() -> list[str]:
    addresses = []
    for entries in psutil.net_if_addrs().values():
        for entry in entries:
            if entry.family == socket.AF_INET and not entry.address.startswith("127."):
                addresses.append(entry.address)
    return addresses


def test_ports_are_not_reachable_from_other_interfaces(server: Server) -> None:
    addresses = _non_loopback_addresses()
    if not addresses:
        pytest.skip("this machine has no non-loopback IPv4 address to connect through")
    ports = server.ports
    for port in (ports.management, ports.metrics, ports.exporter, ports.grpc_management, ports.inference):
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass  # listening on loopback
        for address in addresses:
            with pytest.raises(OSError), socket.create_connection((address, port), timeout=5):
                pass


def _declared_size_status(server: Server, size: int) -> str:
    """The status line TorchServe answers to a request that only *declares* ``size`` bytes (no body sent)."""
    head = (
        f"POST /predictions/digits HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {server.keys['inference']}"
        f"\r\nContent-Type: application/json\r\nContent-Length: {size}\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", server.ports.inference), timeout=30) as connection:
        connection.sendall(head.encode())
        return connection.recv(256).decode(errors="replace").split("\r\n", 1)[0]


def test_sizes_are_bounded(server: Server) -> None:
    pid = worker_pids(server, "digits")
    # Refused on the declared length alone: the frontend never reads (or buffers) the 3.1 MB.
    assert " 413 " in _declared_size_status(server, 3_100_000) + " "
    status, reply = rest_call(server, "sentiment", json.dumps({"text": "word " * 5_000}).encode())
    assert status == 413 and reply["error"]["code"] == "text_too_long"
    assert worker_pids(server, "digits") == pid, "an oversized request must not reach or kill a worker"


def test_keys_last_a_year_and_rotate_with_the_api_key(tmp_path: Path) -> None:
    """TorchServe's default key lifetime (60 min) would refuse every client an hour after start; the launcher sets
    365 days (TOKEN_EXPIRATION_MIN). Rotation, as docs/OPERATIONS.md describes it: the never-expiring API key renews
    the inference key, TorchServe rewrites key_file.json, the old key is refused at once on REST and gRPC, and an
    ExplainClient that reads the key file carries on with the new key, on both transports."""
    archive = tiny_archives()["sentiment"]
    store = archive.parent.parent
    server = start(tmp_path / "run", store, {"sentiment": str(archive.relative_to(store))}, Ports.free(), timeout=240)
    try:
        properties = _properties(server)
        assert float(properties["token_expiration_min"]) == 525_600
        document = json.loads((server.run_dir / "key_file.json").read_text())
        for kind in ("inference", "management"):
            expires = datetime.fromisoformat(document[kind]["expiration time"].replace("Z", "+00:00"))
            assert expires - datetime.now(UTC) > timedelta(days=364), (kind, expires)
        clients = [ExplainClient.from_run_dir(server.run_dir, transport, retries=0) for transport in ("rest", "grpc")]
        for client in clients:
            assert client.predict("sentiment", "before the rotation").label
        old_key = server.keys["inference"]

        status, reply = management(server, "/token?type=inference", token="API")
        assert status == 200, reply
        new_key = server.keys["inference"]
        assert new_key != old_key
        status, reply = http_post(f"{server.inference_url}/predictions/sentiment", TEXT, old_key)
        assert status in (400, 401) and "label" not in str(reply), (status, reply)
        inference_pb2, inference_grpc = protos.inference_stubs()
        with grpc.insecure_channel(f"127.0.0.1:{server.ports.grpc_inference}") as channel:
            stub = inference_grpc.InferenceAPIsServiceStub(channel)
            with pytest.raises(grpc.RpcError):
                stub.Predictions(
                    inference_pb2.PredictionsRequest(model_name="sentiment", input={"body": TEXT}),
                    metadata=[("authorization", f"Bearer {old_key}")],
                    timeout=30,
                )
        status, reply = http_post(f"{server.inference_url}/predictions/sentiment", TEXT, new_key)
        assert status == 200 and reply["explanation"]["method"] == "rollout", reply
        for client in clients:  # refused once with the old key, then the key file's new one
            with client:
                assert client.predict("sentiment", "after the rotation").label
        # The management key rotates the same way; the management key alone cannot renew keys.
        assert management(server, "/token?type=inference", token="management")[0] in (400, 401)
        old_management = server.keys["management"]
        assert management(server, "/token?type=management", token="API")[0] == 200
        assert server.keys["management"] != old_management
        assert management(server, "/models")[0] == 200
    finally:
        stop(server.run_dir)
