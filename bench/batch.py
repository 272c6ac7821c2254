"""explain-batch's throughput against the library's own batched loop on the same rows (issue 36, point 5).

One run, on the sentiment classifier (the tiny test archive with ``--tiny``, else the built one; or any text
classifier's archive or checkpoint folder, ``--model PATH``), ``--rows`` texts of about 30 tokens explained by
``--method``:

- **library**: ``explainers.explain(model, tokenizer(batch, padding=True), method)`` over batches of
  ``--batch-size`` texts, with the model and tokenizer the serving core loads (:mod:`serving_core.loading`);
- **explain_batch**: the library's batched API as the serving core calls it, on the same tokenized batches:
  ``explainers.explain_batch`` with each row's request as the serving core decodes it and the served model's memory
  and time budgets (each row admitted at the model's served speed): the floor of what a served batch costs, its
  rows checked one by one;
- **service.run**: the same texts decoded beforehand (``task.decode``) and served by the serving core's
  ``service.run`` in batches of the same size: the batched path explain-batch drives, without reading, encoding and
  writing lines;
- **explain-batch**: the same texts as Batch API lines ``{"text", "explain": {"method"}}`` through
  :class:`batch.BatchJob` (read the JSONL, decode, ``service.run``, ``to_dict``, write and flush per batch), the model
  loaded before the clock starts, as the library's is.

Each is warmed up on one batch first, then the four are timed ``--rounds`` times in turn (library, explain_batch,
service.run, explain-batch, again), so that a machine shared with other work slows each alike; the table gives
each one's median seconds and rows/s, its ratio to the library's (goal for explain-batch: at least 0.9), and the
same ratio in CPU seconds of this process (``time.process_time``: what the other processes of a loaded machine
disturb least). On a tiny model the serving core's own per-row work (decoding and checking each row, the time
budget's admission of each row, the answer's document) weighs more than on a real one, whose passes dominate.
``--ray ADDRESS`` also times the job on that Ray cluster once (model loads included: each actor loads its own).

    python -m bench.batch --tiny --rows 1024 --threads 1
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from batch import BatchJob, JobSpec, LoadedModel, open_model
from bench.common import load_average, make_texts, sentiment_archive
from explain_eval.provenance import machine
from explainers import explain, explain_batch
from serving_core.loading import load_classifier, load_tokenizer, worker_device
from serving_core.wire import Encoding


class Clock:
    """Wall-clock and CPU seconds (this process's: ``time.process_time``) since it was made."""

    def __init__(self) -> None:
        """Start now."""
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def read(self) -> tuple[float, float]:
        """``(wall-clock seconds, CPU seconds)`` so far."""
        return time.perf_counter() - self.wall, time.process_time() - self.cpu


def library_loop(
    model: torch.nn.Module, tokenizer: object, texts: list[str], method: str, batch_size: int, max_length: int
) -> tuple[float, float]:
    """Wall-clock and CPU seconds the library's batched loop takes over ``texts``."""
    clock = Clock()
    for start in range(0, len(texts), batch_size):
        inputs = tokenizer(  # type: ignore[operator]
            texts[start : start + batch_size], return_tensors="pt", padding=True, truncation=True, max_length=max_length
        )
        explain(model, inputs, method)
    return clock.read()


def library_batch_loop(
    loaded: LoadedModel, tokenizer: object, texts: list[str], method: str, batch_size: int
) -> tuple[float, float]:
    """Wall-clock and CPU seconds the library's ``explain_batch`` takes over ``texts``, with each row's request as
    the serving core decodes it, the served model's budgets and its served speed (as
    :mod:`serving_core.tasks.classify_service` calls it)."""
    config = loaded.model.config
    service: Any = loaded.service
    body = {"explain": {"method": method}}
    requests = [loaded.task.decode_row({"body": {"text": text, **body}}, False, config).request for text in texts]
    clock = Clock()
    for start in range(0, len(texts), batch_size):
        inputs = tokenizer(  # type: ignore[operator]
            texts[start : start + batch_size],
            return_tensors="pt",
            padding=True,
            truncation=True,
            max_length=config.max_length,
        )
        explain_batch(
            service.model,
            dict(inputs),
            requests[start : start + batch_size],
            memory_budget_mib=config.memory_budget_mib,
            time_budget_s=config.time_budget_s,
            speed=service.served,
        )
    return clock.read()


def service_loop(loaded: LoadedModel, texts: list[str], method: str, batch_size: int) -> tuple[float, float]:
    """Wall-clock and CPU seconds the serving core's ``service.run`` takes over ``texts`` decoded beforehand."""
    config = loaded.model.config
    rows = [
        loaded.task.decode_row({"body": {"text": text, "explain": {"method": method}}}, False, config) for text in texts
    ]
    clock = Clock()
    for start in range(0, len(rows), batch_size):
        chunk = rows[start : start + batch_size]
        loaded.service.run(chunk, [Encoding.JSON] * len(chunk))
    return clock.read()


def job_run(
    folder: Path,
    archive: Path,
    texts: list[str],
    method: str,
    batch_size: int,
    loaded: LoadedModel,
    ray: str | None = None,
) -> tuple[float, float]:
    """Wall-clock and CPU seconds explain-batch takes over ``texts`` (their input file written first, a fresh output
    in ``folder``)."""
    source = folder / f"in-{len(texts)}.jsonl"
    with source.open("w") as file:
        for index, text in enumerate(texts):
            line = {
                "custom_id": f"r{index}",
                "method": "POST",
                "url": "/predictions/sentiment",
                "body": {"text": text, "explain": {"method": method}},
            }
            file.write(json.dumps(line) + "\n")
    output = Path(tempfile.mkdtemp(dir=folder)) / "out.jsonl"
    job = BatchJob(JobSpec(source, output, (loaded.model,), batch_size=batch_size))
    clock = Clock()
    if ray is not None:
        from batch.ray_job import run_on_ray

        counts = run_on_ray(job, ray, progress=False)
    else:
        counts = job.run(progress=False, loaded={"sentiment": loaded})
    seconds = clock.read()
    if counts.completed != len(texts):
        raise RuntimeError(f"explain-batch answered {counts.completed} of {len(texts)} rows: see {output}")
    return seconds


def main() -> None:
    """Run the benchmark and print its table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="the tiny test archive (built when missing)")
    parser.add_argument("--model-store", type=Path, default=Path("model_store/build"))
    parser.add_argument("--model", type=Path, help="a text classifier's archive or checkpoint folder to time instead")
    parser.add_argument("--rows", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--method", default="attnlrp")
    parser.add_argument("--rounds", type=int, default=3, help="times each run is timed, in turn (default: 3)")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    parser.add_argument("--ray", metavar="ADDRESS", help="also time the job on this Ray cluster")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    archive = args.model if args.model is not None else sentiment_archive(parser, args.tiny, args.model_store)[1]
    model_spec = open_model("sentiment", archive)
    config = model_spec.config
    if config.input_kind != "text":
        parser.error(f"{archive} is a {config.task} model: the benchmark explains texts")
    device = worker_device(config)
    model = load_classifier(config, model_spec.model_dir, device)
    tokenizer = load_tokenizer(model_spec.model_dir, model, config.pad_token_id)
    loaded = LoadedModel(model_spec)
    texts = make_texts(args.rows)
    warm = texts[: args.batch_size]
    size = args.batch_size
    times: dict[str, list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-batch-") as work:
        folder = Path(work)
        library_loop(model, tokenizer, warm, args.method, size, config.max_length)
        job_run(folder, archive, warm, args.method, size, loaded)
        service_loop(loaded, warm, args.method, size)
        library_batch_loop(loaded, tokenizer, warm, args.method, size)
        runs: dict[str, Callable[[], tuple[float, float]]] = {
            "library": lambda: library_loop(model, tokenizer, texts, args.method, size, config.max_length),
            "explain_batch": lambda: library_batch_loop(loaded, tokenizer, texts, args.method, size),
            "service.run": lambda: service_loop(loaded, texts, args.method, size),
            "explain-batch": lambda: job_run(folder, archive, texts, args.method, size, loaded),
        }
        for _ in range(args.rounds):
            for name, run in runs.items():
                times.setdefault(name, []).append(run())
        on_ray = job_run(folder, archive, texts, args.method, size, loaded, args.ray)[0] if args.ray else None
    what = "tiny sentiment" if args.tiny and args.model is None else str(archive)
    print(
        f"# explain-batch vs the library's batched loop: {args.rows} rows, {args.method}, batch {size}, {what} on "
        f"{device}; medians of {args.rounds} rounds; {machine()}; load {load_average()}"
    )
    library = statistics.median(wall for wall, _ in times["library"])
    library_cpu = statistics.median(cpu for _, cpu in times["library"])
    print(f"{'run':<17} {'seconds':>8} {'rows/s':>8} {'ratio':>6} {'cpu ratio':>9}")
    for name, measured in times.items():
        seconds = statistics.median(wall for wall, _ in measured)
        cpu = statistics.median(cpu for _, cpu in measured)
        print(f"{name:<17} {seconds:8.2f} {args.rows / seconds:8.1f} {library / seconds:6.2f} {library_cpu / cpu:9.2f}")
    if on_ray is not None:
        print(f"{'explain-batch ray':<17} {on_ray:8.2f} {args.rows / on_ray:8.1f} {library / on_ray:6.2f} {'':>9}")


if __name__ == "__main__":
    main()
