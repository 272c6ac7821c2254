"""What records cost served throughput: the same model served through TorchServe's door with records off and with
records on (payload ``full``), in one run, taking turns at the same concurrency.

    python -m bench.records_cost --tiny                      # the tiny test model, SQLite in a temporary folder
    python -m bench.records_cost                             # the default sentiment model (model_store/build)
    python -m bench.records_cost --tiny --store postgresql://explain@db/bench   # also a PostgreSQL store
    python -m bench.records_cost --tiny --door kserve        # the KServe door (no router either way)

Servers, started side by side (the ``cpu`` profile: one worker, batches of up to 8, one torch thread each):

- ``off``: records off, as such a deployment runs (no router in front of TorchServe);
- ``off+router``: records off, the router in front (records on put it there: this isolates the records' own cost);
- ``full sqlite`` (and ``full postgresql`` with ``--store``): ``EXPLAIN_RECORDS`` on, payload ``full``,
  ``on_store_error: refuse``: every answer leaves after its batch's record is committed.

Each round sends ``--requests`` requests of ~30-token texts per method (``none``: a prediction, where records cost the
most relative to the model; ``attnlrp``: an explanation, whose record is larger) from ``--concurrency`` closed-loop
clients over kept-alive REST connections, to each server in turn (the order reversed every other round, so that load
from elsewhere hits them alike). Reported: each server's throughput and p50/p99 latency per method over all rounds,
the ratios ``full / off`` and ``full / off+router`` (goal: at least 0.90, records cost at most 10 %), the records the
store holds against the answers served, and the load average. Every server is stopped at the end, also on errors.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.common import (
    cpu_profile,
    environment,
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
from doors.torchserve.process import Server, start, stop

logger = logging.getLogger(__name__)

#: The records settings' environment variables (cleared for the servers without records).
RECORDS_VARIABLES = ("EXPLAIN_RECORDS", "EXPLAIN_RECORDS_PAYLOAD", "EXPLAIN_RECORDS_ON_STORE_ERROR",
                     "EXPLAIN_RECORDS_RETENTION_DAYS")  # fmt: skip


@dataclass(frozen=True)
class Served:
    """One server of the run."""

    name: str
    #: The records store's URL (None: records off).
    store: str | None
    #: Whether the router is in front of TorchServe.
    router: bool


@dataclass
class Row:
    """One server and method over every round."""

    server: str
    method: str
    concurrency: int
    requests: int
    errors: int
    seconds: float
    throughput: float
    p50_ms: float
    p99_ms: float


def start_served(served: Served, run_dir: Path, store: Path, archive: Path, threads: int) -> Server:
    """Start ``served``'s TorchServe (records by its store, the router as it says)."""
    values: dict[str, str | None] = dict.fromkeys(RECORDS_VARIABLES)
    if served.store is not None:
        values.update(EXPLAIN_RECORDS=served.store, EXPLAIN_RECORDS_PAYLOAD="full",
                      EXPLAIN_RECORDS_ON_STORE_ERROR="refuse")  # fmt: skip
    values["OMP_NUM_THREADS"] = str(threads)
    with environment(values):
        return start(run_dir, store, {"sentiment": str(archive.resolve())}, Ports.free(), timeout=600,
                     overrides={"sentiment": cpu_profile(threads)}, router=served.router)  # fmt: skip


def start_kserve(served: Served, run_dir: Path, archive: Path, threads: int) -> Callable[[bytes], bool]:
    """Start ``served``'s KServe door (records by its store); its OIP REST caller (:func:`bench.doors.oip_caller`)."""
    from bench.doors import oip_caller
    from doors.kserve import launch

    env = {name: "" for name in RECORDS_VARIABLES}
    if served.store is not None:
        env.update(
            EXPLAIN_RECORDS=served.store, EXPLAIN_RECORDS_PAYLOAD="full", EXPLAIN_RECORDS_ON_STORE_ERROR="refuse"
        )
    env["OMP_NUM_THREADS"] = str(threads)
    ports = Ports.free()
    launch.start("kserve", {"sentiment": archive}, run_dir, ports.inference, ports.grpc_inference, timeout=600, env=env)
    call: Callable[[bytes], bool] = oip_caller("127.0.0.1", ports.inference, ports.grpc_inference, "rest", "sentiment")
    return call


def oip_body(text: str, method: str) -> bytes:
    """The body :func:`bench.doors.oip_caller` takes."""
    return json.dumps([method, text]).encode()


def stored_records(url: str) -> int:
    """How many records the store holds."""
    from records import open_store

    count = 0
    with open_store(url) as store:
        cursor = None
        while True:
            page = store.list(limit=1000, cursor=cursor)
            count += len(page.records)
            cursor = page.next_cursor
            if cursor is None:
                return count


def measure(
    calls: dict[str, Callable[[bytes], bool]],
    body: Callable[[str, str], bytes],
    methods: list[str],
    requests: int,
    rounds: int,
    concurrency: int,
) -> tuple[list[Row], dict[tuple[str, str], list[float]]]:
    """Send every round's requests (``body(text, method)``) to each server's ``call`` in turn: one row per server and
    method, and each round's throughput per server and method."""
    warm = [body(text, method) for method in methods for text in make_texts(16, seed=99)]
    for call in calls.values():  # the connections, the worker and the store are warm
        run_cell(call, warm, concurrency)
    latencies: dict[tuple[str, str], list[float]] = {}
    per_round: dict[tuple[str, str], list[float]] = {}
    errors: dict[tuple[str, str], int] = {}
    for index in range(rounds):
        order = list(calls) if index % 2 == 0 else list(reversed(calls))
        for method in methods:
            bodies = [body(text, method) for text in make_texts(requests, seed=index)]
            for name in order:
                values, failed, wall = run_cell(calls[name], bodies, concurrency)
                key = (name, method)
                latencies.setdefault(key, []).extend(values)
                per_round.setdefault(key, []).append(len(bodies) / wall)
                errors[key] = errors.get(key, 0) + failed
        logger.info("round %d of %d done; load average %s", index + 1, rounds, load_average())
    rows = []
    for method in methods:
        for name in calls:
            key = (name, method)
            done = len(latencies[key])
            seconds = sum(requests / rate for rate in per_round[key])
            rows.append(Row(name, method, concurrency, done, errors[key], round(seconds, 2),
                            round(done / seconds, 1), round(percentile(latencies[key], 0.5) * 1000, 1),
                            round(percentile(latencies[key], 0.99) * 1000, 1)))  # fmt: skip
    return rows, per_round


@dataclass(frozen=True)
class Ratio:
    """A records server's throughput over a server without records, for one method.

    Attributes:
        method: The method.
        server: The records server.
        base: The server without records.
        pooled: Throughput over all rounds, over the base's.
        median: The median of the rounds' ratios (each round's pair ran back to back: robust to load from elsewhere
            that drifts between rounds).
        low: The lowest round's ratio.
        high: The highest round's ratio.
    """

    method: str
    server: str
    base: str
    pooled: float
    median: float
    low: float
    high: float


def ratios(rows: list[Row], per_round: dict[tuple[str, str], list[float]]) -> list[Ratio]:
    """Each records server's throughput over each server without records, per method."""
    found = []
    for row in rows:
        if not row.server.startswith("full"):
            continue
        for base in rows:
            if base.method == row.method and base.server.startswith("off"):
                mine, theirs = per_round[(row.server, row.method)], per_round[(base.server, base.method)]
                rounds = [ours / other for ours, other in zip(mine, theirs, strict=True)]
                found.append(Ratio(row.method, row.server, base.server, round(row.throughput / base.throughput, 3),
                                   round(statistics.median(rounds), 3), round(min(rounds), 3),
                                   round(max(rounds), 3)))  # fmt: skip
    return found


def format_table(rows: list[Row], found: list[Ratio], counts: dict[str, tuple[int, int]]) -> str:
    """The table, the ratios and the record counts."""
    lines = [f"{'server':<18} {'method':<8} {'conc':>4} {'requests':>8} {'errors':>6} {'req/s':>8} {'p50 ms':>8} "
             f"{'p99 ms':>8}"]  # fmt: skip
    for row in rows:
        lines.append(f"{row.server:<18} {row.method:<8} {row.concurrency:>4} {row.requests:>8} {row.errors:>6} "
                     f"{row.throughput:>8.1f} {row.p50_ms:>8.1f} {row.p99_ms:>8.1f}")  # fmt: skip
    lines.append("")
    for ratio in found:
        lines.append(f"{ratio.method:<8} {ratio.server} / {ratio.base}: median of rounds {ratio.median:.3f} "
                     f"(records cost {100 * (1 - ratio.median):.1f} %; rounds {ratio.low:.3f}..{ratio.high:.3f}; "
                     f"pooled {ratio.pooled:.3f})")  # fmt: skip
    for name, (stored, answered) in counts.items():
        lines.append(f"{name}: {stored} records in the store for {answered} answers (warm-up included)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(prog="python -m bench.records_cost", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="the tiny test archive (no real model needed)")
    parser.add_argument("--model-store", type=Path, default=default_model_store())
    parser.add_argument("--store", action="append", default=[], help="another records store to compare (a URL)")
    parser.add_argument("--requests", type=int, default=200, help="per server, method and round")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--methods", default="none,attnlrp", help="comma-separated; none: a prediction")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    parser.add_argument("--door", choices=["torchserve", "kserve"], default="torchserve")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    model_store, archive = sentiment_archive(parser, args.tiny, args.model_store)
    methods = [method.strip() for method in args.methods.split(",") if method.strip()]
    with tempfile.TemporaryDirectory(prefix="bench-records-") as folder:
        base = Path(folder)
        served = [Served("off", None, False)]
        if args.door == "torchserve":  # records on put the router in front: "off+router" isolates their own cost
            served.append(Served("off+router", None, True))
        served.append(Served("full sqlite", f"sqlite:///{base / 'records.sqlite3'}", True))
        for index, url in enumerate(args.store, start=2):
            name = f"full {url.split(':', 1)[0]}"
            served.append(Served(name if all(item.name != name for item in served) else f"{name} {index}", url, True))
        calls: dict[str, Callable[[bytes], bool]] = {}
        run_dirs = {item.name: base / f"run-{index}" for index, item in enumerate(served)}
        print(f"load average before: {load_average()}")
        try:
            for item in served:
                logger.info("starting %s", item.name)
                if args.door == "kserve":
                    calls[item.name] = start_kserve(item, run_dirs[item.name], archive, args.threads)
                else:
                    server = start_served(item, run_dirs[item.name], model_store, archive, args.threads)
                    calls[item.name] = rest_caller(server, "sentiment")
            body = oip_body if args.door == "kserve" else request_body
            rows, per_round = measure(calls, body, methods, args.requests, args.rounds, args.concurrency)
        finally:
            for name in calls:
                if args.door == "kserve":
                    from doors.kserve import launch

                    launch.stop(run_dirs[name])
                else:
                    stop(run_dirs[name])
        counts: dict[str, tuple[int, int]] = {}
        for item in served:
            if item.store is not None:
                answered = sum(row.requests - row.errors for row in rows if row.server == item.name)
                counts[item.name] = (stored_records(item.store), answered + 16 * len(methods))
    found = ratios(rows, per_round)
    print(f"{args.door}: {'tiny' if args.tiny else 'default'} sentiment model, REST, concurrency {args.concurrency}, "
          f"{args.rounds} rounds of {args.requests} requests per server and method")  # fmt: skip
    print(format_table(rows, found, counts))
    print(f"load average after: {load_average()}")
    if args.json is not None:
        document: dict[str, Any] = {
            "rows": [asdict(row) for row in rows],
            "ratios": [asdict(item) for item in found],
            "records": counts,
            "load_average": load_average(),
        }
        args.json.write_text(json.dumps(document, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
