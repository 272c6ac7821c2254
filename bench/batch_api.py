"""Online latency while a Batch API job runs (docs/BATCH.md "The Batch API", goal: online p99 within 2x of alone).

Starts TorchServe with the Batch API (``batches=True``: the router, the job in a niced child process) serving the
sentiment archive, measures the online ``/predictions`` latency of a closed loop of clients alone, then again while
a batch of explanation lines runs, and prints both, their ratio and the job's progress meanwhile; the batch is
cancelled at the end.

``python -m bench.batch_api --tiny`` (the tiny test archive; without it the built sentiment archive).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import load_average, make_texts, percentile, request_body, rest_caller, run_cell, sentiment_archive


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its table."""
    parser = argparse.ArgumentParser(prog="python -m bench.batch_api", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="serve the tiny test archive")
    parser.add_argument("--model-store", type=Path, default=Path("model_store/build"))
    parser.add_argument("--requests", type=int, default=300, help="online requests per measurement")
    parser.add_argument("--concurrency", type=int, default=2, help="online clients")
    parser.add_argument("--method", default="none", help="the online requests' method (none: predictions)")
    parser.add_argument("--lines", type=int, default=3000, help="the batch's lines (each explained with attnlrp)")
    args = parser.parse_args(argv)

    import openai

    from doors.torchserve.config import Ports
    from doors.torchserve.process import start, stop

    store, archive = sentiment_archive(parser, args.tiny, args.model_store)
    run_dir = Path(tempfile.mkdtemp(prefix="bench-batch-api-"))
    server = start(run_dir, store, {"sentiment": str(archive.resolve())}, Ports.free(), timeout=300, batches=True)
    try:
        call = rest_caller(server, "sentiment")
        bodies = [request_body(text, args.method) for text in make_texts(args.requests, seed=1)]
        run_cell(call, bodies[:20], args.concurrency)  # warm up
        alone, alone_errors, _ = run_cell(call, bodies, args.concurrency)
        client = openai.OpenAI(base_url=f"{server.inference_url}/v1", api_key=server.keys["inference"])
        lines = [
            {"custom_id": f"l{index}", "method": "POST", "url": "/predictions/sentiment",
             "body": {"text": text, "explain": {"method": "attnlrp"}}}
            for index, text in enumerate(make_texts(args.lines, seed=2))
        ]  # fmt: skip
        data = "".join(json.dumps(item) + "\n" for item in lines).encode()
        uploaded = client.files.create(file=("bench.jsonl", data), purpose="batch")
        endpoint: Any = "/predictions/sentiment"  # a model's REST route: not among the client's typed endpoints
        batch = client.batches.create(input_file_id=uploaded.id, endpoint=endpoint, completion_window="24h")

        def completed() -> int:
            counts = client.batches.retrieve(batch.id).request_counts
            return counts.completed if counts is not None else 0

        while completed() == 0:
            time.sleep(0.2)  # the job's child has loaded its model and answers lines
        before = completed()
        during, during_errors, seconds = run_cell(call, bodies, args.concurrency)
        job_rate = (completed() - before) / seconds
        status = client.batches.cancel(batch.id).status
    finally:
        stop(run_dir)
    print(f"online /predictions ({args.method}), {args.requests} requests, {args.concurrency} clients; "
          f"load average {load_average()}")  # fmt: skip
    print("| online | p50 ms | p99 ms | errors |")
    print("|---|---|---|---|")
    for name, latencies, errors in (("alone", alone, alone_errors), ("while a batch runs", during, during_errors)):
        p50, p99 = percentile(latencies, 0.5) * 1000, percentile(latencies, 0.99) * 1000
        print(f"| {name} | {p50:.1f} | {p99:.1f} | {errors} |")
    ratio = percentile(during, 0.99) / percentile(alone, 0.99)
    print(f"p99 ratio {ratio:.2f} (goal <= 2); the batch answered {job_rate:.1f} lines/s meanwhile (then {status})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
