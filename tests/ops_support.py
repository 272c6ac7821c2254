"""Helpers of the operations tests (hardening, reliability, fuzz, deploy): one TorchServe for all of them, worker
pids and memory, and a bounded mixed-load generator over REST and gRPC.

The server is the same launcher and tiny archives as tests/integration (``model_store.serving.process.start``,
:func:`tests.serving_support.tiny_archives`), started once per test session on free loopback ports the first time
one of these modules asks for it, and stopped by its pid at the end of the session, also when tests fail. It is a
separate server from the integration suite's because the reliability tests kill its workers. The text model runs
two workers (``WORKERS``), so that a killed worker's twin keeps answering while it restarts (docs/OPERATIONS.md).
"""

from __future__ import annotations

import json
import logging
import os
import random
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import psutil
import pytest

from explain_client import protos
from explainers import available_methods
from model_store.serving.config import Ports
from model_store.serving.process import Server, start, stop
from tests.serving_support import b64, http_call, http_post, png_bytes, tiny_archives

logger = logging.getLogger(__name__)

_SHARED: dict[str, Server] = {}
#: Workers per served model of the operations server (model-config.yaml overrides).
WORKERS = {"sentiment": 2, "digits": 1}
_LOCK = threading.Lock()

TEXTS = (
    "the service was quick and the staff were lovely",
    "terrible delay and nobody told us anything",
    "an ordinary flight, nothing to report",
    "i loved the crew but the seat was broken",
)


def ops_server(request: pytest.FixtureRequest) -> Server:
    """The operations tests' TorchServe (started on first use; stopped when the session ends).

    Call it from a session-scoped fixture: its finalizer stops the server by its pid.
    """
    with _LOCK:
        if "server" in _SHARED:
            return _SHARED["server"]
        archives = tiny_archives()
        store = next(iter(archives.values())).parent.parent
        models = {name: str(path.relative_to(store)) for name, path in archives.items()}
        run_dir = request.getfixturevalue("tmp_path_factory").mktemp("ops-run")
        overrides = {name: {"minWorkers": count, "maxWorkers": count} for name, count in WORKERS.items()}
        # Three workers on a few shared cores: one intra-op thread each (inherited by TorchServe and its workers,
        # restarted ones included), or their thread pools oversubscribe the cores.
        previous = os.environ.get("OMP_NUM_THREADS")
        os.environ["OMP_NUM_THREADS"] = "1"
        try:
            server = start(run_dir, store, models, Ports.free(), timeout=240, overrides=overrides)
        finally:
            if previous is None:
                os.environ.pop("OMP_NUM_THREADS", None)
            else:
                os.environ["OMP_NUM_THREADS"] = previous
        _SHARED["server"] = server
        try:  # start() returns once each model has one READY worker; the tests need them all
            for name, count in WORKERS.items():
                wait_for_worker(server, name, count=count, timeout=180)
        except BaseException:
            stop(server.run_dir)
            _SHARED.pop("server", None)
            raise

    def _stop() -> None:
        with _LOCK:
            _SHARED.pop("server", None)
        stop(server.run_dir)

    request.session.config.add_cleanup(_stop)
    return server


def management(server: Server, path: str, method: str = "GET", token: str | None = "management") -> tuple[int, Any]:
    """Call the management API; returns (status, parsed JSON or raw bytes)."""
    headers = {"Authorization": f"Bearer {server.keys[token]}"} if token else {}
    url = f"http://127.0.0.1:{server.ports.management}{path}"
    request = urllib.request.Request(url, headers=headers, method=method, data=b"" if method != "GET" else None)
    return http_call(request, timeout=30)


def worker_pids(server: Server, model: str) -> list[int]:
    """Pids of the model's READY workers (management DescribeModel)."""
    status, reply = management(server, f"/models/{model}")
    if status != 200:
        return []
    return [int(worker["pid"]) for worker in reply[0]["workers"] if worker.get("status") == "READY" and worker["pid"]]


def wait_for_worker(
    server: Server, model: str, not_pid: int | None = None, timeout: float = 60.0, count: int = 1
) -> int:
    """Wait until the model has ``count`` READY workers, none of them ``not_pid``; returns the first one's pid.

    Raises:
        TimeoutError: if they are not ready within ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = worker_pids(server, model)
        if len(pids) >= count and not_pid not in pids:
            return pids[0]
        time.sleep(0.2)
    raise TimeoutError(f"no READY worker of {model} within {timeout} s; see {server.log_dir}")


def resident_bytes(pid: int) -> int:
    """Resident set size of a process in bytes."""
    return int(psutil.Process(pid).memory_info().rss)


def rest_call(server: Server, model: str, body: bytes, route: str = "predictions", timeout: float = 60.0) -> Any:
    """POST a JSON body with the inference token; returns (status, parsed reply)."""
    url = f"{server.inference_url}/{route}/{model}"
    return http_post(url, body, server.keys["inference"], timeout=timeout)


class GrpcCaller:
    """One gRPC channel to the inference port (one per load thread), with the inference token."""

    def __init__(self, server: Server) -> None:
        """Open the channel."""
        self._pb2, grpc_module = protos.inference_stubs()
        self._channel = grpc.insecure_channel(f"127.0.0.1:{server.ports.grpc_inference}")
        self._stub = grpc_module.InferenceAPIsServiceStub(self._channel)
        self._metadata = [("authorization", f"Bearer {server.keys['inference']}")]

    def predict(self, model: str, inputs: dict[str, bytes], timeout: float = 60.0) -> bytes:
        """Predictions RPC; raises ``grpc.RpcError`` on a non-OK status."""
        request = self._pb2.PredictionsRequest(model_name=model, input=inputs)
        reply = self._stub.Predictions(request, metadata=self._metadata, timeout=timeout)
        return bytes(reply.prediction)

    def close(self) -> None:
        """Close the channel."""
        self._channel.close()


@dataclass(frozen=True)
class Outcome:
    """One request of a load run."""

    protocol: str
    model: str
    method: str
    good: bool
    ok: bool
    status: str
    started: float
    finished: float
    detail: str = ""


@dataclass(frozen=True)
class Plan:
    """One request to send: the model, the JSON document (or raw body) and what a correct answer looks like."""

    model: str
    method: str
    body: bytes
    good: bool
    expected_code: str | None = None


_BAD_TEXT: tuple[tuple[bytes, str], ...] = (
    (b"{not json", "invalid_json"),
    (b'{"text": "\xff\xfe"}', "non_utf8"),
    (json.dumps({"explain": True}).encode(), "missing_text"),
    (json.dumps({"text": "hi", "explain": {"method": "lime"}}).encode(), "unknown_method"),
    (json.dumps({"text": "hi", "explain": {"target": "furious"}}).encode(), "invalid_target"),
    (json.dumps({"text": "hi", "explain": {"start_layer": 99}}).encode(), "invalid_option"),
    (json.dumps({"image": "AAAA"}).encode(), "unsupported_input"),
)


def make_plan(rng: random.Random, bad_fraction: float, image: bytes) -> Plan:
    """A random request: text (3 in 4) or image, prediction or any registered method, ``bad_fraction`` bad."""
    if rng.random() < bad_fraction:
        body, code = rng.choice(_BAD_TEXT)
        return Plan("sentiment", "bad", body, good=False, expected_code=code)
    method = rng.choice(["none", *available_methods()])
    explain: dict[str, Any] = {} if method == "none" else {"explain": {"method": method}}
    if method == "integrated_gradients":
        explain["explain"]["n_steps"] = 8
    if rng.random() < 0.75:
        text = f"{rng.choice(TEXTS)} {rng.randrange(1000)}"
        return Plan("sentiment", method, json.dumps({"text": text, **explain}).encode(), good=True)
    return Plan("digits", method, json.dumps({"image": b64(image), **explain}).encode(), good=True)


def check_reply(plan: Plan, status: int, reply: Any) -> tuple[bool, str]:
    """Whether a reply is the correct answer to ``plan`` (for a bad request: its 4xx error code)."""
    if not isinstance(reply, dict):
        return False, f"status {status}, non-JSON reply {reply[:200]!r}"
    if not plan.good:
        error = reply.get("error") or {}
        ok = error.get("code") == plan.expected_code and 400 <= int(error.get("http_status", 0)) < 500
        return ok and status < 500, f"status {status}, {error}"
    if status != 200 or "error" in reply:
        return False, f"status {status}, {str(reply)[:300]}"
    explanation = reply.get("explanation")
    if plan.method == "none":
        return explanation is None and "label" in reply, "prediction"
    ok = isinstance(explanation, dict) and explanation.get("method") == plan.method and bool(explanation.get("scores"))
    return ok, f"status {status}, method {explanation and explanation.get('method')}"


@dataclass
class LoadReport:
    """All outcomes of a load run and the figures derived from them."""

    outcomes: list[Outcome] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def good_failures(self) -> list[Outcome]:
        """Good requests that did not get their correct answer."""
        return [outcome for outcome in self.outcomes if outcome.good and not outcome.ok]

    @property
    def bad_misanswered(self) -> list[Outcome]:
        """Bad requests that did not get their 4xx error."""
        return [outcome for outcome in self.outcomes if not outcome.good and not outcome.ok]

    def summary(self) -> dict[str, Any]:
        """Counts by protocol/kind, failures, throughput and latency percentiles (ms)."""
        latencies = sorted((outcome.finished - outcome.started) * 1000 for outcome in self.outcomes)

        def pct(q: float) -> float:
            return round(latencies[min(len(latencies) - 1, int(q * len(latencies)))], 1) if latencies else 0.0

        return {
            "requests": len(self.outcomes),
            "good": sum(outcome.good for outcome in self.outcomes),
            "bad": sum(not outcome.good for outcome in self.outcomes),
            "rest": sum(outcome.protocol == "rest" for outcome in self.outcomes),
            "grpc": sum(outcome.protocol == "grpc" for outcome in self.outcomes),
            "methods": sorted({outcome.method for outcome in self.outcomes}),
            "good_failures": len(self.good_failures),
            "bad_misanswered": len(self.bad_misanswered),
            "seconds": round(self.seconds, 1),
            "per_second": round(len(self.outcomes) / self.seconds, 1) if self.seconds else 0.0,
            "p50_ms": pct(0.5),
            "p99_ms": pct(0.99),
            "max_ms": pct(1.0),
        }


def run_load(
    server: Server,
    *,
    concurrency: int,
    seconds: float,
    max_requests: int,
    bad_fraction: float = 0.05,
    seed: int = 0,
    request_timeout: float = 60.0,
    on_progress: Callable[[float], None] | None = None,
) -> LoadReport:
    """Mixed load: ``concurrency`` threads, each alternating REST and gRPC (JSON body, or protobuf for one request
    in four on gRPC), random methods and models, ``bad_fraction`` bad requests, until ``seconds`` have passed or
    ``max_requests`` were sent. ``on_progress(elapsed)`` is called by thread 0 between requests (for fault
    injection).
    """
    report = LoadReport()
    lock = threading.Lock()
    sent = [0]
    image = png_bytes()
    messages = protos.explain_messages()
    started = time.monotonic()
    deadline = started + seconds

    def take() -> bool:
        with lock:
            if sent[0] >= max_requests or time.monotonic() >= deadline:
                return False
            sent[0] += 1
            return True

    def worker(index: int) -> None:
        rng = random.Random(seed * 1000 + index)
        caller = GrpcCaller(server)
        try:
            turn = index
            while take():
                plan = make_plan(rng, bad_fraction, image)
                protocol = "rest" if turn % 2 == 0 else "grpc"
                turn += 1
                begin = time.monotonic()
                ok, status, detail = _send(server, caller, messages, plan, protocol, rng, request_timeout)
                outcome = Outcome(protocol, plan.model, plan.method, plan.good, ok, status, begin, time.monotonic())
                if not ok:
                    outcome = Outcome(**{**outcome.__dict__, "detail": detail})
                with lock:
                    report.outcomes.append(outcome)
                if index == 0 and on_progress is not None:
                    on_progress(time.monotonic() - started)
        finally:
            caller.close()

    threads = [threading.Thread(target=worker, args=(index,), daemon=True) for index in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=seconds + request_timeout + 30)
    report.seconds = time.monotonic() - started
    if any(thread.is_alive() for thread in threads):
        raise RuntimeError("load threads still running after their deadline: a request hung")
    return report


def _send(
    server: Server, caller: GrpcCaller, messages: Any, plan: Plan, protocol: str, rng: random.Random, timeout: float
) -> tuple[bool, str, str]:
    """Send one planned request; returns (correct, status, detail)."""
    if protocol == "rest":
        try:
            status, reply = rest_call(server, plan.model, plan.body, timeout=timeout)
        except OSError as error:
            timed_out = isinstance(error, TimeoutError) or isinstance(getattr(error, "reason", None), TimeoutError)
            return False, "TIMEOUT" if timed_out else "connection", repr(error)
        ok, detail = check_reply(plan, status, reply)
        return ok, str(status), detail
    try:
        if plan.good and rng.random() < 0.25:
            return _send_protobuf(caller, messages, plan, timeout)
        raw = caller.predict(plan.model, {"body": plan.body}, timeout=timeout)
    except grpc.RpcError as error:
        return False, error.code().name, str(error.details())
    try:
        reply = json.loads(raw)
    except ValueError:
        return False, "OK", f"non-JSON reply {raw[:200]!r}"
    ok, detail = check_reply(plan, 200 if "error" not in reply else int(reply["error"]["http_status"]), reply)
    return ok, "OK", detail


def _send_protobuf(caller: GrpcCaller, messages: Any, plan: Plan, timeout: float) -> tuple[bool, str, str]:
    document = json.loads(plan.body)
    request = messages.ExplainRequest()
    if "text" in document:
        request.text = document["text"]
    else:
        request.image = png_bytes()
    if "explain" in document:
        request.explain.method = document["explain"]["method"]
        for key, value in document["explain"].items():
            if key != "method":
                request.explain.options[key] = value
    raw = caller.predict(plan.model, {"request": request.SerializeToString()}, timeout=timeout)
    reply = messages.ExplainResponse.FromString(raw)
    if reply.HasField("error"):
        return False, "OK", f"protobuf error {reply.error.code}: {reply.error.message}"
    if plan.method == "none":
        return not reply.HasField("explanation"), "OK", "prediction"
    ok = reply.explanation.method == plan.method and len(reply.explanation.scores) > 0
    return ok, "OK", f"method {reply.explanation.method}"


def log_figures(name: str, figures: dict[str, Any], path: Path | None = None) -> None:
    """Log the figures of a run (and append them as one JSON line to ``path`` if given)."""
    logger.warning("%s: %s", name, json.dumps(figures))
    if path is not None:
        with path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps({"test": name, **figures}) + "\n")


def iter_lines(text: str) -> Iterator[str]:
    """Non-comment, non-blank lines of a Prometheus exposition."""
    return (line for line in text.splitlines() if line and not line.startswith("#"))
