"""Predictions next to explanations: how much explanation rows slow the prediction rows batched with them.

TorchServe answers a batch together, so a prediction-only row waits for the gradient pass of the explanation rows
that were batched with it. ``python -m bench.mix`` starts its own TorchServe on free loopback ports serving the
sentiment model (the ``cpu`` profile: batchSize 8, maxBatchDelay 2 ms), then sends, with ``--concurrency`` closed-loop
clients (default 8), fixed sequences of requests of ~30-token texts in which a share of the requests (``--shares``,
default 0 and 0.25) ask for ``--method`` (default ``attnlrp``) and the others for a prediction only. The shares are
interleaved round by round (``--rounds``), so that load from elsewhere on the machine hits each alike. It reports
the prediction requests' p50/p99 latency per share and their ratio to the 0% share, and the explanation requests'.

``--serving`` chooses the set-ups compared (default both, each its own TorchServe, started together and measured in
turns within each round): ``shared``, one pool of workers for every request (the default serving), and ``pooled``,
the model with an explanation pool (``sentiment.explain``, the same batch settings, behind the router:
docs/SERVING.md, "Predictions next to explanations"), where explanation requests never share a batch with
predictions. Both tables take the ``shared`` 0% row as the base of their ratios.

The servers are stopped by their pids at the end, also on errors.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.common import cpu_profile, make_texts, percentile, request_body, rest_caller, run_cell, sentiment_archive
from doors.models import default_model_store
from doors.torchserve.config import POOL_KEY, POOL_SETTINGS, Ports
from doors.torchserve.process import Server, start, stop

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Share:
    """The measured latencies of one explanation share, over all rounds."""

    share: float
    predictions: int
    explanations: int
    errors: int
    prediction_p50_ms: float
    prediction_p99_ms: float
    explanation_p50_ms: float
    explanation_p99_ms: float
    seconds: float


def mixed_kinds(count: int, share: float) -> list[bool]:
    """``count`` request kinds (``True`` = explanation), ``share`` of them explanations, spread evenly (every
    ``1/share``-th request), so that each batch of a closed loop holds about the same mix."""
    explained = round(count * share)
    return [int((index + 1) * explained / count) > int(index * explained / count) for index in range(count)]


def run_mix(
    call: Callable[[bytes], bool], texts: list[str], kinds: list[bool], method: str, concurrency: int
) -> tuple[list[tuple[bool, float]], int, float]:
    """Send one request per text with ``concurrency`` closed-loop clients (:func:`bench.common.run_cell`), ``method``
    where ``kinds`` says explanation, else a prediction; returns (kind, seconds) per request, the error count and the
    wall seconds."""
    bodies = [request_body(text, method if explained else "none") for text, explained in zip(texts, kinds, strict=True)]
    latencies, errors, seconds = run_cell(call, bodies, concurrency)
    return list(zip(kinds, latencies, strict=True)), errors, seconds


def summarise(share: float, results: list[tuple[bool, float]], errors: int, seconds: float) -> Share:
    """Percentiles of the prediction and explanation requests of one share."""
    predictions = [elapsed * 1000 for explained, elapsed in results if not explained]
    explanations = [elapsed * 1000 for explained, elapsed in results if explained]
    return Share(
        share, len(predictions), len(explanations), errors,
        round(percentile(predictions, 0.5), 1), round(percentile(predictions, 0.99), 1),
        round(percentile(explanations, 0.5), 1), round(percentile(explanations, 0.99), 1), round(seconds, 2),
    )  # fmt: skip


def format_table(shares: list[Share], method: str, label: str, base: Share | None = None) -> str:
    """A markdown table: prediction p50/p99 per share and the slowdown against ``base`` (default: the share 0 row)."""
    base = base or next((share for share in shares if share.share == 0), None)
    lines = [
        f"| serving | {method} share | predictions | prediction p50 ms | prediction p99 ms | p50 / 0% | p99 / 0% "
        f"| {method} p50 ms | {method} p99 ms | errors |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for share in shares:
        p50 = share.prediction_p50_ms / base.prediction_p50_ms if base else float("nan")
        p99 = share.prediction_p99_ms / base.prediction_p99_ms if base else float("nan")
        explanation = "-" if not share.explanations else f"{share.explanation_p50_ms:.1f}"
        explanation99 = "-" if not share.explanations else f"{share.explanation_p99_ms:.1f}"
        lines.append(
            f"| {label} | {share.share:.0%} | {share.predictions} | {share.prediction_p50_ms:.1f} "
            f"| {share.prediction_p99_ms:.1f} | {p50:.2f}x | {p99:.2f}x | {explanation} | {explanation99} "
            f"| {share.errors} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(prog="python -m bench.mix", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="use the tiny test archives (no real model needed)")
    parser.add_argument("--model-store", type=Path, default=default_model_store())
    parser.add_argument("--method", default="attnlrp")
    parser.add_argument("--shares", type=float, nargs="+", default=[0.0, 0.25])
    parser.add_argument("--requests", type=int, default=96, help="requests per share and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--threads", type=int, default=None, help="torch threads of the worker(s)")
    parser.add_argument("--serving", nargs="+", choices=["shared", "pooled"], default=["shared", "pooled"])
    parser.add_argument("--out", type=Path, default=Path("run") / "bench-mix.json")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    store, archive = sentiment_archive(parser, args.tiny, args.model_store)
    relative = str(archive.resolve().relative_to(store.resolve()))
    profile = cpu_profile(args.threads)
    pool = {key: profile[key] for key in POOL_SETTINGS if key in profile}
    setups = {"shared": profile, "pooled": {**profile, POOL_KEY: pool}}
    texts = make_texts(args.requests)
    servers: dict[str, Server] = {}
    collected: dict[tuple[str, float], list[tuple[bool, float]]] = {
        (name, share): [] for name in args.serving for share in args.shares
    }
    errors = dict.fromkeys(collected, 0)
    seconds = dict.fromkeys(collected, 0.0)
    try:
        for name in args.serving:
            run_dir = Path("run") / f"bench-mix-{name}"
            overrides = {"sentiment": setups[name]}
            servers[name] = start(
                run_dir, store, {"sentiment": relative}, Ports.free(), timeout=300, overrides=overrides
            )
        calls = {name: rest_caller(server, "sentiment") for name, server in servers.items()}
        for call in calls.values():
            run_mix(call, texts[:16], mixed_kinds(16, 0.5), args.method, args.concurrency)  # warm-up, both kinds
        for _ in range(args.rounds):
            for name, call in calls.items():
                for share in args.shares:
                    kinds = mixed_kinds(len(texts), share)
                    results, failed, wall = run_mix(call, texts, kinds, args.method, args.concurrency)
                    collected[name, share] += results
                    errors[name, share] += failed
                    seconds[name, share] += wall
                    logger.info("%s, share %.0f%%: %d requests in %.1f s, %d errors", name, share * 100,
                                len(results), wall, failed)  # fmt: skip
    finally:
        for server in servers.values():
            stop(server.run_dir)
    tables = {
        name: [
            summarise(share, collected[name, share], errors[name, share], seconds[name, share]) for share in args.shares
        ]
        for name in args.serving
    }
    base = next((share for share in tables.get("shared", []) if share.share == 0), None)
    load = os.getloadavg()
    labels = {"shared": "one pool", "pooled": "explanation pool"}
    for name, shares in tables.items():
        print(format_table(shares, args.method, labels[name], base))
    print(f"\nload average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; concurrency {args.concurrency}; "
          f"{args.rounds} rounds x {args.requests} requests per share; tiny={args.tiny}")  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    document = {name: [asdict(share) for share in shares] for name, shares in tables.items()}
    args.out.write_text(json.dumps(document, indent=2))
    return 0 if all(share.errors == 0 for shares in tables.values() for share in shares) else 1


if __name__ == "__main__":
    sys.exit(main())
