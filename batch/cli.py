"""``explain-batch``: a file of inputs explained offline, as ``vllm run-batch`` runs one (docs/BATCH.md).

``explain-batch INPUT -o OUTPUT --model NAME=PATH [--model ...]`` answers every line of INPUT (the OpenAI Batch API's
JSONL, or a Parquet table with ``--text-column``/``--image-column``, ``--id-column`` and ``--explain``) in this
process through the serving core's batched path, with a progress bar and a summary line, resumably
(:mod:`batch.job`); ``--ray ADDRESS`` runs the same job on a Ray cluster (:mod:`batch.ray_job`).

``explain-batch --from-records -o OUTPUT --model NAME=PATH [--since ISO] [--until ISO] [--store URL] [--explain JSON]``
explains again the stored inputs of NAME's records (:mod:`batch.records_source`), from the store ``--store`` (default:
the deployment's ``EXPLAIN_RECORDS``), with the same output, manifest and resuming.

Exit status: 0 when every line was answered with a 2xx status, 1 when some lines failed (the error file has them),
2 for a job that could not run (bad arguments, a model that cannot be loaded, another job's output).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from records import RecordsError
from records.event import parse_time
from records.settings import ENV_STORE

from .inputs import TableColumns
from .job import BatchJob, JobSpec, summary_line
from .manifest import ForeignOutputError
from .models import BatchModel, open_model, parse_model_spec
from .records_source import RecordsQuery, StoreRecords


def json_value(text: str) -> object:
    """``--explain``'s JSON value.

    Raises:
        argparse.ArgumentTypeError: if it is not JSON.
    """
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"not JSON ({error.msg}): {text!r}") from None


def iso_time(text: str) -> datetime:
    """``--since``/``--until``: an ISO 8601 date or time, UTC when it names no zone.

    Raises:
        argparse.ArgumentTypeError: if it is not one.
    """
    try:
        return parse_time(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    parser = argparse.ArgumentParser(
        prog="explain-batch",
        description=(
            "Explain a file of inputs offline (the OpenAI Batch API's JSONL lines, or a Parquet table), "
            "or stored predictions again (--from-records)."
        ),
    )
    parser.add_argument(
        "input", type=Path, nargs="?", help="JSONL ({custom_id, method, url, body} per line) or Parquet"
    )
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
        help='each row\'s (record\'s) "explain", e.g. \'{"method": "attnlrp"}\' (default: a prediction only; '
        "a record: the model's default method)",
    )
    table.add_argument("--table-model", metavar="NAME", help="the model the rows go to (default: the only --model)")
    stored = parser.add_argument_group("stored predictions (instead of INPUT)")
    stored.add_argument(
        "--from-records",
        action="store_true",
        help="explain again the stored inputs of the records of the one --model (records kept with payload full)",
    )
    stored.add_argument("--store", metavar="URL", help=f"the records store (default: ${ENV_STORE})")
    stored.add_argument("--since", type=iso_time, metavar="ISO", help="records answered at or after this time (UTC)")
    stored.add_argument("--until", type=iso_time, metavar="ISO", help="records answered before this time (UTC)")
    ray = parser.add_argument_group("Ray")
    ray.add_argument("--ray", metavar="ADDRESS", help="run on the Ray cluster at ADDRESS (e.g. 127.0.0.1:6379, auto)")
    ray.add_argument("--actors", type=int, default=2, help="most model actors on the cluster (default: 2)")
    ray.add_argument("--actor-cpus", type=float, default=1.0, help="CPUs of each actor (default: 1)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def is_parquet(path: Path, args: argparse.Namespace) -> bool:
    """Whether the input is a Parquet table (its suffix, or a column option given)."""
    return path.suffix.lower() in (".parquet", ".pq") or bool(args.text_column or args.image_column)


def records_query(args: argparse.Namespace, models: tuple[BatchModel, ...]) -> RecordsQuery:
    """``--from-records``' query (its store opened: :meth:`StoreRecords.close` it).

    Raises:
        ValueError: for arguments that do not describe one.
        records.RecordsError: if the store cannot be opened.
    """
    if args.input is not None:
        raise ValueError("--from-records reads the records store: give no INPUT")
    if len(models) != 1:
        raise ValueError("--from-records re-explains the records of one model: give one --model NAME=PATH")
    if args.text_column or args.image_column or args.table_model:
        raise ValueError("--text-column, --image-column and --table-model are for a Parquet INPUT")
    if args.since is not None and args.until is not None and args.since >= args.until:
        raise ValueError(f"--since {args.since.isoformat()} is not before --until {args.until.isoformat()}")
    url = args.store or os.environ.get(ENV_STORE, "").strip()
    if not url or url.lower() == "off":
        raise ValueError(f"--from-records needs the records store: give --store URL or set {ENV_STORE}")
    reader = StoreRecords.open(url)
    return RecordsQuery(reader, models[0].name, args.since, args.until, args.explain)


def spec_from_args(args: argparse.Namespace) -> JobSpec:
    """The job the arguments describe (models opened, not loaded; ``--from-records``' store opened).

    Raises:
        ValueError, FileNotFoundError: for arguments that do not describe a job.
        records.RecordsError: if ``--from-records``' store cannot be opened.
    """
    models = tuple(open_model(*parse_model_spec(spec)) for spec in args.model)
    if args.from_records:
        query = records_query(args, models)
        return JobSpec(None, args.output, models, None, args.errors, args.batch_size, query)
    if args.store or args.since or args.until:
        raise ValueError("--store, --since and --until are for --from-records")
    if args.input is None:
        raise ValueError("give the INPUT file (or --from-records)")
    if not args.input.is_file():
        raise FileNotFoundError(f"{args.input} is not a file")
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
    spec: JobSpec | None = None
    try:
        spec = spec_from_args(args)
        job = BatchJob(spec)
        if args.ray:
            from .ray_job import run_on_ray

            counts = run_on_ray(job, args.ray, args.actors, args.actor_cpus, progress=not args.no_progress)
        else:
            counts = job.run(progress=not args.no_progress)
    except (ValueError, FileNotFoundError, ForeignOutputError, RecordsError) as error:
        print(f"explain-batch: {error}", file=sys.stderr)
        return 2
    finally:
        if spec is not None and spec.records is not None and isinstance(spec.records.reader, StoreRecords):
            spec.records.reader.close()
    print(summary_line(counts, job.spec.output, job.errors_path), flush=True)
    return 0 if counts.failed == 0 else 1


def entry_point() -> None:
    """The ``explain-batch`` console script."""
    sys.exit(main())
