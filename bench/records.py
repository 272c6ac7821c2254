"""What a record costs: the time to commit one batch's records (one transaction) to a store, by payload mode and
batch size, and the records per second one writer reaches.

    python -m bench.records                                   # SQLite in a temporary folder
    python -m bench.records --store postgresql://explain@db/bench --store sqlite:///srv/records.sqlite3

Each row is a classification answer with a 30-token explanation, like the default sentiment model's. A SQLite store
commits with ``synchronous=FULL`` (one fsync per batch in WAL mode), so its time is mostly the disk's; a PostgreSQL
store's is the server's commit (its own fsync) and one round trip per statement. The served throughput cost of
records is this time per batch against the batch's model time; ``python -m bench.records_cost`` measures it through
the doors (docs/RECORDS.md, "Cost").
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from records import build_record, open_store
from records.event import Record


def _record(request: int, index: int) -> Record:
    tokens = [f"tok{i}" for i in range(30)]
    answer = {
        "label": "positive",
        "label_id": 2,
        "probabilities": {"negative": 0.05, "neutral": 0.1, "positive": 0.85},
        "explanation": {"method": "attnlrp", "options": {}, "tokens": tokens, "scores": [0.01 * i for i in range(30)]},
    }
    text = "the service was quick and friendly but the food arrived cold and the waiter never came back"
    return build_record(
        model="sentiment", version="sha256:" + "ab" * 32, task="classification", door="torchserve",
        request_id=f"bench-{request}", index=index, answer=answer,
        input={"text": text, "explain": {"method": "attnlrp"}}, timings={"model": 0.004},
    )  # fmt: skip


def measure(url: str, payload: str, batch_size: int, batches: int) -> tuple[float, float, float]:
    """Median and 99th-percentile milliseconds per batch, and records per second, of ``batches`` commits."""
    with open_store(url, payload=payload) as store:
        made = [[_record(number, index) for index in range(batch_size)] for number in range(batches)]
        store.write(made[0])  # the connection and the file are warm
        seconds = []
        started = time.perf_counter()
        for batch in made[1:]:
            begin = time.perf_counter()
            store.write(batch)
            seconds.append(time.perf_counter() - begin)
        total = time.perf_counter() - started
    ordered = sorted(seconds)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return statistics.median(seconds) * 1e3, p99 * 1e3, batch_size * len(seconds) / total


def main() -> None:
    """Print the table for each store, payload mode and batch size."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--store", action="append", help="a store URL (default: SQLite in a temporary folder)")
    parser.add_argument("--batches", type=int, default=200, help="batches per row of the table")
    parser.add_argument("--batch-sizes", default="1,8,32", help="comma-separated batch sizes")
    args = parser.parse_args()
    sizes = [int(size) for size in args.batch_sizes.split(",")]
    with tempfile.TemporaryDirectory() as folder:
        stores = args.store or [f"sqlite:///{Path(folder) / 'bench.sqlite3'}"]
        print(f"{'store':<12} {'payload':<8} {'batch':>5} {'p50 ms':>8} {'p99 ms':>8} {'records/s':>10}")
        for url in stores:
            for payload in ("full", "hash", "none"):
                for size in sizes:
                    p50, p99, rate = measure(url, payload, size, args.batches)
                    kind = url.split(":", 1)[0]
                    print(f"{kind:<12} {payload:<8} {size:>5} {p50:>8.2f} {p99:>8.2f} {rate:>10.0f}")


if __name__ == "__main__":
    main()
