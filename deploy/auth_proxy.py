"""A per-pod authenticating proxy in front of TorchServe's inference ports (REST and gRPC), for running replicas.

Why: TorchServe 0.12 generates its keys at random in each process and cannot be given one, so behind a Kubernetes
Service every replica would want a different token. This proxy, a sidecar in each pod, accepts one shared secret
(``Authorization: Bearer <secret>``, from a Kubernetes Secret) and forwards the request unchanged except for the
token, which it replaces by its own pod's TorchServe inference key read from ``key_file.json`` (re-read when that
file changes, e.g. after a token renewal). TorchServe keeps its own token check on; its inference ports listen on
the pod's loopback only, so the proxy is the only way in.

``python -m deploy.auth_proxy --secret-file /var/run/secrets/explain/token --key-file run/key_file.json
--listen 0.0.0.0 --rest-port 8080 --grpc-port 7070 --upstream-rest-port 8085 --upstream-grpc-port 7075``

A request without the secret gets 401 (REST) or UNAUTHENTICATED (gRPC) and is never forwarded. Bodies larger than
``--max-body`` bytes get 413 without being read. Everything else — status, headers, body, gRPC status and details —
comes back as TorchServe sent it.
"""

from __future__ import annotations

import argparse
import hmac
import http.client
import json
import logging
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc

logger = logging.getLogger(__name__)

#: Hop-by-hop headers (RFC 9110 §7.6.1) and the ones the proxy sets itself.
_DROPPED_HEADERS = frozenset(
    {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade", "host",
     "authorization", "content-length"}
)  # fmt: skip
_GRPC_SERVICES = ("org.pytorch.serve.grpc.inference.InferenceAPIsService/",)
_STREAMING = frozenset({"StreamPredictions"})


class Credentials:
    """The shared secret clients present and the pod's TorchServe inference key (re-read when the file changes)."""

    def __init__(self, secret: str, key_file: Path | None) -> None:
        """Hold the secret; the key is read lazily from ``key_file`` (written by TorchServe at start; ``None``: the
        upstream takes no token, as the KServe and Ray doors on the pod's loopback)."""
        if len(secret) < 16:
            raise ValueError("the shared secret must be at least 16 characters")
        self._secret = secret.encode()
        self._key_file = key_file
        self._stamp: tuple[int, int] | None = None
        self._key = ""
        self._lock = threading.Lock()

    def accepts(self, authorization: str | None) -> bool:
        """Whether an ``Authorization`` value carries the shared secret (constant-time comparison)."""
        if not authorization or not authorization.startswith("Bearer "):
            return False
        return hmac.compare_digest(authorization[len("Bearer ") :].strip().encode(), self._secret)

    def upstream_key(self) -> str | None:
        """The pod's current TorchServe inference key (``None`` without a key file: forward no token).

        Raises:
            OSError: if the key file does not exist yet (TorchServe still starting).
        """
        if self._key_file is None:
            return None
        stat = self._key_file.stat()
        stamp = (stat.st_mtime_ns, stat.st_size)
        with self._lock:
            if stamp != self._stamp:
                document = json.loads(self._key_file.read_text(encoding="utf-8"))
                self._key = str(document["inference"]["key"])
                self._stamp = stamp
            return self._key


def _rest_handler(credentials: Credentials, upstream: tuple[str, int], max_body: int) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            logger.debug("rest %s " + format, self.client_address[0], *args)

        def _reply(self, status: int, message: str) -> None:
            body = json.dumps({"code": status, "type": "AuthProxy", "message": message}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _forward(self) -> None:
            if not credentials.accepts(self.headers.get("Authorization")):
                self.close_connection = True
                self._reply(401, "missing or invalid token: send Authorization: Bearer <shared token>")
                return
            length = int(self.headers.get("Content-Length") or 0)
            if length > max_body:
                self.close_connection = True
                self._reply(413, f"request body of {length} bytes exceeds {max_body}")
                return
            body = self.rfile.read(length) if length else None
            headers = {name: value for name, value in self.headers.items() if name.lower() not in _DROPPED_HEADERS}
            try:
                key = credentials.upstream_key()
                if key is not None:
                    headers["Authorization"] = f"Bearer {key}"
                connection = http.client.HTTPConnection(*upstream, timeout=300)
                try:
                    connection.request(self.command, self.path, body=body, headers=headers)
                    response = connection.getresponse()
                    payload = response.read()
                finally:
                    connection.close()
            except (OSError, http.client.HTTPException, ValueError, KeyError) as error:
                logger.warning("upstream %s:%d failed: %s", *upstream, error)
                self._reply(503, "the model server is not reachable yet; retry")
                return
            self.send_response(response.status, response.reason)
            for name, value in response.getheaders():
                if name.lower() not in _DROPPED_HEADERS:
                    self.send_header(name, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_POST = do_PUT = do_DELETE = do_OPTIONS = _forward  # noqa: N815 - http.server's naming

    return Handler


class _GrpcForwarder(grpc.GenericRpcHandler):
    """Forwards TorchServe's inference RPCs as raw bytes, swapping the token in the metadata."""

    def __init__(self, credentials: Credentials, channel: grpc.Channel) -> None:
        self._credentials = credentials
        self._channel = channel

    def _metadata(self, context: grpc.ServicerContext) -> list[tuple[str, str]]:
        incoming = dict(context.invocation_metadata())
        if not self._credentials.accepts(str(incoming.get("authorization", ""))):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or invalid token: metadata authorization: Bearer")
        try:
            key = self._credentials.upstream_key()
        except (OSError, ValueError, KeyError):
            context.abort(grpc.StatusCode.UNAVAILABLE, "the model server is not ready yet; retry")
        return [("authorization", f"Bearer {key}")] if key is not None else []

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        method = str(handler_call_details.method)
        if not any(method.lstrip("/").startswith(prefix) for prefix in _GRPC_SERVICES):
            return None  # UNIMPLEMENTED: management and anything else stay closed
        if method.rsplit("/", 1)[-1] in _STREAMING:
            upstream_stream = self._channel.unary_stream(method)

            def stream(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
                metadata = self._metadata(context)
                try:
                    yield from upstream_stream(request, metadata=metadata, timeout=context.time_remaining())
                except grpc.RpcError as error:
                    context.abort(error.code(), error.details() or "")

            return grpc.unary_stream_rpc_method_handler(stream)
        upstream_unary: Callable[..., bytes] = self._channel.unary_unary(method)

        def unary(request: bytes, context: grpc.ServicerContext) -> bytes:
            metadata = self._metadata(context)
            try:
                return upstream_unary(request, metadata=metadata, timeout=context.time_remaining())
            except grpc.RpcError as error:
                context.abort(error.code(), error.details() or "")
                raise  # unreachable: abort raises

        return grpc.unary_unary_rpc_method_handler(unary)


class AuthProxy:
    """The REST and gRPC listeners of one pod."""

    def __init__(
        self,
        credentials: Credentials,
        listen: str,
        rest_port: int,
        grpc_port: int,
        upstream_rest_port: int,
        upstream_grpc_port: int,
        max_body: int = 3_100_000,
    ) -> None:
        """Bind both listeners (``rest_port``/``grpc_port`` 0 = any free port; see :attr:`ports`)."""
        self._http = ThreadingHTTPServer(
            (listen, rest_port), _rest_handler(credentials, ("127.0.0.1", upstream_rest_port), max_body)
        )
        self._http.daemon_threads = True
        options = [("grpc.max_receive_message_length", max_body), ("grpc.max_send_message_length", 64 * 2**20)]
        self._channel = grpc.insecure_channel(f"127.0.0.1:{upstream_grpc_port}", options=options)
        self._grpc = grpc.server(futures.ThreadPoolExecutor(max_workers=64), options=options)
        self._grpc.add_generic_rpc_handlers((_GrpcForwarder(credentials, self._channel),))
        bound = self._grpc.add_insecure_port(f"{listen}:{grpc_port}")
        if bound == 0:
            raise OSError(f"cannot bind gRPC {listen}:{grpc_port}")
        self.ports = (int(self._http.server_address[1]), bound)
        self._thread = threading.Thread(target=self._http.serve_forever, name="rest-proxy", daemon=True)

    def start(self) -> None:
        """Start serving in background threads."""
        self._grpc.start()
        self._thread.start()

    def stop(self) -> None:
        """Stop both listeners (in-flight gRPC calls get 5 s)."""
        self._http.shutdown()
        self._http.server_close()
        self._grpc.stop(grace=5).wait()
        self._channel.close()


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point: serve until SIGTERM/SIGINT."""
    parser = argparse.ArgumentParser(prog="python -m deploy.auth_proxy", description=__doc__.split("\n\n")[0])
    parser.add_argument("--secret-file", type=Path, required=True, help="file holding the shared token")
    parser.add_argument("--key-file", type=Path, default=Path("run/key_file.json"), help="TorchServe's key file")
    parser.add_argument("--no-upstream-key", action="store_true",
                        help="forward without a token (the KServe and Ray doors, on the pod's loopback)")  # fmt: skip
    parser.add_argument("--listen", default="0.0.0.0")
    parser.add_argument("--rest-port", type=int, default=8080)
    parser.add_argument("--grpc-port", type=int, default=7070)
    parser.add_argument("--upstream-rest-port", type=int, default=8085)
    parser.add_argument("--upstream-grpc-port", type=int, default=7075)
    parser.add_argument("--max-body", type=int, default=3_100_000, help="bytes; larger requests get 413")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    key_file = None if args.no_upstream_key else args.key_file
    credentials = Credentials(args.secret_file.read_text(encoding="utf-8").strip(), key_file)
    proxy = AuthProxy(
        credentials, args.listen, args.rest_port, args.grpc_port, args.upstream_rest_port, args.upstream_grpc_port,
        args.max_body,
    )  # fmt: skip
    proxy.start()
    logger.info("auth proxy on %s: REST %d, gRPC %d -> 127.0.0.1:%d/%d", args.listen, *proxy.ports,
                args.upstream_rest_port, args.upstream_grpc_port)  # fmt: skip
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    proxy.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
