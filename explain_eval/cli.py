"""The ``explain-eval`` command (:mod:`explain_eval.evaluate` runs the test in-process,
:mod:`explain_eval.served_eval` through the running service).

Kept apart from both so that neither imports the other: :mod:`explain_eval.served_eval` uses the data types of
:mod:`explain_eval.evaluate`, and this module uses both.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from explain_client import ExplainClient
from supervise.workdir import model_store_dir

from . import evaluate as _evaluate
from .evaluate import (
    DEFAULT_METHODS,
    Dataset,
    ModelResult,
    evaluate,
    held_out,
    markdown_table,
    plot,
)
from .results import RANDOM
from .served_eval import evaluate_served

logger = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    """The ``explain-eval`` argument parser."""
    parser = argparse.ArgumentParser(prog="explain-eval", description=(_evaluate.__doc__ or "").split("\n\n")[0])
    parser.add_argument("--model", action="append", help="sentiment and/or digits (repeatable; default sentiment)")
    parser.add_argument("--model-dir", type=Path, help="checkpoint folder (one --model only; default: the build's)")
    parser.add_argument(
        "--build-dir",
        type=Path,
        default=model_store_dir(),
        help="the default models' build folder (default: model_store/build of the working directory: "
        "$EXPLAIN_WORKDIR, else the current one)",
    )
    parser.add_argument(
        "--methods",
        help=f"comma-separated methods (default: {','.join(DEFAULT_METHODS)}; --generation: all but relevance)",
    )
    parser.add_argument("--no-random", action="store_true", help="leave out the random-ranking reference")
    parser.add_argument(
        "--n",
        type=int,
        help="held-out examples per model (max 5000; default 500); --generation: prompts (default all); "
        "--all: examples per seed of sentiment, digits and entities (default 100)",
    )
    parser.add_argument("--removal", choices=("mask", "delete"), default="mask", help="text: [MASK] or delete")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0, help="seed of the random ranking")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    parser.add_argument("--out", type=Path, default=Path("faithfulness"), help="output stem: .json, .md, .png")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument(
        "--served", action="store_true", help="text models: explain and predict through the running service (REST)"
    )
    parser.add_argument("--run-dir", type=Path, default=Path("run"), help="--served: folder of `make start`")
    parser.add_argument("--url", help="--served: REST base URL (default: from --run-dir)")
    parser.add_argument("--token-file", type=Path, help="--served: token file (default: the run folder's)")
    parser.add_argument("--mask-token", default="[MASK]", help="--served: the served tokenizer's mask token text")
    parser.add_argument("--replot", type=Path, help="only redraw the PNG (next to it) from a results .json file")
    generation = parser.add_argument_group("generation mode (explain_eval/generation.py)")
    generation.add_argument(
        "--generation",
        action="store_true",
        help="causal LMs: delete each greedy step's most relevant prompt tokens and report the fall of the step "
        "token's log-probability, per method against random (--model-dir: default the demo writer's build)",
    )
    generation.add_argument(
        "--view",
        choices=("token", "word", "document"),
        default="token",
        help="what a step loses: its k highest-scored prompt tokens (default) or words; document: each sentence of "
        "an answer to a chat with documents loses its k highest-ranked documents (its citations)",
    )
    generation.add_argument(
        "--new-tokens", type=int, help="greedy tokens per prompt (default 8; --view document: 48 per answer)"
    )
    generation.add_argument(
        "--k", default="1,2,4", help="prompt tokens each step loses, comma-separated (default 1,2,4)"
    )
    generation.add_argument("--prompts", type=Path, help="a file of prompts, one a line (default: 20 built-in ones)")
    generation.add_argument(
        "--documents",
        type=Path,
        help="--view document: a JSON list of {messages or question, documents} (default: bench/data's items)",
    )
    generation.add_argument(
        "--option",
        action="append",
        metavar="METHOD.KEY=VALUE",
        help="a method's option, e.g. integrated_gradients.n_steps=16 or smoothgrad.stdev=0.15 (repeatable; "
        "default: the method's defaults)",
    )
    every = parser.add_argument_group("every method on every default model (explain_eval/ranking.py)")
    every.add_argument(
        "--all",
        action="store_true",
        help="rank every registered method (--methods: some) on sentiment, digits, entities and the writer (--model: "
        "some): perturbation AUCs, ABPC, comprehensiveness, sufficiency and cost, mean ± standard error over seeds",
    )
    every.add_argument("--seeds", default="0,1,2", help="--all: the seeds, comma-separated (default 0,1,2)")
    every.add_argument("--writer-n", type=int, default=12, help="--all: writer prompts per seed (default 12)")
    every.add_argument("--writer-dir", type=Path, help="--all: the writer's folder (default: the build's)")
    every.add_argument(
        "--merge",
        nargs="+",
        type=Path,
        metavar="JSON",
        help="--all: write one table (--out) from the .json files of several --all runs, each model from one run",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the evaluation; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    if args.replot is not None:
        saved = json.loads(args.replot.read_text(encoding="utf-8"))
        plot([ModelResult.from_dict(result) for result in saved["results"]], args.replot.with_suffix(".png"))
        return 0
    if args.all:
        from .ranking_cli import run_cli as run_all

        return run_all(args, argv, parser)
    if args.generation:
        from .generation import run_cli

        return run_cli(args, argv, parser)
    if args.n is None:
        args.n = 500
    models = args.model or ["sentiment"]
    if args.model_dir is not None and len(models) != 1:
        parser.error("--model-dir needs exactly one --model")
    if not 1 <= args.n <= 5000:
        parser.error("--n must be between 1 and 5000")
    methods = [name.strip() for name in (args.methods or ",".join(DEFAULT_METHODS)).split(",") if name.strip()]
    from explainers import available_methods

    unknown = sorted(set(methods) - set(available_methods()) - {RANDOM})
    if unknown:
        parser.error(f"unknown method(s) {unknown}; available: {', '.join(available_methods())}, {RANDOM}")
    if not args.no_random and RANDOM not in methods:
        methods.append(RANDOM)
    if args.threads:
        torch.set_num_threads(args.threads)
    results = []
    for name in models:
        model_dir = args.model_dir or args.build_dir / name / "model"
        root = model_dir.parent
        task = "image" if json.loads((model_dir / "config.json").read_text())["model_type"] == "vit" else "text"
        started = time.perf_counter()
        dataset = held_out(task, root, args.n)
        if args.served:
            result = _served(args, name, dataset, methods)
        else:
            result = evaluate(
                name, model_dir, dataset, methods, args.removal, args.batch_size, args.seed, not args.no_progress
            )
        logger.info("%s: %d examples in %.0f s", name, len(dataset), time.perf_counter() - started)
        results.append(result)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tables = "\n\n".join(markdown_table(result) for result in results)
    note = (
        "Perturbation test of Chefer et al. (CVPR 2021), run in-process on each model's held-out split. Positive: the "
        "highest-scored tokens/patches are removed first (lower AUC = more faithful); negative: the lowest first "
        "(higher is better). AUC = area under the accuracy (or explained-class probability) curve over 0-90% "
        "removed, divided by 0.9, in percent. `random` = a seeded random ranking."
    )
    command = "explain-eval " + " ".join(argv if argv is not None else sys.argv[1:])
    args.out.with_suffix(".md").write_text(f"{note}\n\n`{command}`\n\n{tables}\n", encoding="utf-8")
    document = {"command": command, "methods": methods, "results": [result.to_dict() for result in results]}
    args.out.with_suffix(".json").write_text(json.dumps(document, indent=1), encoding="utf-8")
    plot(results, args.out.with_suffix(".png"))
    print(tables)
    print(f"wrote {args.out.with_suffix('.md')}, {args.out.with_suffix('.json')}, {args.out.with_suffix('.png')}")
    return 0


def _served(args: argparse.Namespace, name: str, dataset: Dataset, methods: Sequence[str]) -> ModelResult:
    from model_store.data import SENTIMENT_LABELS

    if args.url:
        client = ExplainClient("rest", url=args.url, token_file=args.token_file)
    else:
        extra: dict[str, Any] = {"token_file": args.token_file} if args.token_file else {}
        client = ExplainClient.from_run_dir(args.run_dir, "rest", **extra)
    with client:
        return evaluate_served(
            client, name, dataset, SENTIMENT_LABELS, methods, args.mask_token, args.batch_size, args.seed,
            not args.no_progress,
        )  # fmt: skip


def entry_point() -> None:
    """Console-script entry point (``explain-eval``)."""
    sys.exit(main())


if __name__ == "__main__":
    entry_point()
