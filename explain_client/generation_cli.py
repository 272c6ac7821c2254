"""The ``explain --generate`` mode (and ``--chat``): a generation model's continuation of a prompt (or its reply to
chat messages, with ``--document``s), with each generated token's top context tokens (or words: ``--granularity``)
in the terminal, or, with documents, each sentence of the answer followed by its ``[1]``-style citations;
``--html`` (choose a token or a sentence to see its attribution and its documents) and ``--png`` (the step or
sentence × context matrix). ``--stream`` prints the answer's tokens as the model writes them first."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, TextIO

from .client import ExplainClient
from .generation import Generation, Steps
from .generation_render import CITATION_LEGEND, LEGEND, generation_png, html_generation_page, terminal_generation
from .results import ServiceError
from .streams import GenerationStream


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of the generation mode."""
    group = parser.add_argument_group("generation models (--generate)")
    group.add_argument("--generate", action="store_true", help="the model is a generation model: TEXT is the prompt")
    group.add_argument(
        "--chat", action="store_true", help="a chat model: TEXT is the user's message, rendered with its chat template"
    )
    group.add_argument("--system", help="--chat: a system message first")
    group.add_argument(
        "--message",
        action="append",
        default=[],
        metavar="ROLE:TEXT",
        help="--chat: an earlier turn (user:..., assistant:...), repeatable, in order before TEXT",
    )
    group.add_argument(
        "--document",
        action="append",
        default=[],
        metavar="TEXT",
        help="a document given to the model (@FILE reads it; TITLE::TEXT gives a title), repeatable; each sentence "
        "of the answer is then shown with the documents it cites",
    )
    group.add_argument("--span", metavar="START:END", help="explain these characters of the answer (one objective)")
    group.add_argument("--max-new-tokens", type=int, help="new tokens to write (default: the model's)")
    group.add_argument(
        "--steps",
        help="steps to explain: 0,2,-1 (indices), sum, sum:START:STOP, or sentences (default: all; with documents: "
        "sentences)",
    )
    group.add_argument("--contrast", help="foil token(s), comma-separated: one for every step or one per step")
    group.add_argument("--sample", action="store_true", help="sample instead of greedy")
    group.add_argument("--seed", type=int, help="sampling seed")
    group.add_argument("--temperature", type=float)
    group.add_argument("--top-k", type=int)
    group.add_argument("--top-p", type=float)
    group.add_argument("--continuation", help="explain this continuation instead of generating")
    group.add_argument("--no-explain", action="store_true", help="only generate (each token's probability)")
    group.add_argument(
        "--stream", action="store_true", help="print the answer's tokens as the model writes them, then the explanation"
    )


def parse_steps(value: str | None) -> Steps:
    """``0,2,-1`` → ``[0, 2, -1]``; ``sum`` → ``"sum"``; ``sum:1:4`` → ``("sum", 1, 4)``; ``sentences``.

    Raises:
        ValueError: for anything else.
    """
    if value is None:
        return None
    if value in ("sum", "sentences"):
        return value
    if value.startswith("sum:"):
        _, start, stop = [*value.split(":"), ""][:3]
        return ("sum", int(start), int(stop) if stop else None)
    return [int(part) for part in value.split(",") if part.strip()]


def chat_messages(args: argparse.Namespace) -> list[dict[str, str]]:
    """The messages of ``--chat``: ``--system``, the ``--message`` turns, then TEXT as the user's message.

    Raises:
        ValueError: for a ``--message`` that is not ``ROLE:TEXT``.
    """
    messages = [{"role": "system", "content": args.system}] if args.system else []
    for turn in args.message:
        role, separator, content = turn.partition(":")
        if not separator or not role.strip():
            raise ValueError(f"--message {turn!r} is not ROLE:TEXT (e.g. user:hello, assistant:hi)")
        messages.append({"role": role.strip(), "content": content})
    return [*messages, {"role": "user", "content": args.text}]


def documents(values: list[str]) -> list[str | dict[str, str]]:
    """``--document`` values: ``@FILE`` reads the file, ``TITLE::TEXT`` gives a title."""
    found: list[str | dict[str, str]] = []
    for value in values:
        if value.startswith("@"):
            value = Path(value[1:]).read_text(encoding="utf-8").strip()
        title, separator, text = value.partition("::")
        found.append({"title": title, "text": text} if separator else value)
    return found


def parse_span(value: str | None) -> tuple[int, int] | None:
    """``START:END`` → ``(START, END)``.

    Raises:
        ValueError: for anything else.
    """
    if value is None:
        return None
    start, separator, end = value.partition(":")
    if not separator:
        raise ValueError(f"--span {value!r} is not START:END (character offsets into the answer)")
    return int(start), int(end)


def _foils(value: str | None) -> list[str | int] | None:
    if value is None:
        return None
    return [int(part) if part.lstrip("-").isdigit() else part for part in value.split(",")]


def _streamed(stream: GenerationStream, out: TextIO) -> Generation:
    """Print a streamed answer's text as it arrives (a line of its own); its answer.

    Raises:
        ServiceError: the stream's error (after the text written before it, and a newline).
    """
    try:
        for token in stream:
            out.write(token.text)
            out.flush()
    finally:
        out.write("\n")
    return stream.result()


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
        messages = chat_messages(args) if args.chat else None
        given = documents(args.document) or None
        span = parse_span(args.span)
    except (OSError, ValueError) as error:
        out.write(f"error: {error}\n")
        return 2
    arguments: dict[str, Any] = {
        "messages": messages,
        "documents": given,
        "max_new_tokens": args.max_new_tokens,
        "sampling": sampling or None,
        "method": None if args.no_explain else (args.method or ""),  # "": the model's default method
        "steps": parse_steps(args.steps),
        "contrast": _foils(args.contrast),
        "granularity": args.granularity,
        "span": span,
        **options,
    }
    prompt = None if args.chat else args.text
    result: Generation | ServiceError
    try:
        if getattr(args, "stream", False) and args.continuation is None:
            result = _streamed(client.generate_stream(args.model, prompt, **arguments), out)
        else:
            result = client.generate(args.model, prompt, continuation=args.continuation, **arguments)
    except ServiceError as error:
        result = error
    if isinstance(result, ServiceError):
        out.write(f"error: {result.code}: {result.message}\n")
    else:
        out.write(terminal_generation(result, color) + "\n")
        cited = result.sentences is not None or result.span is not None
        out.write(f"({CITATION_LEGEND if cited else LEGEND})\n")
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
