"""``python -m model_store.package PATH --name NAME [--out DIR] [options]`` or ``--config models.yaml``: validate
every checkpoint first (nothing is written if one is refused), then package or reuse each. Exit status: 0 packaged,
2 refused, 1 archiver failure."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from model_store.package.models_file import ModelEntry, read_models_file
from model_store.package.monitor_files import add_monitor_arguments, monitor_override
from model_store.package.packaging import default_out, package
from model_store.package.settings import PackageError, Settings, check_name
from model_store.package.validate import validate


def _settings_from_args(args: argparse.Namespace) -> Settings:
    overrides = {
        key: getattr(args, key)
        for key in (
            "default_method",
            "max_length",
            "batch_size",
            "max_batch_delay",
            "device",
            "threshold",
            "workers",
            "explain_below",
            "explanation_workers",
        )
        if getattr(args, key) is not None
    }
    if args.chat_template is not None:
        overrides["chat_template"] = Settings(chat_template=args.chat_template).chat_template_text()
    if args.bf16:
        overrides["bf16"] = True
    try:
        monitor = monitor_override(args)
    except ValueError as error:
        raise PackageError(f"options: {error}") from None
    if monitor is not None:
        overrides["monitor"] = monitor
    settings = replace(Settings(), **overrides)
    settings.check("options")
    return settings


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit status (0 packaged, 2 refused, 1 archiver failure)."""
    parser = argparse.ArgumentParser(
        prog="python -m model_store.package",
        description="Validate a Hugging Face checkpoint folder and write its TorchServe archive folder OUT/NAME.",
    )
    parser.add_argument("path", nargs="?", type=str, help="the checkpoint folder (config.json, *.safetensors, ...)")
    parser.add_argument("--name", help="model name (the archive folder and the URL: /predictions/NAME)")
    parser.add_argument("--config", type=Path, help="a YAML file of several models (instead of PATH and --name)")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="model store folder (default: model_store/build/packages of the working "
        "directory: $EXPLAIN_WORKDIR, else the current one)",
    )
    parser.add_argument("--default-method", help="method used when a request names none (default: attnlrp)")
    parser.add_argument(
        "--max-length",
        type=int,
        help="tokens per text input, longer is truncated (default: 128; a causal LM: its positions less "
        "--max-new-tokens, bounded by what 16 GiB holds of a batch's explanations)",
    )
    parser.add_argument("--batch-size", type=int, help="TorchServe batchSize (default: 8)")
    parser.add_argument("--max-batch-delay", type=int, help="TorchServe maxBatchDelay in ms (default: 2)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), help="default: auto (CUDA when present)")
    parser.add_argument("--bf16", action="store_true", help="run the forward under bfloat16 autocast (GPU)")
    parser.add_argument("--threshold", type=float, help="multi-label heads: probability to predict a label (0.5)")
    parser.add_argument("--workers", type=int, help="TorchServe workers of the model (default: 1)")
    parser.add_argument(
        "--explain-below",
        type=float,
        metavar="P",
        help="explain when unsure by default: only when the prediction's confidence is below P (default: always)",
    )
    parser.add_argument(
        "--explanation-workers",
        type=int,
        metavar="N",
        help="serve explanation requests from their own pool of N workers (predictions never wait for them)",
    )
    parser.add_argument(
        "--chat-template",
        metavar="FILE",
        help="generation models: a Jinja chat template file to render chat messages with (default: the checkpoint's)",
    )
    add_monitor_arguments(parser, per_model=False)
    parser.add_argument("-q", "--quiet", action="store_true", help="log warnings only")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO, format="%(levelname)s %(message)s")
    args.out = args.out if args.out is not None else default_out()
    try:
        if args.config is not None:
            if args.path or args.name:
                raise PackageError("give either PATH --name NAME or --config FILE, not both")
            entries = read_models_file(args.config)
        else:
            if not args.path or args.name is None:
                parser.error("PATH and --name are required (or --config FILE)")
            entries = [ModelEntry(check_name(args.name), args.path, _settings_from_args(args))]
        # validate all first: nothing is written if one is refused
        checked = [validate(entry.path, entry.name, entry.settings) for entry in entries]
        results = [
            package(entry.path, entry.name, args.out, entry.settings, checkpoint)
            for entry, checkpoint in zip(entries, checked, strict=True)
        ]
    except PackageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except RuntimeError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    for result in results:
        state = "reused" if result.reused else "packaged"
        print(f"{result.name}: {state} {result.archive}")
    store = args.out
    names = " ".join(f"{result.name}={result.name}" for result in results)
    print(f"serve with: torchserve --model-store {store} --models {names}  (or: make serve MODELS=...)")
    return 0
