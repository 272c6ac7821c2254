"""Helpers of the operations tests (hardening, reliability, fuzz, deploy): one TorchServe for all of them, worker
pids and memory, and a bounded mixed-load generator over REST and gRPC, for TorchServe's protocol
(:class:`TorchServeTarget`) and for the Open Inference Protocol of the KServe and Ray Serve doors (:class:`OipTarget`).

The server is the same launcher and tiny archives as tests/integration (``doors.torchserve.process.start``,
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
from typing import Any, Protocol

import grpc
import psutil
import pytest

from doors.torchserve.config import Ports
from doors.torchserve.process import Server, start, stop
from explain_client import protos
from explainers import available_methods
from tests.serving_support import b64, http_call, http_post, png_bytes, tiny_archives

logger = logging.getLogger(__name__)

_SHARED: dict[str, Server] = {}
#: Load outcome statuses of a request that got no answer before its client deadline (REST, gRPC).
NO_ANSWER = frozenset({"TIMEOUT", "DEADLINE_EXCEEDED"})
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
    #: Whether a failure is one a client sends again (503 / ``UNAVAILABLE``, TorchServe's "Worker died." 507 /
    #: ``RESOURCE_EXHAUSTED``, or no connection); ``False`` for a success.
    retryable: bool = False


@dataclass(frozen=True)
class Sent:
    """What one request got: whether it was the correct answer, the status (HTTP status, gRPC code, ``connection``
    or ``TIMEOUT``), a detail for failures, and whether a failure is retryable (:attr:`Outcome.retryable`)."""

    ok: bool
    status: str
    detail: str = ""
    retryable: bool = False


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


def make_plan(
    rng: random.Random,
    bad_fraction: float,
    image: bytes,
    bad: tuple[tuple[bytes, str], ...] = _BAD_TEXT,
    image_share: float = 0.25,
) -> Plan:
    """A random request: text or image (``image_share`` of them), prediction or any registered method,
    ``bad_fraction`` bad (one of ``bad``: body and the error code it must get)."""
    if rng.random() < bad_fraction:
        body, code = rng.choice(bad)
        return Plan("sentiment", "bad", body, good=False, expected_code=code)
    method = rng.choice(["none", *available_methods()])
    explain: dict[str, Any] = {} if method == "none" else {"explain": {"method": method}}
    if method == "integrated_gradients":
        explain["explain"]["n_steps"] = 8
    if rng.random() >= image_share:
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


class Caller(Protocol):
    """One load thread's connections to a door."""

    def send(self, plan: Plan, protocol: str, rng: random.Random, timeout: float) -> Sent:
        """Send one planned request over ``protocol`` (``rest`` or ``grpc``) and check its answer."""
        ...

    def close(self) -> None:
        """Close the connections."""
        ...


class LoadTarget(Protocol):
    """A door under load: what it is asked and how (:func:`run_load`)."""

    def plan(self, rng: random.Random, bad_fraction: float, image: bytes) -> Plan:
        """The next request to send."""
        ...

    def caller(self) -> Caller:
        """New connections for one load thread."""
        ...


class TorchServeTarget:
    """TorchServe's protocol (or the router's in front of it): JSON bodies on REST, on gRPC as JSON ``body`` or (one
    good request in four) a protobuf ``ExplainRequest``; text (3 in 4) and image models, the TorchServe bad bodies."""

    def __init__(self, server: Server, image_share: float = 0.25) -> None:
        """Load ``server``'s public inference ports."""
        self.server = server
        self.image_share = image_share
        self._messages = protos.explain_messages()

    def plan(self, rng: random.Random, bad_fraction: float, image: bytes) -> Plan:
        """A :func:`make_plan` request."""
        return make_plan(rng, bad_fraction, image, image_share=self.image_share)

    def caller(self) -> Caller:
        """One gRPC channel, REST per request."""
        return _TorchServeCaller(self.server, self._messages)


class _TorchServeCaller:
    def __init__(self, server: Server, messages: Any) -> None:
        self.server = server
        self.messages = messages
        self.grpc = GrpcCaller(server)

    def send(self, plan: Plan, protocol: str, rng: random.Random, timeout: float) -> Sent:
        return _send(self.server, self.grpc, self.messages, plan, protocol, rng, timeout)

    def close(self) -> None:
        self.grpc.close()


def run_load(
    target: Server | LoadTarget,
    *,
    concurrency: int,
    seconds: float,
    max_requests: int,
    bad_fraction: float = 0.05,
    seed: int = 0,
    request_timeout: float = 60.0,
    on_progress: Callable[[float], None] | None = None,
    until: Callable[[float], bool] | None = None,
    backoff: float = 0.0,
) -> LoadReport:
    """Mixed load: ``concurrency`` threads, each alternating REST and gRPC, requests of ``target``'s plans (a
    :class:`Server`: :class:`TorchServeTarget`), ``bad_fraction`` bad, until ``seconds`` have passed, ``max_requests``
    were sent or ``until(elapsed)`` holds. ``on_progress(elapsed)`` is called by thread 0 between requests (for fault
    injection). A thread whose request failed retryably waits ``backoff`` seconds before its next one, as a client that
    retries would (else a door that refuses connections while it restarts is sent thousands of requests a second).
    """
    door: LoadTarget = TorchServeTarget(target) if isinstance(target, Server) else target
    report = LoadReport()
    lock = threading.Lock()
    sent = [0]
    image = png_bytes()
    started = time.monotonic()
    deadline = started + seconds

    def take() -> bool:
        with lock:
            now = time.monotonic()
            if sent[0] >= max_requests or now >= deadline or (until is not None and until(now - started)):
                return False
            sent[0] += 1
            return True

    def worker(index: int) -> None:
        rng = random.Random(seed * 1000 + index)
        caller = door.caller()
        try:
            turn = index
            while take():
                plan = door.plan(rng, bad_fraction, image)
                protocol = "rest" if turn % 2 == 0 else "grpc"
                turn += 1
                begin = time.monotonic()
                result = caller.send(plan, protocol, rng, request_timeout)
                outcome = Outcome(protocol, plan.model, plan.method, plan.good, result.ok, result.status, begin,
                                  time.monotonic(), "" if result.ok else result.detail,
                                  not result.ok and result.retryable)  # fmt: skip
                with lock:
                    report.outcomes.append(outcome)
                if outcome.retryable and backoff:
                    time.sleep(backoff)
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


def torchserve_retryable(status: str, detail: str) -> bool:
    """Whether a failed TorchServe call is one a client sends again: a full queue or an unreachable upstream (503 /
    ``UNAVAILABLE``, no connection), or the request's worker died under it (REST 507 "Worker died.", gRPC
    ``RESOURCE_EXHAUSTED``, TorchServe's mapping of 507, or ``INTERNAL`` "Worker died." when the worker was killed
    while its batch was in flight; ``ExplainClient`` resends those)."""
    return status in ("503", "connection", "UNAVAILABLE") or (
        status in ("507", "RESOURCE_EXHAUSTED", "INTERNAL") and "Worker died" in detail
    )


def _send(
    server: Server, caller: GrpcCaller, messages: Any, plan: Plan, protocol: str, rng: random.Random, timeout: float
) -> Sent:
    """Send one planned request to TorchServe's protocol and check the answer."""
    ok, status, detail = _send_torchserve(server, caller, messages, plan, protocol, rng, timeout)
    return Sent(ok, status, detail, not ok and torchserve_retryable(status, detail))


#: Bad requests of the OIP doors, as the TorchServe documents they translate from (:func:`oip_request`), and the
#: error code each must get. Invalid JSON has no OIP form; non-UTF-8 text is sent as raw BYTES on gRPC only.
_BAD_OIP: tuple[tuple[bytes, str], ...] = (
    (json.dumps({"explain": True}).encode(), "missing_text"),
    (json.dumps({"text": "hi", "explain": {"method": "lime"}}).encode(), "unknown_method"),
    (json.dumps({"text": "hi", "explain": {"method": "attnlrp", "target": "furious"}}).encode(), "invalid_target"),
    (json.dumps({"text": "hi", "explain": {"method": "rollout", "start_layer": 99}}).encode(), "invalid_option"),
    (json.dumps({"image": "AAAA"}).encode(), "unsupported_input"),
    (json.dumps({"text": "x" * 20_001}).encode(), "text_too_long"),
)


def oip_request(document: dict[str, Any], protocol: str) -> tuple[list[Any], dict[str, Any]]:
    """A TorchServe JSON document as the OIP explain extension's inputs and parameters (``text``/``image`` BYTES
    inputs, base64 images on REST and raw bytes on gRPC; ``explain_method``, ``explain_target``,
    ``explain_option_<name>``)."""
    import base64

    from bench.oip_client import Input

    inputs = []
    if "text" in document:
        inputs.append(Input("text", "BYTES", [document["text"]]))
    if "image" in document:
        image = document["image"] if protocol == "rest" else base64.b64decode(document["image"])
        inputs.append(Input("image", "BYTES", [image]))
    parameters: dict[str, Any] = {}
    explain = document.get("explain")
    if isinstance(explain, dict):
        parameters["explain_method"] = explain.get("method", "default")
        if "target" in explain:
            parameters["explain_target"] = explain["target"]
        parameters.update({f"explain_option_{key}": value for key, value in explain.items()
                           if key not in ("method", "target")})  # fmt: skip
    elif explain:
        parameters["explain_method"] = "default"
    return inputs, parameters


class OipTarget:
    """The Open Inference Protocol of the KServe and Ray Serve doors (REST and gRPC; :mod:`bench.oip_client`): the
    same requests as :class:`TorchServeTarget` (:func:`oip_request`) and the OIP-expressible bad ones."""

    def __init__(self, host: str, rest_port: int, grpc_port: int, image_share: float = 0.25) -> None:
        """Load the door at ``host``."""
        self.host, self.rest_port, self.grpc_port = host, rest_port, grpc_port
        self.image_share = image_share

    def plan(self, rng: random.Random, bad_fraction: float, image: bytes) -> Plan:
        """A :func:`make_plan` request with the OIP bad requests."""
        return make_plan(rng, bad_fraction, image, bad=_BAD_OIP, image_share=self.image_share)

    def caller(self) -> Caller:
        """One REST connection and one gRPC channel."""
        return _OipCaller(self)


class _OipCaller:
    def __init__(self, target: OipTarget) -> None:
        self.target = target
        self.clients: dict[tuple[str, float], Any] = {}

    def _client(self, protocol: str, timeout: float) -> Any:
        from bench.oip_client import GrpcOip, RestOip

        key = (protocol, timeout)
        if key not in self.clients:
            target = self.target
            self.clients[key] = (
                RestOip(target.host, target.rest_port, timeout=timeout) if protocol == "rest"
                else GrpcOip(f"{target.host}:{target.grpc_port}", timeout=timeout)
            )  # fmt: skip
        return self.clients[key]

    def send(self, plan: Plan, protocol: str, rng: random.Random, timeout: float) -> Sent:
        from bench.oip_client import OipCallError
        from serving_core.errors import ERROR_TABLE

        inputs, parameters = oip_request(json.loads(plan.body), protocol)
        try:
            outputs = self._client(protocol, timeout).infer(plan.model, inputs, parameters)
        except OipCallError as error:
            status = str(error.status)
            if error.status == 0:
                status = "TIMEOUT" if "timed out" in error.message else "connection"
            if plan.good:
                return Sent(False, status, error.message[:300], error.retryable and status != "TIMEOUT")
            code = error.message.split("]")[0].lstrip("[") if error.message.startswith("[") else "?"
            kind = ERROR_TABLE.get(plan.expected_code or "")
            expected = kind is not None and error.status == (kind.http_status if protocol == "rest" else kind.grpc_code)
            ok = code == plan.expected_code and expected
            return Sent(ok, status, error.message[:300], error.retryable and status != "TIMEOUT")
        if not plan.good:
            return Sent(False, "200", f"no error for a bad request (expected {plan.expected_code})")
        methods = outputs.get("explain_method", ([], [""]))[1]
        if plan.method == "none":
            return Sent(not any(methods) and "label_id" in outputs, "200", "prediction")
        scores = outputs.get("scores", ([], []))[1]
        ok = bool(methods) and methods[0] == plan.method and len(scores) > 0
        return Sent(ok, "200", f"method {methods[:1]}")

    def close(self) -> None:
        for client in self.clients.values():
            client.close()


def _send_torchserve(
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
