"""``explain-batch``: a file of inputs explained offline, as ``vllm run-batch`` runs one (docs/BATCH.md).

``explain-batch INPUT -o OUTPUT --model NAME=PATH [--model ...]`` answers every line of INPUT (the OpenAI Batch API's
JSONL, or a Parquet table with ``--text-column``/``--image-column``, ``--id-column`` and ``--explain``) in this
process through the serving core's batched path, with a progress bar and a summary line, resumably
(:mod:`batch.job`); ``--ray ADDRESS`` runs the same job on a Ray cluster (:mod:`batch.ray_job`).

Exit status: 0 when every line was answered with a 2xx status, 1 when some lines failed (the error file has them),
2 for a job that could not run (bad arguments, a model that cannot be loaded, another job's output).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from .inputs import TableColumns
from .job import BatchJob, JobSpec, summary_line
from .manifest import ForeignOutputError
from .models import open_model, parse_model_spec


def json_value(text: str) -> object:
    """``--explain``'s JSON value.

    Raises:
        argparse.ArgumentTypeError: if it is not JSON.
    """
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"not JSON ({error.msg}): {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    parser = argparse.ArgumentParser(
        prog="explain-batch",
        description="Explain a file of inputs offline: the OpenAI Batch API's JSONL lines, or a Parquet table.",
    )
    parser.add_argument("input", type=Path, help="JSONL ({custom_id, method, url, body} per line) or Parquet")
    parser.add_argument("-o", "--output", type=Path, required=True, help="the output JSONL (resumed if it exists)")
    parser.add_argument(
        "--model",
        action="append",
        required=True,
        metavar="NAME=PATH",
        help="a model: an archive folder (model-config.yaml) or a checkpoint folder; repeatable",
    )
    parser.add_argument("--errors", type=Path, help="the error file (default: OUTPUT.errors.jsonl)")
    parser.add_argument("--batch-size", type=int, help="requests per batch (default: each model's batchSize)")
    table = parser.add_argument_group("Parquet input")
    table.add_argument("--text-column", help="the column of texts (a causal LM's prompts)")
    table.add_argument("--image-column", help="the column of image paths (relative to the table) or image bytes")
    table.add_argument("--id-column", default="id", help="the column of row ids (default: id)")
    table.add_argument(
        "--explain",
        type=json_value,
        metavar="JSON",
        help='each row\'s "explain", e.g. \'{"method": "attnlrp"}\' (default: a prediction only)',
    )
    table.add_argument("--table-model", metavar="NAME", help="the model the rows go to (default: the only --model)")
    ray = parser.add_argument_group("Ray")
    ray.add_argument("--ray", metavar="ADDRESS", help="run on the Ray cluster at ADDRESS (e.g. 127.0.0.1:6379, auto)")
    ray.add_argument("--actors", type=int, default=2, help="most model actors on the cluster (default: 2)")
    ray.add_argument("--actor-cpus", type=float, default=1.0, help="CPUs of each actor (default: 1)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def is_parquet(path: Path, args: argparse.Namespace) -> bool:
    """Whether the input is a Parquet table (its suffix, or a column option given)."""
    return path.suffix.lower() in (".parquet", ".pq") or bool(args.text_column or args.image_column)


def spec_from_args(args: argparse.Namespace) -> JobSpec:
    """The job the arguments describe (models opened, not loaded).

    Raises:
        ValueError, FileNotFoundError: for arguments that do not describe a job.
    """
    if not args.input.is_file():
        raise FileNotFoundError(f"{args.input} is not a file")
    models = tuple(open_model(*parse_model_spec(spec)) for spec in args.model)
    columns = None
    if is_parquet(args.input, args):
        table_model = args.table_model or (models[0].name if len(models) == 1 else None)
        if table_model is None:
            raise ValueError("a Parquet table goes to one model: name it with --table-model")
        columns = TableColumns(table_model, args.id_column, args.text_column, args.image_column, args.explain)
    elif args.explain is not None:
        raise ValueError("--explain is for a Parquet table: JSONL lines carry their own 'explain'")
    return JobSpec(args.input, args.output, models, columns, args.errors, args.batch_size)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``explain-batch``; the exit status (module docstring)."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    try:
        job = BatchJob(spec_from_args(args))
        if args.ray:
            from .ray_job import run_on_ray

            counts = run_on_ray(job, args.ray, args.actors, args.actor_cpus, progress=not args.no_progress)
        else:
            counts = job.run(progress=not args.no_progress)
    except (ValueError, FileNotFoundError, ForeignOutputError) as error:
        print(f"explain-batch: {error}", file=sys.stderr)
        return 2
    print(summary_line(counts, job.spec.output, job.errors_path), flush=True)
    return 0 if counts.failed == 0 else 1


def entry_point() -> None:
    """The ``explain-batch`` console script."""
    sys.exit(main())
