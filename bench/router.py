"""What the router in front of TorchServe costs a plain prediction: the same requests sent to TorchServe's own
inference port (behind the router, on loopback) and through the router (the public port), in one run.

The router takes the public inference ports when it has work (a generation model's OpenAI API, explanation pools:
docs/SERVING.md, "OpenAI API"). ``python -m bench.router`` starts one TorchServe serving the sentiment model (the
``cpu`` profile: batchSize 8, maxBatchDelay 2 ms; ``--tiny``: the tiny test archive) and sends, for each
``--concurrency`` and round, ``--requests`` plain predictions of ~30-token texts over kept-alive connections to each
port in turn (the order alternates between rounds, so that load from elsewhere hits both alike). It reports each
path's p50/p99 latency and the router's share: the difference of the two. The server is stopped at the end, also on
errors.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.common import cpu_profile, make_texts, percentile, request_body, rest_caller, run_cell, sentiment_archive
from doors.models import default_model_store
from doors.torchserve.config import Ports
from doors.torchserve.process import start, stop

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PathLatency:
    """One path's latencies at one concurrency, over every round."""

    path: str
    concurrency: int
    requests: int
    errors: int
    p50_ms: float
    p99_ms: float


def format_table(rows: list[PathLatency]) -> str:
    """The Markdown table: each concurrency's direct and routed p50/p99 and the router's share."""
    lines = [
        "| concurrency | path | requests | errors | p50 ms | p99 ms | router adds p50 ms | router adds p99 ms |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        added = ("", "")
        if row.path == "router":
            direct = next(r for r in rows if r.path == "direct" and r.concurrency == row.concurrency)
            added = (f"{row.p50_ms - direct.p50_ms:+.2f}", f"{row.p99_ms - direct.p99_ms:+.2f}")
        lines.append(
            f"| {row.concurrency} | {row.path} | {row.requests} | {row.errors} | {row.p50_ms:.2f} | {row.p99_ms:.2f} "
            f"| {added[0]} | {added[1]} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(prog="python -m bench.router", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="the tiny test archive (no real model needed)")
    parser.add_argument("--model-store", type=Path, default=default_model_store())
    parser.add_argument("--requests", type=int, default=200, help="per path, concurrency and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    store, archive = sentiment_archive(parser, args.tiny, args.model_store)
    run_dir = Path("build") / "bench-router"
    ports = Ports.free()
    server = start(run_dir, store, {"sentiment": str(archive.resolve())}, ports,
                   overrides={"sentiment": cpu_profile(args.threads)}, router=True)  # fmt: skip
    try:
        paths = {
            "direct": rest_caller(server, "sentiment", ports.upstream_inference),
            "router": rest_caller(server, "sentiment", ports.inference),
        }
        bodies = [request_body(text, "none") for text in make_texts(args.requests)]
        for call in paths.values():  # warm both paths and the worker
            run_cell(call, bodies[:32], 4)
        latencies: dict[tuple[str, int], list[float]] = {}
        errors: dict[tuple[str, int], int] = {}
        for round_index in range(args.rounds):
            order = list(paths) if round_index % 2 == 0 else list(reversed(paths))
            for concurrency in args.concurrency:
                for name in order:
                    values, failed, _ = run_cell(paths[name], bodies, concurrency)
                    latencies.setdefault((name, concurrency), []).extend(values)
                    errors[(name, concurrency)] = errors.get((name, concurrency), 0) + failed
        rows = [
            PathLatency(
                name,
                concurrency,
                len(latencies[(name, concurrency)]),
                errors[(name, concurrency)],
                percentile(latencies[(name, concurrency)], 0.5) * 1000,
                percentile(latencies[(name, concurrency)], 0.99) * 1000,
            )
            for concurrency in args.concurrency
            for name in paths
        ]
    finally:
        stop(run_dir)
    print(format_table(rows))
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(row) for row in rows], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
