"""Bounded load generator for the served explanation service (REST and gRPC).

``python -m bench.load [--tiny] [--requests N] [--methods ...]`` starts its own TorchServe on free loopback ports
serving the sentiment model twice — ``batched`` (the ``cpu`` profile: batchSize 8, maxBatchDelay 2 ms) and ``b1``
(batchSize 1) — then, for each variant, protocol (REST, gRPC), concurrency (1, 16) and method, sends a fixed number
of requests of ~30-token texts and reports throughput and p50/p95/p99 latency. It also times the same rows
in-process (the worker's own code path, one row at a time) so the serving overhead at concurrency 1 can be read off.
The server is stopped by its pid at the end, also on errors.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import yaml

from bench.common import (
    cpu_profile,
    grpc_caller,
    make_texts,
    percentile,
    request_body,
    rest_caller,
    run_cell,
    sentiment_archive,
)
from doors.models import default_model_store
from doors.torchserve.config import Ports
from doors.torchserve.process import start, stop

logger = logging.getLogger(__name__)

DEFAULT_METHODS = ("none", "attention", "rollout", "relevance", "gae")


@dataclass(frozen=True)
class Cell:
    """One measured configuration and its results."""

    variant: str
    protocol: str
    concurrency: int
    method: str
    requests: int
    errors: int
    seconds: float
    throughput: float
    p50_ms: float
    p95_ms: float
    p99_ms: float


class InProcess:
    """The worker's code path (decode + service + encode) run in this process, one row at a time: the reference
    for the serving overhead at concurrency 1. Measured right before the served cells it is compared with, so that
    background load affects both alike."""

    def __init__(self, archive: Path, methods: list[str], warm_text: str) -> None:
        """Load the model of ``archive`` and warm up every method's path."""
        from serving_core.config import HandlerConfig
        from serving_core.tasks.classify_service import ExplanationService

        self.config = HandlerConfig.from_model_yaml(yaml.safe_load((archive / "model-config.yaml").read_text()))
        self.service = ExplanationService(self.config, archive / self.config.model_dir, torch.device("cpu"))
        for method in methods:
            self.p50(method, [warm_text])

    def seconds(self, method: str, text: str) -> float:
        """Seconds to serve ``text`` alone with ``method`` (decode, explain, encode)."""
        from serving_core.tasks.classify_schema import decode_row, encode_outcome
        from serving_core.wire import row_encoding

        row = {"body": request_body(text, method)}
        started = time.perf_counter()
        outcomes, _ = self.service.run([decode_row(row, False, self.config)], [row_encoding(row)])
        encode_outcome(outcomes[0], self.config.labels)
        return time.perf_counter() - started

    def p50(self, method: str, texts: list[str]) -> float:
        """Median seconds to serve each of ``texts`` alone with ``method``."""
        return statistics.median(self.seconds(method, text) for text in texts)

    def paired_gap(self, call: Callable[[bytes], bool], method: str, texts: list[str]) -> float:
        """Median over ``texts`` of (served seconds − in-process seconds), the two timed back to back for each text,
        so that the machine's drifting speed cancels out of the serving overhead."""
        gaps = []
        for text in texts:
            in_process = self.seconds(method, text)
            started = time.perf_counter()
            call(request_body(text, method))
            gaps.append(time.perf_counter() - started - in_process)
        return statistics.median(gaps)


def format_table(cells: list[Cell], baseline: dict[str, float], gaps: dict[str, float] | None = None) -> str:
    """A markdown table of the cells, plus the batching speed-up and the concurrency-1 overhead (``gaps``: the
    paired served − in-process medians of the batched variant, in seconds, by ``protocol:method``)."""
    gaps = gaps or {}
    lines = [
        "| variant | protocol | conc. | method | req/s | p50 ms | p95 ms | p99 ms | errors |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for cell in cells:
        lines.append(
            f"| {cell.variant} | {cell.protocol} | {cell.concurrency} | {cell.method} | {cell.throughput:.1f} "
            f"| {cell.p50_ms:.1f} | {cell.p95_ms:.1f} | {cell.p99_ms:.1f} | {cell.errors} |"
        )
    lines += [
        "",
        "| protocol | method | batched/b1 req/s at c=16 | in-process p50 ms | served p50 - in-process (c=1) ms "
        "| paired gap (c=1) ms |",
    ]
    lines.append("|---|---|---:|---:|---|---:|")
    index = {(c.variant, c.protocol, c.concurrency, c.method): c for c in cells}
    for protocol in sorted({c.protocol for c in cells}):
        for method in sorted({c.method for c in cells}):
            batched, single = index.get(("batched", protocol, 16, method)), index.get(("b1", protocol, 16, method))
            speedup = batched.throughput / single.throughput if batched and single and single.throughput else 0.0
            base = baseline.get(f"{protocol}:{method}", float("nan")) * 1000
            overheads = ", ".join(
                f"{variant} {index[(variant, protocol, 1, method)].p50_ms - base:+.1f}"
                for variant in ("batched", "b1")
                if (variant, protocol, 1, method) in index
            )
            gap = gaps.get(f"{protocol}:{method}", float("nan")) * 1000
            lines.append(f"| {protocol} | {method} | {speedup:.2f}x | {base:.1f} | {overheads} | {gap:+.1f} |")
    lines.append("")
    for protocol in sorted({c.protocol for c in cells}):
        batched, single = (
            index.get(("batched", protocol, 16, "relevance")),
            index.get(("b1", protocol, 16, "relevance")),
        )
        if batched and single:
            ratio = batched.throughput / single.throughput
            verdict = "met" if ratio >= 2 else "NOT met"
            lines.append(f"goal {protocol}: relevance batched/b1 throughput at c=16 = {ratio:.2f}x (>= 2x: {verdict})")
        if f"{protocol}:relevance" in gaps:
            gap = gaps[f"{protocol}:relevance"] * 1000
            verdict = "met" if gap <= 10 else "NOT met"
            lines.append(
                f"goal {protocol}: relevance c=1 served - in-process, median of back-to-back pairs = {gap:+.1f} ms "
                f"(<= 10: {verdict})"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(prog="python -m bench.load", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="use the tiny test archives (no real model needed)")
    parser.add_argument("--model-store", type=Path, default=default_model_store())
    parser.add_argument("--requests", type=int, default=64, help="requests per cell at concurrency 16")
    parser.add_argument("--requests-c1", type=int, default=24, help="requests per cell at concurrency 1")
    parser.add_argument("--methods", nargs="+", default=list(DEFAULT_METHODS), help="'none' = prediction only")
    parser.add_argument("--protocols", nargs="+", default=["rest", "grpc"], choices=["rest", "grpc"])
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 16])
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads of the workers and the in-process baseline"
    )
    parser.add_argument("--out", type=Path, default=Path("run") / "bench-load.json")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    store, archive = sentiment_archive(parser, args.tiny, args.model_store)
    relative = str(archive.resolve().relative_to(store.resolve()))
    models = {"batched": relative, "b1": relative}
    profile = cpu_profile(args.threads)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    overrides = {"batched": profile, "b1": {**profile, "batchSize": 1, "maxBatchDelay": 1}}
    texts = make_texts(max(args.requests, args.requests_c1))
    in_process = InProcess(archive, args.methods, texts[0])
    baseline: dict[str, float] = {}
    gaps: dict[str, float] = {}
    run_dir = Path("run") / "bench"
    server = start(run_dir, store, models, Ports.free(), timeout=300, overrides=overrides)
    cells: list[Cell] = []
    try:
        callers = {
            (variant, protocol): (rest_caller if protocol == "rest" else grpc_caller)(server, variant)
            for variant in models
            for protocol in args.protocols
        }
        for call in callers.values():
            run_cell(call, [request_body(text, "relevance") for text in texts[:8]], 4)  # warm-up
        # Variants interleaved cell by cell, so that load from elsewhere on the machine hits both alike.
        for protocol in args.protocols:
            for concurrency in args.concurrency:
                count = args.requests if concurrency > 1 else args.requests_c1
                for method in args.methods:
                    bodies = [request_body(text, method) for text in texts[:count]]
                    if concurrency == 1:
                        baseline[f"{protocol}:{method}"] = in_process.p50(method, texts[:count])
                        gaps[f"{protocol}:{method}"] = in_process.paired_gap(
                            callers[("batched", protocol)], method, texts[:count]
                        )
                    for variant in models:
                        latencies, errors, seconds = run_cell(callers[(variant, protocol)], bodies, concurrency)
                        milliseconds = [value * 1000 for value in latencies]
                        cell = Cell(
                            variant, protocol, concurrency, method, len(bodies), errors, round(seconds, 3),
                            round(len(bodies) / seconds, 2), percentile(milliseconds, 0.5),
                            percentile(milliseconds, 0.95), percentile(milliseconds, 0.99),
                        )  # fmt: skip
                        cells.append(cell)
                        logger.info("%s", cell)
    finally:
        stop(run_dir)
    table = format_table(cells, baseline, gaps)
    print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "cells": [asdict(c) for c in cells],
                "in_process_p50_s": baseline,
                "paired_gap_s": gaps,
                "tiny": args.tiny,
            },
            indent=2,
        )
    )
    return 0 if all(cell.errors == 0 for cell in cells) else 1


if __name__ == "__main__":
    sys.exit(main())
