"""The ``explain --generate`` mode: a generation model's continuation of a prompt, with each generated token's top
context tokens in the terminal, ``--html`` (choose a token to see its attribution) and ``--png`` (the step × context
matrix)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, TextIO

from .client import ExplainClient
from .generation import Generation, Steps
from .generation_render import LEGEND, generation_png, html_generation_page, terminal_generation
from .results import ServiceError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of the generation mode."""
    group = parser.add_argument_group("generation models (--generate)")
    group.add_argument("--generate", action="store_true", help="the model is a generation model: TEXT is the prompt")
    group.add_argument("--max-new-tokens", type=int, help="new tokens to write (default: the model's)")
    group.add_argument("--steps", help="steps to explain: 0,2,-1 (indices), sum, or sum:START:STOP (default: all)")
    group.add_argument("--contrast", help="foil token(s), comma-separated: one for every step or one per step")
    group.add_argument("--sample", action="store_true", help="sample instead of greedy")
    group.add_argument("--seed", type=int, help="sampling seed")
    group.add_argument("--temperature", type=float)
    group.add_argument("--top-k", type=int)
    group.add_argument("--top-p", type=float)
    group.add_argument("--continuation", help="explain this continuation instead of generating")
    group.add_argument("--no-explain", action="store_true", help="only generate (each token's probability)")


def parse_steps(value: str | None) -> Steps:
    """``0,2,-1`` → ``[0, 2, -1]``; ``sum`` → ``"sum"``; ``sum:1:4`` → ``("sum", 1, 4)``.

    Raises:
        ValueError: for anything else.
    """
    if value is None:
        return None
    if value == "sum":
        return "sum"
    if value.startswith("sum:"):
        _, start, stop = [*value.split(":"), ""][:3]
        return ("sum", int(start), int(stop) if stop else None)
    return [int(part) for part in value.split(",") if part.strip()]


def _foils(value: str | None) -> list[str | int] | None:
    if value is None:
        return None
    return [int(part) if part.lstrip("-").isdigit() else part for part in value.split(",")]


def run(args: argparse.Namespace, client: ExplainClient, out: TextIO, color: bool) -> int:
    """Call the service for the prompt (``args.text``) and show the answer; the exit status."""
    sampling: dict[str, Any] = {}
    if args.sample:
        sampling["do_sample"] = True
    for name in ("seed", "temperature", "top_k", "top_p"):
        if getattr(args, name) is not None:
            sampling[name] = getattr(args, name)
    options = getattr(args, "parsed_options", {})
    try:
        result: Generation | ServiceError = client.generate(
            args.model,
            args.text,
            max_new_tokens=args.max_new_tokens,
            sampling=sampling or None,
            continuation=args.continuation,
            method=None if args.no_explain else (args.method or ""),  # "": the model's default method
            steps=parse_steps(args.steps),
            contrast=_foils(args.contrast),
            **options,
        )
    except ServiceError as error:
        result = error
    if isinstance(result, ServiceError):
        out.write(f"error: {result.code}: {result.message}\n")
    else:
        out.write(terminal_generation(result, color) + "\n")
        out.write(f"({LEGEND})\n")
    if args.jsonl:
        record = {"prompt": args.text, **(result.to_dict() if isinstance(result, Generation) else {})}
        if isinstance(result, ServiceError):
            record["error"] = result.to_dict()
        Path(args.jsonl).write_text(json.dumps(record) + "\n", encoding="utf-8")
    if args.html:
        Path(args.html).write_text(html_generation_page([(args.text, result)], f"{args.model}"), encoding="utf-8")
        out.write(f"wrote {args.html}\n")
    if args.png and isinstance(result, Generation):
        Path(args.png).write_bytes(generation_png(result))
        out.write(f"wrote {args.png}\n")
    return 1 if isinstance(result, ServiceError) else 0
