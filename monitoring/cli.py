"""``explain-monitor``: a model's monitoring references, built in this process.

::

    explain-monitor baseline INPUT -o FILE --model NAME=PATH [--method attnlrp ...] [--device cpu]
    explain-monitor canaries record INPUT -o FILE --model NAME=PATH [--method attnlrp ...] [--device cpu]

``INPUT``: JSON Lines of request documents or one text per line (:func:`monitoring.reference.read_inputs`);
``PATH``: the checkpoint folder. The baseline is each (method, label)'s mean word shares over the inputs; the canary
file is the inputs with their answers and explanations now. Package them with the model:
``monitor: {baseline: FILE, canaries: FILE}``. Exit status 0, or 2 for a refused argument or input.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from explainers import DEFAULT_METHOD, available_methods


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    parser = argparse.ArgumentParser(
        prog="explain-monitor", description="A model's drift baseline and canary set, built in this process."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    baseline = commands.add_parser("baseline", help="build a drift baseline from a reference file")
    _common(baseline)
    canaries = commands.add_parser("canaries", help="canary probe sets")
    actions = canaries.add_subparsers(dest="action", required=True)
    _common(actions.add_parser("record", help="record probes with their reference answers and explanations"))
    return parser


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("input", type=Path, help="JSON Lines of request documents, or one text per line")
    parser.add_argument("-o", "--output", type=Path, required=True, help="the file to write")
    parser.add_argument("--model", required=True, help="NAME=PATH: the model's name and checkpoint folder")
    parser.add_argument("--method", action="append", help=f"a method (repeatable; default {DEFAULT_METHOD})")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda", "auto"))
    parser.add_argument("--max-length", type=int, default=128, help="tokens per input, as the model's max_length")
    parser.add_argument("--capacity", type=int, default=1000, help="baseline: words kept per (method, label)")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; the exit status."""
    arguments = build_parser().parse_args(argv)
    name, _, folder = arguments.model.partition("=")
    if not name or not folder:
        print("explain-monitor: --model must be NAME=PATH", file=sys.stderr)
        return 2
    from .baseline import write_baseline
    from .canaries import write_canaries
    from .inprocess import InProcessModel, as_device
    from .reference import build_baseline, read_inputs, record_canaries

    methods = arguments.method or [DEFAULT_METHOD]
    unknown = [method for method in methods if method not in available_methods()]
    if unknown:
        print(
            f"explain-monitor: unknown method(s) {unknown}; methods: {', '.join(available_methods())}", file=sys.stderr
        )
        return 2
    try:
        documents = read_inputs(arguments.input)
        model = InProcessModel(name, Path(folder), as_device(arguments.device), arguments.max_length)
    except (OSError, ValueError) as error:
        print(f"explain-monitor: {error}", file=sys.stderr)
        return 2
    if arguments.command == "baseline":
        baseline = build_baseline(model, documents, methods, arguments.capacity)
        if not baseline.entries:
            print("explain-monitor: no input was explained over words or patches", file=sys.stderr)
            return 2
        write_baseline(baseline, arguments.output)
        summary = ", ".join(f"{m}/{label}: {e.rows} rows" for (m, label), e in baseline.entries.items())
        print(f"wrote {arguments.output}: {summary}")
        return 0
    try:
        canaries = record_canaries(model, documents, methods)
    except ValueError as error:
        print(f"explain-monitor: {error}", file=sys.stderr)
        return 2
    write_canaries(name, canaries, arguments.output)
    print(f"wrote {arguments.output}: {len(canaries)} probes")
    return 0


def entry_point() -> None:
    """The ``explain-monitor`` console script."""
    sys.exit(main())


if __name__ == "__main__":
    entry_point()
