"""The soak with records on (tests/integration/test_soak_records.py): a door serving with ``EXPLAIN_RECORDS`` under the
mixed REST/gRPC load of :func:`tests.ops_support.run_load`, its faults, and the verdict on the store.

Every good request carries an id of its own (``X-Request-Id`` on REST, ``x-request-id`` metadata on gRPC) and an input
no other request has (a text with a numbered word at its end; a PNG with the number in a text chunk), and every call
is logged as its client saw it (:class:`Call`). :func:`check_records` then reads the store and finds, for every answer
the client received as served (REST 200, gRPC OK, the correct answer), its record: by the id the answer carries
(REST ``X-Request-Id``, or an ``id`` / ``request_id`` the reply carries), else by the id sent, else by the input
(``payload: full`` keeps it; ``hash`` keeps its salted digest, checked with the store's salt): TorchServe's gRPC
replies say no id, and the router passes none upstream, so there the input is what names the request.

The doors:

- :func:`torchserve_records_soak`: TorchServe with records on (the router in front), the text model on two workers; the
  faults are a SIGKILL of one text worker (TorchServe replaces it) and, in the long run, of the whole service (every
  process of it: TorchServe, its workers, the router, the exporter), which is then started again from the same run
  folder, on the same ports and the same store, as a restart policy would;
- the KServe door (:func:`tests.soak_support.kserve_soak` with the records environment): one process holds the models,
  so its kill is the whole service's, started again on the same store.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import math
import os
import random
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
import psutil

from bench.common import environment
from doors.torchserve.config import Ports
from doors.torchserve.process import Server
from doors.torchserve.process import start as start_torchserve
from doors.torchserve.process import stop as stop_torchserve
from explain_client import protos
from records import open_store
from records.cli import main as records_main
from records.event import canonical_json, input_digest
from records.store import MAX_LIMIT, StoredRecord
from tests.ops_support import (
    Caller,
    OipTarget,
    Plan,
    Sent,
    _OipCaller,
    check_reply,
    make_plan,
    management,
    torchserve_retryable,
    worker_pids,
)
from tests.serving_support import REPO_ROOT, png_bytes
from tests.soak_support import DoorSoak, Kill, one_thread

#: Workers of the text model on TorchServe: the twin answers while a killed one is replaced.
TEXT_WORKERS = 2
#: Seconds after a service killed whole is ready again from which every request must be answered as usual.
SETTLE_S = 2.0


# -- what the client saw --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class IdPlan(Plan):
    """A :class:`~tests.ops_support.Plan` with the id its request is sent with."""

    request_id: str = ""


@dataclass(frozen=True)
class Call:
    """One request of the soak as its client saw it.

    Attributes:
        request_id: The id it was sent with.
        protocol: ``rest`` or ``grpc``.
        model: The model asked.
        method: The explanation method (``none``: a prediction; ``bad``: a bad request).
        good: Whether it was a good request.
        served: Whether the client received it answered as served: REST 200 or gRPC OK with the correct answer.
        answered: Whether the client received any answer (an error included), not a broken connection or a timeout.
        status: The HTTP status or gRPC code (``connection``, ``TIMEOUT`` when there was none).
        reply_id: The id the answer carried, when it carried one.
        content: The input as the door records it (the JSON document or the bytes it received), for matching.
        started: When it was sent (``time.monotonic``).
        finished: When its answer came (or the call failed).
    """

    request_id: str
    protocol: str
    model: str
    method: str
    good: bool
    served: bool
    answered: bool
    status: str
    reply_id: str | None
    content: Mapping[str, Any] | bytes | None
    started: float
    finished: float


@dataclass
class CallLog:
    """Every call of a soak (thread-safe), and the numbering of its requests."""

    run: str = field(default_factory=lambda: f"soak{os.getpid()}x{int(time.time())}")
    calls: list[Call] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _next: int = 0

    def number(self) -> int:
        """The next request's number."""
        with self._lock:
            self._next += 1
            return self._next

    def add(self, call: Call) -> None:
        """Keep a call."""
        with self._lock:
            self.calls.append(call)


def tagged_png(tag: str) -> bytes:
    """The load's test image with ``tag`` in a PNG text chunk: the same picture, bytes no other request sends."""
    from PIL import Image, PngImagePlugin

    info = PngImagePlugin.PngInfo()
    info.add_text("request", tag)
    out = io.BytesIO()
    Image.open(io.BytesIO(png_bytes())).save(out, format="PNG", pnginfo=info)
    return out.getvalue()


def unique_plan(plan: Plan, log: CallLog) -> IdPlan:
    """``plan`` with an id of its own and, when it is a good request, an input no other request of the run has."""
    number = log.number()
    request_id = f"{log.run}-{number}"
    body = plan.body
    if plan.good:
        document = json.loads(body)
        if "text" in document:
            document["text"] = f"{document['text']} n{number}"
        else:
            document["image"] = base64.b64encode(tagged_png(request_id)).decode()
        body = json.dumps(document).encode()
    return IdPlan(plan.model, plan.method, body, plan.good, plan.expected_code, request_id)


def _content(plan: Plan) -> Mapping[str, Any] | bytes:
    """The input as TorchServe's handler records it: the JSON document, else the bytes received."""
    try:
        document = json.loads(plan.body)
    except ValueError:
        return plan.body
    return document if isinstance(document, dict) else plan.body


# -- TorchServe's protocol --------------------------------------------------------------------------------------


class TorchServeRecordsTarget:
    """TorchServe's protocol (through the router) with an id per request: JSON bodies on REST and on gRPC (a protobuf
    ``ExplainRequest`` is recorded without its input, and TorchServe's gRPC reply carries no id, so such an answer
    could not be matched to its record). The keys are read at every call: a service started again has new ones."""

    def __init__(self, box: list[Server], log: CallLog, image_share: float) -> None:
        """Load the service in ``box[0]`` (replaced there when it is started again)."""
        self.box = box
        self.log = log
        self.image_share = image_share

    def plan(self, rng: random.Random, bad_fraction: float, image: bytes) -> Plan:
        """A :func:`~tests.ops_support.make_plan` request, made unique (:func:`unique_plan`)."""
        return unique_plan(make_plan(rng, bad_fraction, image, image_share=self.image_share), self.log)

    def caller(self) -> Caller:
        """One gRPC channel, REST per request."""
        return _TorchServeRecordsCaller(self)


def _inference_key(server: Server) -> str:
    return server.keys["inference"]  # the file is missing while the service starts again: OSError


class _TorchServeRecordsCaller:
    def __init__(self, target: TorchServeRecordsTarget) -> None:
        self.target = target
        self.pb2, stubs = protos.inference_stubs()
        self.channel = grpc.insecure_channel(f"127.0.0.1:{target.box[0].ports.grpc_inference}")
        self.stub = stubs.InferenceAPIsServiceStub(self.channel)

    def send(self, plan: Plan, protocol: str, rng: random.Random, timeout: float) -> Sent:
        assert isinstance(plan, IdPlan)
        started = time.monotonic()
        if protocol == "rest":
            status, reply, reply_id, answered = self._rest(plan, timeout)
        else:
            status, reply, reply_id, answered = self._grpc(plan, timeout)
        if answered and isinstance(reply, dict):
            code = 200 if protocol == "grpc" and "error" not in reply else None
            if protocol == "grpc" and code is None:
                code = int((reply.get("error") or {}).get("http_status", 500))
            ok, detail = check_reply(plan, int(status) if protocol == "rest" else int(code or 200), reply)
            reply_id = reply_id or _body_id(reply)
        else:
            ok, detail = False, str(reply)[:300]
        self.target.log.add(Call(plan.request_id, protocol, plan.model, plan.method, plan.good, ok and plan.good,
                                 answered, status, reply_id, _content(plan), started, time.monotonic()))  # fmt: skip
        # A bad request in a dying worker's batch gets "Worker died." too, which its own detail does not say.
        retryable = torchserve_retryable(status, detail) or torchserve_retryable(status, str(reply))
        return Sent(ok, status, detail, not ok and retryable)

    def _rest(self, plan: IdPlan, timeout: float) -> tuple[str, Any, str | None, bool]:
        server = self.target.box[0]
        try:
            headers = {"Content-Type": "application/json", "X-Request-Id": plan.request_id,
                       "Authorization": f"Bearer {_inference_key(server)}"}  # fmt: skip
            request = urllib.request.Request(f"{server.inference_url}/predictions/{plan.model}", data=plan.body,
                                             headers=headers, method="POST")  # fmt: skip
            try:
                with urllib.request.urlopen(request, timeout=timeout) as response:
                    status, raw, reply_id = response.status, response.read(), response.headers.get("X-Request-Id")
            except urllib.error.HTTPError as error:
                status, raw, reply_id = error.code, error.read(), error.headers.get("X-Request-Id")
        except (OSError, ValueError) as error:
            timed_out = isinstance(error, TimeoutError) or isinstance(getattr(error, "reason", None), TimeoutError)
            return ("TIMEOUT" if timed_out else "connection"), repr(error), None, False
        try:
            reply: Any = json.loads(raw)
        except ValueError:
            reply = raw[:300]
        return str(status), reply, reply_id, True

    def _grpc(self, plan: IdPlan, timeout: float) -> tuple[str, Any, str | None, bool]:
        try:
            metadata = [("authorization", f"Bearer {_inference_key(self.target.box[0])}"),
                        ("x-request-id", plan.request_id)]  # fmt: skip
        except (OSError, ValueError, KeyError) as error:
            return "connection", repr(error), None, False
        request = self.pb2.PredictionsRequest(model_name=plan.model, input={"body": plan.body})
        try:
            reply, call = self.stub.Predictions.with_call(request, metadata=metadata, timeout=timeout)
        except grpc.RpcError as error:
            code = error.code()
            answered = code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
            return code.name, str(error.details()), None, answered
        reply_id = _metadata_id(call)
        try:
            return "OK", json.loads(bytes(reply.prediction)), reply_id, True
        except ValueError:
            return "OK", f"non-JSON reply {bytes(reply.prediction)[:200]!r}", reply_id, True

    def close(self) -> None:
        self.channel.close()


def _body_id(reply: Mapping[str, Any]) -> str | None:
    for key in ("request_id", "id"):
        value = reply.get(key)
        if isinstance(value, str) and value:
            return value
    return None


def _metadata_id(call: Any) -> str | None:
    for pairs in (call.initial_metadata(), call.trailing_metadata()):
        for key, value in pairs or ():
            if key.lower() == "x-request-id" and value:
                return str(value)
    return None


# -- the Open Inference Protocol (KServe door) -------------------------------------------------------------------


class OipRecordsTarget(OipTarget):
    """The KServe door's OIP load (:class:`~tests.ops_support.OipTarget`) with an id per request, sent as
    ``X-Request-Id`` (REST header, gRPC metadata): the door records each row under it."""

    def __init__(self, host: str, rest_port: int, grpc_port: int, image_share: float, log: CallLog) -> None:
        """Load the door at ``host``."""
        super().__init__(host, rest_port, grpc_port, image_share)
        self.log = log

    def plan(self, rng: random.Random, bad_fraction: float, image: bytes) -> Plan:
        """An OIP load request, made unique (:func:`unique_plan`)."""
        return unique_plan(super().plan(rng, bad_fraction, image), self.log)

    def caller(self) -> Caller:
        """One REST connection and one gRPC channel."""
        return _OipRecordsCaller(self)


class _IdClient:
    """An OIP client whose calls carry the current request's id."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.request_id = ""

    def infer(self, model: str, inputs: Any, parameters: Any = None) -> Any:
        return self.inner.infer(model, inputs, parameters, {"X-Request-Id": self.request_id})

    def close(self) -> None:
        self.inner.close()


class _OipRecordsCaller(_OipCaller):
    def __init__(self, target: OipRecordsTarget) -> None:
        super().__init__(target)
        self.log = target.log
        self.current = ""

    def _client(self, protocol: str, timeout: float) -> Any:
        key = (protocol, timeout)
        if key not in self.clients:
            self.clients[key] = _IdClient(super()._client(protocol, timeout))
        client = self.clients[key]
        client.request_id = self.current
        return client

    def send(self, plan: Plan, protocol: str, rng: random.Random, timeout: float) -> Sent:
        assert isinstance(plan, IdPlan)
        self.current = plan.request_id
        started = time.monotonic()
        sent = super().send(plan, protocol, rng, timeout)
        answered = sent.status not in ("connection", "TIMEOUT", "UNAVAILABLE", "DEADLINE_EXCEEDED")
        self.log.add(Call(plan.request_id, protocol, plan.model, plan.method, plan.good, sent.ok and plan.good,
                          answered, sent.status, None, None, started, time.monotonic()))  # fmt: skip
        return sent


# -- the doors ----------------------------------------------------------------------------------------------------


def records_env(store_url: str, payload: str) -> dict[str, str]:
    """The records environment of a soaked service: the store, the payload, and ``refuse`` on a store error (an
    answer leaves only with its record)."""
    return {
        "EXPLAIN_RECORDS": store_url,
        "EXPLAIN_RECORDS_PAYLOAD": payload,
        "EXPLAIN_RECORDS_ON_STORE_ERROR": "refuse",
    }


def service_pids(server: Server) -> list[int]:
    """Every process of a started TorchServe service: TorchServe and its workers, the router, the exporter."""
    pids: list[int] = []
    for process in server.processes.values():
        with contextlib.suppress(psutil.Error):
            pids += [child.pid for child in psutil.Process(process.pid).children(recursive=True)]
        pids.append(process.pid)
    return pids


def torchserve_records_soak(
    run_dir: Path,
    models: dict[str, Path],
    env: Mapping[str, str],
    log: CallLog,
    *,
    worker_kill_at: float | None,
    service_kill_at: float | None,
    limit_s: float = 30.0,
    ready_timeout: float = 600.0,
) -> DoorSoak:
    """TorchServe with records on (``env``: :func:`records_env`), the text model on :data:`TEXT_WORKERS` workers;
    one text worker is SIGKILLed at ``worker_kill_at`` s, and the whole service at ``service_kill_at`` s (then started
    again from ``run_dir`` on the same ports and store); None: no such kill."""
    ports = Ports.free()
    overrides = {name: {"minWorkers": TEXT_WORKERS, "maxWorkers": TEXT_WORKERS} if name == "sentiment"
                 else {"minWorkers": 1, "maxWorkers": 1} for name in models}  # fmt: skip
    archives = {name: str(path.resolve()) for name, path in models.items()}

    def launch() -> Server:
        with one_thread(), environment(env):
            server = start_torchserve(run_dir, REPO_ROOT, archives, ports, timeout=ready_timeout, overrides=overrides)
        try:
            _wait_workers(server, "sentiment", TEXT_WORKERS, ready_timeout)
        except BaseException:
            stop_torchserve(run_dir)
            raise
        return server

    box = [launch()]
    kills: list[Kill] = []
    killed: dict[str, Any] = {}
    if worker_kill_at is not None:

        def kill_worker() -> int:
            killed["worker"] = worker_pids(box[0], "sentiment")[0]
            os.kill(killed["worker"], signal.SIGKILL)
            return int(killed["worker"])

        def worker_back() -> bool:
            pids = worker_pids(box[0], "sentiment")
            return len(pids) == TEXT_WORKERS and killed["worker"] not in pids

        kills.append(Kill("text worker", worker_kill_at, kill_worker, lambda outcome: outcome.model == "sentiment",
                          limit_s=limit_s, ready=lambda: len(worker_pids(box[0], "sentiment")) == TEXT_WORKERS,
                          repaired=worker_back))  # fmt: skip
    if service_kill_at is not None:
        began: list[float] = []

        def kill_service() -> int:
            server = box[0]
            killed["service"] = server.torchserve_pid
            for pid in service_pids(server):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            return server.torchserve_pid

        def restart() -> None:
            for process in box[0].processes.values():
                with contextlib.suppress(Exception):
                    process.wait(timeout=60)  # reap them, as the machine's init would
            stop_torchserve(run_dir)  # the pid files of the dead processes, and the watchdog
            began.append(time.monotonic())
            box[0] = launch()

        def whole_again() -> bool:
            return bool(began) and box[0].torchserve_pid not in (0, killed.get("service"))

        kills.append(Kill("whole service", service_kill_at, kill_service, lambda outcome: True, limit_s=ready_timeout,
                          ready=lambda: all(kill.settled() for kill in kills if kill.name != "whole service"),
                          after=restart, repaired=whole_again, wait_repair=True, settle_s=SETTLE_S,
                          unanswered_limit=math.inf))  # fmt: skip

    def stop() -> None:
        for kill in kills:
            kill.join(ready_timeout)
        stop_torchserve(run_dir)

    status, described = management(box[0], "/models/sentiment")
    batch = int(described[0]["batchSize"]) if status == 200 else 8
    target = TorchServeRecordsTarget(box, log, 0.25 if "digits" in models else 0.0)
    setup = {"models": sorted(models), "workers": {name: TEXT_WORKERS if name == "sentiment" else 1 for name in models},
             "batch_size": batch}  # fmt: skip
    return DoorSoak("torchserve", target, kills, stop, setup)


def _wait_workers(server: Server, model: str, count: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while len(worker_pids(server, model)) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{model} has no {count} READY workers within {timeout} s; see {server.log_dir}")
        time.sleep(0.5)


def oip_records_target(soak: DoorSoak, log: CallLog) -> OipRecordsTarget:
    """The records load of a KServe door soak (:func:`tests.soak_support.kserve_soak`)."""
    base = soak.target
    assert isinstance(base, OipTarget)
    return OipRecordsTarget(base.host, base.rest_port, base.grpc_port, base.image_share, log)


# -- the verdict ----------------------------------------------------------------------------------------------------


def _input_key(content: Mapping[str, Any] | bytes) -> str:
    return (
        canonical_json(content)
        if not isinstance(content, bytes | bytearray)
        else "b64:" + base64.b64encode(bytes(content)).decode()
    )


def _kept_key(event: Mapping[str, Any]) -> str | None:
    """The matching key of a stored record's input: ``full`` its document or bytes, ``hash`` its digest."""
    kept = (event.get("data") or {}).get("input") or {}
    if kept.get("payload") == "full":
        if "document" in kept:
            return canonical_json(kept["document"])
        if "base64" in kept:
            return "b64:" + str(kept["base64"])
    if kept.get("payload") == "hash" and kept.get("sha256"):
        return "sha256:" + str(kept["sha256"])
    return None


def read_records(store_url: str, since: datetime) -> tuple[list[StoredRecord], str]:
    """Every record stored at or after ``since``, oldest first, and the store's salt."""
    found: list[StoredRecord] = []
    with open_store(store_url) as store:
        cursor: str | None = None
        while True:
            page = store.list(since=since, limit=MAX_LIMIT, cursor=cursor)
            found += page.records
            cursor = page.next_cursor
            if cursor is None:
                break
        salt = str(getattr(store, "salt", ""))
    return found, salt


def check_records(store_url: str, calls: list[Call], since: datetime, *, fresh: bool) -> tuple[dict[str, Any],
                                                                                                list[str]]:  # fmt: skip
    """Whether every answer a client received as served has its record in the store, and the chain verifies.

    Args:
        store_url: The store.
        calls: Every call of the soak.
        since: When the soak began (wall time; records from a minute before are read).
        fresh: Whether the store was empty before the soak (then every record read must be one of its requests').

    Returns:
        The figures, and what broke the criteria: a served answer without a record (or with one of another model,
        method, or an error), a record of a fresh store that no request of the soak explains, a chain that does not
        verify (``explain-records verify`` exits non-zero).
    """
    stored, salt = read_records(store_url, since - timedelta(minutes=1))
    by_id: dict[str, list[StoredRecord]] = {}
    by_input: dict[str, list[StoredRecord]] = {}
    for record in stored:
        by_id.setdefault(record.id, []).append(record)
        key = _kept_key(record.event)
        if key is not None:
            by_input.setdefault(key, []).append(record)
    claimed: set[int] = set()
    matched_by = {"reply id": 0, "sent id": 0, "input": 0}
    missing: list[Call] = []
    wrong: list[tuple[Call, str]] = []

    def find(call: Call) -> tuple[StoredRecord | None, str]:
        """The call's record not claimed by another call yet (requests with the same input, bad ones, take turns)."""
        candidates: list[tuple[str, list[StoredRecord]]] = [
            (how, by_id.get(wanted, [])) for how, wanted in (("reply id", call.reply_id), ("sent id", call.request_id))
            if wanted
        ]  # fmt: skip
        if call.content is not None:
            candidates.append(("input", by_input.get(_input_key(call.content), [])))
            if salt:
                candidates.append(("input", by_input.get("sha256:" + input_digest(call.content, salt), [])))
        for how, records in candidates:
            for record in records:
                if record.seq not in claimed:
                    claimed.add(record.seq)
                    return record, how
        return None, ""

    served = [call for call in calls if call.served]
    for call in served:
        found, how = find(call)
        if found is None:
            missing.append(call)
            continue
        matched_by[how] += 1
        data = found.event.get("data") or {}
        method = None if call.method == "none" else call.method
        if data.get("error") is not None:
            wrong.append((call, f"its record has the error {data['error']}"))
        elif (data.get("model") or {}).get("name") != call.model or data.get("method") != method:
            wrong.append((call, f"its record is of {data.get('model')} {data.get('method')}"))
    unanswered = [call for call in calls if not call.answered]
    unanswered_recorded = sum(find(call)[0] is not None for call in unanswered)
    others = [call for call in calls if call.answered and not call.served]
    others_recorded = sum(find(call)[0] is not None for call in others)
    unexplained = [record for record in stored if record.seq not in claimed]
    duplicates = sum(len(records) - 1 for records in by_id.values() if len(records) > 1)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        verified = records_main(["verify", store_url])  # as an operator checks it: `explain-records verify STORE`
    said = out.getvalue().strip().splitlines()
    figures: dict[str, Any] = {
        "calls": len(calls),
        "served": len(served),
        "served_recorded": len(served) - len(missing),
        "matched_by": matched_by,
        "served_missing": len(missing),
        "served_mismatched": len(wrong),
        "unanswered": len(unanswered),
        "unanswered_recorded": unanswered_recorded,
        "answered_not_served": len(others),
        "answered_not_served_recorded": others_recorded,
        "records_read": len(stored),
        "records_unexplained": len(unexplained),
        "duplicate_ids": duplicates,
        "verify_exit": verified,
        "verify": said[-1] if said else "",
    }
    problems: list[str] = []
    if missing:
        hint = ""
        if stored and not by_input and any(call.reply_id is None and call.content is not None for call in missing):
            hint = (" (the records keep no input, payload none, and these answers carried no id: TorchServe's gRPC "
                    "answers can be matched to their records only by their input)")  # fmt: skip
        problems.append(f"{len(missing)} served answers have no record{hint}, e.g. "
                        f"{[call.__dict__ for call in missing[:3]]}")  # fmt: skip
    if wrong:
        problems.append(f"{len(wrong)} served answers have a wrong record, e.g. "
                        f"{[(c.request_id, why) for c, why in wrong[:3]]}")  # fmt: skip
    if fresh and unexplained:
        problems.append(f"{len(unexplained)} records explained by no request of the soak, e.g. "
                        f"{[r.id for r in unexplained[:5]]}")  # fmt: skip
    if verified != 0:
        problems.append(f"explain-records verify exited {verified}: {' / '.join(said[-5:])}")
    return figures, problems


def wall_clock() -> datetime:
    """Now, in UTC (when a soak begins)."""
    return datetime.now(UTC)
