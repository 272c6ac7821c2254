"""The router: the service's public inference ports, TorchServe's behind it on loopback, when a model is a generation
model or has an explanation pool. It answers the OpenAI API itself (:mod:`doors.torchserve.openai_door`:
``/v1/chat/completions``, ``/v1/completions``, ``/v1/models`` for the generation models given with ``--generation``,
each choice a ``/predictions`` call to TorchServe), routes explanation requests to their explanation pools, and
forwards everything else unchanged. With ``--batch-root`` it also answers the OpenAI Batch API (``/v1/files``,
``/v1/batches``: :mod:`doors.torchserve.batch_door`).

TorchServe answers a batch together, so a prediction batched with explanation rows waits for their backward. A model
with an explanation pool (``explanation_workers``; docs/SERVING.md, "Predictions next to explanations") is registered
twice, ``<name>`` and ``<name>.explain`` (:mod:`serving_core.pools`), and this router, listening where clients connect,
sends each request for ``<name>`` that asks for an explanation (:func:`serving_core.pools.asks_for_explanation`) to
``<name>.explain`` and everything else on unchanged; TorchServe itself listens on loopback ports behind it. The
client's token passes as it is (TorchServe checks it); requests stay exactly what they were for the client.

REST: ``/predictions/{name}[/{version}]`` and ``/explanations/{name}[/{version}]``; a streamed answer (a generation
request with ``"stream": true``) is passed on chunk by chunk as TorchServe writes it. gRPC: ``Predictions`` and
``StreamPredictions`` (the ``PredictionsRequest``'s ``model_name``; ``StreamPredictions`` only for a streaming
generation request, each message as it comes; the other streaming RPC is refused, :mod:`forwarding`).
Started and stopped by :mod:`doors.torchserve.process`:

``python -m doors.torchserve.router --pool sentiment --generation writer --listen 127.0.0.1 --rest-port 8080
--grpc-port 7070 --upstream-rest-port 8090 --upstream-grpc-port 7090``
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote, urlsplit, urlunsplit

import grpc

from doors.torchserve.openai_door import OpenAIRoutes
from doors.torchserve.records_door import RecordsRoutes, parse_versions
from forwarding import Forwarder, Policy, RefusedError, Reply, Upstream, serve_until_signalled
from forwarding.metadata import parse_predictions_request
from serving_core.pools import asks_for_explanation, pool_name
from supervise.environment import name_value

if TYPE_CHECKING:
    from doors.torchserve.batch_door import BatchDoor

logger = logging.getLogger(__name__)

_ROUTES = ("predictions", "explanations")
_GRPC_ROUTED = frozenset({"Predictions"})
_NOT_A_STREAM = (
    'StreamPredictions streams a generation model\'s answer: send a JSON body with "stream": true '
    '(input["body"]); call Predictions for any other request'
)


class PoolRouter(Policy):
    """Sends the explanation requests for the models in ``pools`` to their explanation pools, and answers the OpenAI
    API for the generation models ``generation``."""

    name = "Router"
    grpc_streams = frozenset({"StreamPredictions"})

    def __init__(
        self,
        pools: Iterable[str],
        generation: Iterable[str] = (),
        batches: BatchDoor | None = None,
        records: RecordsRoutes | None = None,
    ) -> None:
        """Route for these models (their served names, without the pool suffix); ``batches``: the Batch API;
        ``records``: the records routes (:mod:`doors.torchserve.records_door`), when the deployment keeps records."""
        self.pools = frozenset(pools)
        self.openai = OpenAIRoutes(generation, self.rest_path, created=int(time.time()))
        self.batches = batches
        self.records = records

    def respond(
        self,
        method: str,
        path: str,
        authorization: str | None,
        body: bytes,
        upstream: Upstream,
        headers: Mapping[str, str] | None = None,
    ) -> Reply | None:
        """The records routes' answer (:class:`~doors.torchserve.records_door.RecordsRoutes`), the Batch API's
        (:class:`~doors.torchserve.batch_door.BatchDoor`) or the OpenAI API's
        (:class:`~doors.torchserve.openai_door.OpenAIRoutes`); ``None`` otherwise."""
        if self.records is not None:
            answered = self.records.respond(method, path, authorization, body, upstream)
            if answered is not None:
                return answered
        if self.batches is not None:
            answer = self.batches.respond(method, path, authorization, body, upstream, headers)
            if answer is not None:
                return answer
        return self.openai.respond(method, path, authorization, body, upstream, headers)

    def refusal(self, path: str, refused: RefusedError) -> Reply | None:
        """The OpenAI and Batch API routes' refusals in OpenAI's shape; ``None`` otherwise."""
        if self.batches is not None:
            answer = self.batches.refusal(path, refused.status, refused.message)
            if answer is not None:
                return answer
        return self.openai.refusal(path, refused.status, refused.message)

    def rest_path(self, path: str, body: bytes) -> str:
        """``/predictions/{name}...`` or ``/explanations/{name}...`` of a pooled model, rewritten to its pool when the
        request asks for an explanation; any other path unchanged."""
        parts = urlsplit(path)
        segments = parts.path.split("/")
        if len(segments) < 3 or segments[1] not in _ROUTES or unquote(segments[2]) not in self.pools:
            return path
        if not asks_for_explanation({"body": body}, explanations_route=segments[1] == "explanations"):
            return path
        segments[2] = quote(pool_name(unquote(segments[2])), safe="")
        return urlunsplit(parts._replace(path="/".join(segments)))

    def grpc_request(self, method: str, request: bytes) -> bytes:
        """A ``PredictionsRequest`` for a pooled model, with ``model_name`` set to the pool when it asks for an
        explanation; anything else (and anything that does not parse: TorchServe answers it) unchanged."""
        if method not in _GRPC_ROUTED:
            return request
        message = parse_predictions_request(request)
        if message is None:
            return request
        if message.model_name not in self.pools or not asks_for_explanation(dict(message.input)):
            return request
        message.model_name = pool_name(message.model_name)
        return bytes(message.SerializeToString())

    def grpc_stream_request(self, method: str, request: bytes) -> bytes:
        """A ``StreamPredictions`` request, forwarded unchanged when it is a streaming generation request (a JSON
        ``body`` with ``"stream": true`` for a generation model).

        Raises:
            RefusedError: ``INVALID_ARGUMENT`` for any other: TorchServe would answer it with one message that is not
                marked as a stream's, which TorchServe 0.12 does not survive.
        """
        message = parse_predictions_request(request)
        if message is None:
            raise RefusedError(400, grpc.StatusCode.INVALID_ARGUMENT, "not a PredictionsRequest")
        if not self._streams(message):
            raise RefusedError(400, grpc.StatusCode.INVALID_ARGUMENT, _NOT_A_STREAM)
        return request

    def _streams(self, message: Any) -> bool:
        """Whether a ``PredictionsRequest`` is a streaming generation request."""
        if message.model_name not in self.openai.models:
            return False
        body = message.input.get("body") or message.input.get("data")
        try:
            document = json.loads(body) if body else None
        except (UnicodeDecodeError, ValueError):
            return False
        return isinstance(document, dict) and document.get("stream") is True


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point: route until SIGTERM/SIGINT."""
    parser = argparse.ArgumentParser(prog="python -m doors.torchserve.router", description=__doc__.split("\n\n")[0])
    parser.add_argument("--pool", action="append", default=[], help="a model with an explanation pool (repeat)")
    parser.add_argument(
        "--generation", action="append", default=[], help="a generation model the OpenAI API serves (repeat)"
    )
    parser.add_argument("--listen", default="127.0.0.1")
    parser.add_argument("--rest-port", type=int, required=True)
    parser.add_argument("--grpc-port", type=int, required=True)
    parser.add_argument("--upstream-rest-port", type=int, required=True)
    parser.add_argument("--upstream-grpc-port", type=int, required=True)
    parser.add_argument("--max-body", type=int, default=3_100_000, help="bytes; larger requests get 413")
    parser.add_argument("--batch-root", type=Path, help="the Batch API's state folder (absent: no Batch API)")
    parser.add_argument(
        "--batch-model", action="append", default=[], type=name_value, help="NAME=ARCHIVE a batch may ask for (repeat)"
    )
    parser.add_argument(
        "--records-key-file", type=Path, help="key_file.json: answer /v1/records when EXPLAIN_RECORDS is set"
    )
    parser.add_argument("--model-version", action="append", default=[], help="NAME=VERSION of a served model (repeat)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    batches = None
    if args.batch_root is not None:  # imported only then: the job runner's imports (torch) stay out of the router
        from doors.torchserve.batch_door import BatchDoor

        batches = BatchDoor(args.batch_root, {name: Path(path) for name, path in args.batch_model})
    records = None
    if args.records_key_file is not None:
        records = RecordsRoutes(args.records_key_file, parse_versions(args.model_version))
    policy = PoolRouter(args.pool, args.generation, batches, records)
    router = Forwarder(
        policy, args.listen, args.rest_port, args.grpc_port, args.upstream_rest_port,
        args.upstream_grpc_port, args.max_body,
    )  # fmt: skip
    pools = ", ".join(sorted(args.pool)) or "none"
    generation = ", ".join(sorted(args.generation)) or "none"
    logger.info("router on %s: REST %d, gRPC %d -> 127.0.0.1:%d/%d; explanation pools for %s; OpenAI API for %s",
                args.listen, *router.ports, args.upstream_rest_port, args.upstream_grpc_port, pools,
                generation)  # fmt: skip
    serve_until_signalled(router)
    if batches is not None:
        batches.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
