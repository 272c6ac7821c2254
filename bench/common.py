"""What the serving benchmarks share (``bench.load``, ``bench.mix``, ``bench.router``, ``bench.doors``): the request
texts and bodies, TorchServe's REST and gRPC callers, the sentiment archive and the ``cpu`` profile they serve, the
closed loop of concurrent clients that sends the requests, the percentile their latencies are read with, and the load
average printed with their tables.

The machine a report ran on is :func:`explain_eval.provenance.machine`, and the means and standard errors of the
evaluation tables are :mod:`explain_eval.results`' (the benchmarks import them from there: ``explain_eval`` never
imports ``bench``).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from doors.torchserve.config import load_profile
from doors.torchserve.process import Server

_CORPUS = (
    "the service was quick and friendly but the food arrived cold and the waiter never came back to our table "
    "i loved the movie its story was moving and the actors were brilliant although the ending felt rushed today "
    "terrible experience with customer support they kept me waiting for hours and nobody solved my problem at all"
)
WORDS = tuple(_CORPUS.split())


def make_texts(count: int, words: int = 26, seed: int = 0) -> list[str]:
    """Deterministic English-like texts of ``words`` words (~30 tokens with [CLS]/[SEP])."""
    generator = random.Random(seed)
    return [" ".join(generator.choice(WORDS) for _ in range(words)) for _ in range(count)]


def request_body(text: str, method: str) -> bytes:
    """The JSON body of a TorchServe request for ``text``, explained with ``method`` (``"none"``: a prediction)."""
    body: dict[str, Any] = {"text": text}
    if method != "none":
        body["explain"] = {"method": method}
    return json.dumps(body).encode()


def rest_caller(server: Server, model: str, port: int | None = None) -> Callable[[bytes], bool]:
    """POST to the model over one kept-alive HTTP/1.1 connection per calling thread (as the gRPC caller keeps one
    channel per thread), so that a TCP handshake per request does not count as serving overhead (``port``: another
    than the public inference port, e.g. TorchServe's own behind the router)."""
    path = f"/predictions/{model}"
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {server.keys['inference']}"}
    local = threading.local()

    def call(body: bytes) -> bool:
        if getattr(local, "connection", None) is None:
            local.connection = http.client.HTTPConnection("127.0.0.1", port or server.ports.inference, timeout=60)
        try:
            local.connection.request("POST", path, body, headers)
            response = local.connection.getresponse()
            payload = response.read()  # read whole, or the connection cannot take the next request
            return response.status == 200 and b'"error"' not in payload[:10]
        except (OSError, http.client.HTTPException):
            local.connection.close()
            local.connection = None
            return False

    return call


def grpc_caller(server: Server, model: str) -> Callable[[bytes], bool]:
    """TorchServe's gRPC ``Predictions`` for the model, one channel per calling thread."""
    import grpc

    from explain_client.protos import inference_stubs

    messages, stubs = inference_stubs()
    metadata = [("authorization", f"Bearer {server.keys['inference']}")]
    local = threading.local()

    def call(body: bytes) -> bool:
        if not hasattr(local, "stub"):
            local.channel = grpc.insecure_channel(f"127.0.0.1:{server.ports.grpc_inference}")
            local.stub = stubs.InferenceAPIsServiceStub(local.channel)
        try:
            reply = local.stub.Predictions(
                messages.PredictionsRequest(model_name=model, input={"body": body}), metadata=metadata, timeout=60
            )
        except grpc.RpcError:
            return False
        return not bytes(reply.prediction).startswith(b'{"error"')

    return call


def run_cell(
    call: Callable[[bytes], bool], bodies: Sequence[bytes], concurrency: int
) -> tuple[list[float], int, float]:
    """Send ``bodies`` with ``concurrency`` closed-loop clients (each sends the next body as soon as its answer came).

    Args:
        call: sends one body and says whether it was answered without an error (thread-safe).
        bodies: the requests, taken in order.
        concurrency: how many clients send at once.

    Returns:
        Each body's latency in seconds (in the order of ``bodies``), the number of errors, and the wall seconds.
    """
    latencies = [0.0] * len(bodies)
    errors = 0
    lock = threading.Lock()
    index = 0

    def worker() -> None:
        nonlocal index, errors
        while True:
            with lock:
                if index >= len(bodies):
                    return
                position = index
                index += 1
            started = time.perf_counter()
            ok = call(bodies[position])
            elapsed = time.perf_counter() - started
            with lock:
                latencies[position] = elapsed
                errors += 0 if ok else 1

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return latencies, errors, time.perf_counter() - started


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-quantile (0..1) by linear interpolation; NaN for no value."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def load_average() -> str:
    """The 1/5/15-minute load averages, as ``uptime`` shows them."""
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f}, {five:.2f}, {fifteen:.2f}"


def sentiment_archive(parser: argparse.ArgumentParser, tiny: bool, model_store: Path) -> tuple[Path, Path]:
    """The model store and the sentiment archive the serving benchmarks serve: the tiny test archive (built when
    missing) or the real one (``parser.error`` when it is not built)."""
    if tiny:
        from model_store.build import build_tiny_archives

        store = Path("build") / "test-archives"
        return store, build_tiny_archives(store)["sentiment"]
    archive = model_store / "sentiment" / "archive"
    if not (archive / "MAR-INF" / "MANIFEST.json").is_file():
        parser.error(f"no archive at {archive}: run `python -m model_store.build --only sentiment` or pass --tiny")
    return model_store, archive


def cpu_profile(threads: int | None) -> dict[str, Any]:
    """The ``cpu`` batching profile, with ``threads`` torch threads per worker when given."""
    profile = load_profile("cpu")
    if threads is not None:
        profile["handler"] = {**profile.get("handler", {}), "threads": threads}
    return profile


@contextlib.contextmanager
def environment(values: Mapping[str, str | None]) -> Iterator[None]:
    """``values`` in ``os.environ`` (None: unset) while a server starts (its processes inherit them)."""
    previous = {name: os.environ.get(name) for name in values}
    for name, value in values.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
