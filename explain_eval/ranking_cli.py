"""``explain-eval --all`` (:mod:`explain_eval.ranking`): the command, which runs every method on every default model
seed by seed and rewrites the outputs (:mod:`explain_eval.ranking_report`) after each."""

from __future__ import annotations

import argparse
import datetime
import logging
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from .erasure import ERASER_BINS
from .faithfulness import FRACTIONS
from .generation import parse_options
from .provenance import machine
from .ranking import MethodResult, Subject, evaluate_subject
from .ranking_report import merge, rank_table, subject_document, write_outputs
from .ranking_subjects import MODELS, make_subject, model_folder
from .results import RANDOM

logger = logging.getLogger(__name__)


def run_cli(args: argparse.Namespace, argv: Sequence[str] | None, parser: argparse.ArgumentParser) -> int:
    """``explain-eval --all`` (the arguments of :func:`explain_eval.cli.build_parser`); returns the exit status.
    The outputs are rewritten after each model and seed, so a run cut short keeps what it measured; a model that is
    not built stops the run when its turn comes (status 2), the models before it written."""
    from explainers import available_methods

    command = "explain-eval " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.merge:
        try:
            merge(args.merge, args.out, command)
        except (OSError, ValueError, KeyError) as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        print(f"wrote {args.out.with_suffix('.md')}, {args.out.with_suffix('.json')}")
        return 0
    models = args.model or list(MODELS)
    unknown_models = sorted(set(models) - set(MODELS))
    if unknown_models:
        parser.error(f"--all runs the default models {', '.join(MODELS)}; unknown: {unknown_models}")
    methods = (
        [name.strip() for name in args.methods.split(",") if name.strip()] if args.methods else available_methods()
    )
    unknown = sorted(set(methods) - set(available_methods()) - {RANDOM})
    if unknown:
        parser.error(f"unknown method(s) {unknown}; available: {', '.join(available_methods())}, {RANDOM}")
    if not args.no_random and RANDOM not in methods:
        methods.append(RANDOM)
    try:
        seeds = [int(seed) for seed in args.seeds.split(",") if seed.strip()]
    except ValueError:
        parser.error("--seeds takes integers, comma-separated")
    if not seeds or len(set(seeds)) != len(seeds):
        parser.error("--seeds takes distinct integers, comma-separated")
    try:
        options = parse_options(args.option or [])
    except ValueError as error:
        parser.error(str(error))
    header_options = {"options": options}
    n = 100 if args.n is None else args.n
    if not 1 <= n <= 5000 or not 1 <= args.writer_n <= 5000:
        parser.error("--n and --writer-n must be between 1 and 5000")
    if args.threads:
        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    header: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": command,
        "machine": machine(),
        "methods": methods,
        "fractions": list(FRACTIONS),
        "eraser_bins": list(ERASER_BINS),
        **header_options,
    }
    documents: list[dict[str, Any]] = []
    for name in models:
        folder = model_folder(name, args)
        if not (folder / "config.json").is_file():
            hint = "make writer or --writer-dir" if name == "writer" else "make models or --build-dir"
            print(f"error: {folder} has no config.json: build {name} first ({hint})", file=sys.stderr)
            return 2
        subject = make_subject(name, args)
        count = args.writer_n if name == "writer" else n
        full_means: list[float] = []
        logger.info("%s: %d held-out examples to draw from, %d per seed", name, subject.pool_size(), count)

        def save(
            results: Mapping[str, MethodResult], seed: int, subject: Subject = subject, count: int = count,
            full_means: list[float] = full_means,
        ) -> None:  # fmt: skip
            done = seeds[: seeds.index(seed) + 1]
            header["seconds"] = time.perf_counter() - started
            write_outputs(args.out, header, [*documents, subject_document(subject, results, count, done, full_means)])

        results = evaluate_subject(subject, methods, count, seeds, args.batch_size, save, full_means, options)
        documents.append(subject_document(subject, results, count, seeds, full_means))
        header["seconds"] = time.perf_counter() - started
        write_outputs(args.out, header, documents)
    print(rank_table(documents, methods))
    print(
        f"wrote {args.out.with_suffix('.md')}, {args.out.with_suffix('.json')} ({time.perf_counter() - started:.0f} s)"
    )
    return 0
