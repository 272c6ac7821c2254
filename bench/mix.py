"""Predictions next to explanations: how much explanation rows slow the prediction rows batched with them.

TorchServe answers a batch together, so a prediction-only row waits for the gradient pass of the explanation rows
that were batched with it. ``python -m bench.mix`` starts its own TorchServe on free loopback ports serving the
sentiment model (the ``cpu`` profile: batchSize 8, maxBatchDelay 2 ms), then sends, with ``--concurrency`` closed-loop
clients (default 8), fixed sequences of requests of ~30-token texts in which a share of the requests (``--shares``,
default 0 and 0.25) ask for ``--method`` (default ``attnlrp``) and the others for a prediction only. The shares are
interleaved round by round (``--rounds``), so that load from elsewhere on the machine hits each alike. It reports
the prediction requests' p50/p99 latency per share and their ratio to the 0% share, and the explanation requests'.

The server is stopped by its pid at the end, also on errors.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.load import _document, _rest_caller, make_texts, percentile
from model_store.serving.config import DEFAULT_MODEL_STORE, Ports, load_profile
from model_store.serving.process import start, stop

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
    """Send one request per text with ``concurrency`` closed-loop clients; returns (kind, seconds) per request, the
    error count and the wall seconds."""
    results: list[tuple[bool, float]] = []
    errors = 0
    lock = threading.Lock()
    index = 0

    def worker() -> None:
        nonlocal index, errors
        while True:
            with lock:
                if index >= len(texts):
                    return
                position = index
                index += 1
            explained = kinds[position]
            body = _document(texts[position], method if explained else "none")
            started = time.perf_counter()
            ok = call(body)
            elapsed = time.perf_counter() - started
            with lock:
                results.append((explained, elapsed))
                errors += 0 if ok else 1

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results, errors, time.perf_counter() - started


def summarise(share: float, results: list[tuple[bool, float]], errors: int, seconds: float) -> Share:
    """Percentiles of the prediction and explanation requests of one share."""
    predictions = [elapsed * 1000 for explained, elapsed in results if not explained]
    explanations = [elapsed * 1000 for explained, elapsed in results if explained]
    return Share(
        share, len(predictions), len(explanations), errors,
        round(percentile(predictions, 0.5), 1), round(percentile(predictions, 0.99), 1),
        round(percentile(explanations, 0.5), 1), round(percentile(explanations, 0.99), 1), round(seconds, 2),
    )  # fmt: skip


def format_table(shares: list[Share], method: str, label: str) -> str:
    """A markdown table: prediction p50/p99 per share and the slowdown against the share 0 row."""
    base = next((share for share in shares if share.share == 0), None)
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
    parser.add_argument("--model-store", type=Path, default=DEFAULT_MODEL_STORE)
    parser.add_argument("--method", default="attnlrp")
    parser.add_argument("--shares", type=float, nargs="+", default=[0.0, 0.25])
    parser.add_argument("--requests", type=int, default=96, help="requests per share and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--threads", type=int, default=None, help="torch threads of the worker(s)")
    parser.add_argument("--out", type=Path, default=Path("run") / "bench-mix.json")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    if args.tiny:
        from model_store.build import build_tiny_archives

        store = Path("build") / "test-archives"
        archive = build_tiny_archives(store)["sentiment"]
    else:
        store = args.model_store
        archive = store / "sentiment" / "archive"
        if not (archive / "MAR-INF" / "MANIFEST.json").is_file():
            parser.error(f"no archive at {archive}: run `python -m model_store.build --only sentiment` or pass --tiny")
    relative = str(archive.resolve().relative_to(store.resolve()))
    profile = load_profile("cpu")
    if args.threads is not None:
        profile["handler"] = {**profile.get("handler", {}), "threads": args.threads}
    models, overrides = {"sentiment": relative}, {"sentiment": profile}
    texts = make_texts(args.requests)
    run_dir = Path("run") / "bench-mix"
    server = start(run_dir, store, models, Ports.free(), timeout=300, overrides=overrides)
    collected: dict[float, list[tuple[bool, float]]] = {share: [] for share in args.shares}
    errors = dict.fromkeys(args.shares, 0)
    seconds = dict.fromkeys(args.shares, 0.0)
    try:
        call = _rest_caller(server, "sentiment")
        run_mix(call, texts[:16], mixed_kinds(16, 0.5), args.method, args.concurrency)  # warm-up, both kinds
        for _ in range(args.rounds):
            for share in args.shares:
                results, failed, wall = run_mix(
                    call, texts, mixed_kinds(len(texts), share), args.method, args.concurrency
                )
                collected[share] += results
                errors[share] += failed
                seconds[share] += wall
                logger.info("share %.0f%%: %d requests in %.1f s, %d errors", share * 100, len(results), wall, failed)
    finally:
        stop(run_dir)
    shares = [summarise(share, collected[share], errors[share], seconds[share]) for share in args.shares]
    load = os.getloadavg()
    label = "one pool"
    print(format_table(shares, args.method, label))
    print(f"\nload average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; concurrency {args.concurrency}; "
          f"{args.rounds} rounds x {args.requests} requests per share; tiny={args.tiny}")  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"shares": [asdict(share) for share in shares]}, indent=2))
    return 0 if all(share.errors == 0 for share in shares) else 1


if __name__ == "__main__":
    sys.exit(main())
