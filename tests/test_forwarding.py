"""The REST side of the forwarder (forwarding/forwarder.py) against a stand-in upstream on loopback: bodies
arrive whole (``Content-Length`` or chunked), oversized ones get 413 without reaching the upstream, the policy's path
and token are used, a policy answers a request itself (calling the upstream), upstream connections are kept alive and
reopened after the upstream closes one."""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest

from forwarding import Forwarder, Policy, RefusedError, Reply, Upstream

grpc = pytest.importorskip("grpc")


class _Echo(BaseHTTPRequestHandler):
    """Answers with what it got; ``/close`` answers and closes the connection."""

    protocol_version = "HTTP/1.1"
    seen: ClassVar[list[dict[str, Any]]] = []

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        record = {"path": self.path, "body": body.decode(), "authorization": self.headers.get("Authorization"),
                  "port": self.client_address[1]}  # fmt: skip
        self.seen.append(record)
        payload = json.dumps(record).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(payload)))
        if self.path == "/close":
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(payload)


class _Rewrite(Policy):
    name = "Test"

    def authorization(self, presented: str | None) -> str | None:
        if presented == "Bearer refuse":
            raise RefusedError(401, grpc.StatusCode.UNAUTHENTICATED, "refused")
        return "Bearer upstream"

    def rest_path(self, path: str, body: bytes) -> str:
        return path.replace("/a/", "/b/") if b"explain" in body else path

    def respond(
        self,
        method: str,
        path: str,
        authorization: str | None,
        body: bytes,
        upstream: Upstream,
        headers: Mapping[str, str] | None = None,
    ) -> Reply | None:
        if path != "/local":
            return None
        response, payload = upstream.request("POST", "/inner", body, {"Authorization": authorization or ""})
        answer = {"method": method, "upstream_status": response.status, "upstream": json.loads(payload)}
        return Reply(201, json.dumps(answer).encode(), "application/x-test")

    def refusal(self, path: str, refused: RefusedError) -> Reply | None:
        return Reply(refused.status, json.dumps({"own": refused.message}).encode()) if path == "/local" else None


@pytest.fixture()
def forwarder() -> Iterator[int]:
    upstream = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    running = Forwarder(_Rewrite(), "127.0.0.1", 0, 0, upstream.server_address[1], 1, max_body=1000)
    running.start()
    _Echo.seen = []
    try:
        yield running.ports[0]
    finally:
        running.stop()
        upstream.shutdown()
        upstream.server_close()


def _post(connection: http.client.HTTPConnection, path: str, body: Any, **headers: str) -> tuple[int, Any]:
    connection.request("POST", path, body=body, headers=headers, encode_chunked=not isinstance(body, bytes))
    response = connection.getresponse()
    payload = response.read()
    return response.status, json.loads(payload)


def test_bodies_paths_and_tokens(forwarder: int) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", forwarder, timeout=10)
    status, echoed = _post(connection, "/a/x", b'{"explain": true}', Authorization="Bearer client")
    assert status == 200 and echoed["path"] == "/b/x" and echoed["authorization"] == "Bearer upstream"
    status, echoed = _post(connection, "/a/x", iter([b'{"text":', b' "chunked"}']))
    assert status == 200 and echoed["body"] == '{"text": "chunked"}' and echoed["path"] == "/a/x"
    status, reply = _post(connection, "/a/x", b"{}", Authorization="Bearer refuse")
    assert status == 401 and reply["type"] == "Test"
    assert len(_Echo.seen) == 2


def test_oversized_bodies_are_refused_unsent(forwarder: int) -> None:
    status, reply = _post(http.client.HTTPConnection("127.0.0.1", forwarder, timeout=10), "/a/x", b"x" * 1001)
    assert status == 413 and "1000" in reply["message"]
    # a body far larger than the socket buffers: the client finishes sending and reads the 413, no broken pipe
    status, reply = _post(http.client.HTTPConnection("127.0.0.1", forwarder, timeout=10), "/a/x", b"x" * 8_000_000)
    assert status == 413
    status, reply = _post(
        http.client.HTTPConnection("127.0.0.1", forwarder, timeout=10), "/a/x", iter([b"x" * 600] * 2)
    )
    assert status == 413 and not _Echo.seen


def test_upstream_connections_are_kept_alive_and_reopened(forwarder: int) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", forwarder, timeout=10)
    ports = [_post(connection, "/a/x", b"{}")[1]["port"] for _ in range(3)]
    assert len(set(ports)) == 1  # one upstream connection for the three
    _post(connection, "/close", b"{}")
    connection = http.client.HTTPConnection("127.0.0.1", forwarder, timeout=10)  # the forwarder closed it too
    assert _post(connection, "/a/x", b"{}")[1]["port"] not in ports


def test_a_policy_answers_a_request_itself(forwarder: int) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", forwarder, timeout=10)
    connection.request("POST", "/local", body=b'{"x": 1}', headers={"Authorization": "Bearer client"})
    response = connection.getresponse()
    answer = json.loads(response.read())
    assert response.status == 201 and response.getheader("Content-Type") == "application/x-test"
    assert answer["method"] == "POST" and answer["upstream_status"] == 200
    assert answer["upstream"]["path"] == "/inner" and answer["upstream"]["body"] == '{"x": 1}'
    assert answer["upstream"]["authorization"] == "Bearer upstream"  # the policy's token, as forwarding sends
    assert [seen["path"] for seen in _Echo.seen] == ["/inner"]
    assert _post(connection, "/a/x", b"plain") == (200, _Echo.seen[-1])  # anything else is still forwarded
    status, reply = _post(connection, "/local", b"x" * 1001)
    assert status == 413 and "1000" in reply["own"]  # the policy's own shape for its own routes' refusals
