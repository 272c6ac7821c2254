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
``--max-body`` bytes get 413 and are never forwarded. Everything else — status, headers, body, gRPC status and details —
comes back as TorchServe sent it.
"""

from __future__ import annotations

import argparse
import hmac
import json
import logging
import sys
import threading
from pathlib import Path
from typing import Any

import grpc

from forwarding import Forwarder, Policy, RefusedError, serve_until_signalled

logger = logging.getLogger(__name__)


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


class _AuthPolicy(Policy):
    """Forwards only requests carrying the shared secret, with the pod's TorchServe key instead."""

    name = "AuthProxy"

    def __init__(self, credentials: Credentials) -> None:
        self._credentials = credentials

    def authorization(self, presented: str | None) -> str | None:
        if not self._credentials.accepts(presented):
            message = "missing or invalid token: send Authorization: Bearer <shared token>"
            raise RefusedError(401, grpc.StatusCode.UNAUTHENTICATED, message)
        try:
            key = self._credentials.upstream_key()
        except (OSError, ValueError, KeyError):
            raise RefusedError(503, grpc.StatusCode.UNAVAILABLE, "the model server is not ready yet; retry") from None
        return f"Bearer {key}" if key is not None else None


class AuthProxy(Forwarder):
    """The REST and gRPC listeners of one pod: a :class:`~forwarding.Forwarder` (same arguments
    after ``credentials``: listen address, REST and gRPC ports, upstream ports, ``max_body``) with the shared-secret
    policy."""

    def __init__(self, credentials: Credentials, *args: Any, **kwargs: Any) -> None:
        """Bind both listeners (``rest_port``/``grpc_port`` 0 = any free port; see :attr:`ports`)."""
        super().__init__(_AuthPolicy(credentials), *args, **kwargs)


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
    logger.info("auth proxy on %s: REST %d, gRPC %d -> 127.0.0.1:%d/%d", args.listen, *proxy.ports,
                args.upstream_rest_port, args.upstream_grpc_port)  # fmt: skip
    serve_until_signalled(proxy)
    return 0


if __name__ == "__main__":
    sys.exit(main())
