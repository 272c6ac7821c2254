"""Streamed generation, served against transformers' own streamer: time to the first streamed token and tokens per
second of the KServe door's OpenAI API (``stream=True`` through the official ``openai`` client; the door in its own
process, started by the launcher over the checkpoint packaged as ``make serve MODELS=...`` packages it), side by side
with ``model.generate`` and a ``TextIteratorStreamer`` on the same model and prompt in-process, at concurrency 1
and 4.

Models: a tiny causal LM built here (``bench.generation``'s random 4-layer Llama with its word-level tokenizer,
saved as a checkpoint) and, when it is built (``make writer``: ``model_store/build/writer/model``) or named with
``--writer``, the demo writer (SmolLM2-135M-Instruct). Both sides run greedy decoding of ``--new-tokens`` tokens
(32) on the same prompt; the tiny model's answers end at its EOS, if it writes one, on both sides alike.

The two sides take turns, round by round (a round: ``c`` concurrent streams), after a warm-up round each. Per cell:
the median over every stream of the time to its first non-empty text (TTFT), of its tokens per second
(its tokens over its whole time) and of its first token's share of its whole time; the goals (issue 35): TTFT within
1.5× of transformers', tokens/s at least 0.9× of it, the first token at most a quarter of a 32-token answer's time.

    python -m bench.streaming                      # tiny LM (and the writer, when built), c=1 and c=4
    python -m bench.streaming --repeats 10 --writer model_store/build/writer/model
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bench.common import load_average
from bench.generation import build_model, word_tokenizer

#: The prompt both sides continue (the tiny model's words are its vocabulary's, ``w3``...). The writer's is a story to
#: continue, not a question: as a bare completion (no chat template) the instruct model ends a question's turn at once.
WRITER_PROMPT = "Once upon a time, in a small village by the sea, there lived an old fisherman who"
WRITER_DEFAULT = Path("model_store/build/writer/model")
#: Seconds between the two sides' rounds.
PAUSE_S = 0.5


@dataclass(frozen=True)
class Stream:
    """One streamed answer: seconds to its first text, its whole seconds, its tokens."""

    first: float
    total: float
    tokens: int


def tiny_checkpoint(folder: Path) -> tuple[Path, str]:
    """The tiny causal LM saved as a checkpoint in ``folder``, and a prompt of its words."""
    model: Any = build_model("llama", layers=4, hidden=256, heads=4, vocabulary=2000, positions=512)
    tokenizer = word_tokenizer(2000)
    model.config.eos_token_id = tokenizer.eos_token_id
    model.config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    return folder, " ".join(f"w{3 + (7 * index) % 1990}" for index in range(24))


def concurrently(run: Callable[[], Stream], clients: int) -> list[Stream]:
    """One round of ``clients`` concurrent streams."""
    made: list[Stream] = []
    threads = [threading.Thread(target=lambda: made.append(run())) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return made


def paired_rounds(
    ours: Callable[[], Stream], theirs: Callable[[], Stream], clients: int, repeats: int
) -> tuple[list[Stream], list[Stream]]:
    """``repeats`` rounds of each side, alternating (so that a busy machine slows both alike), after a warm-up round
    of each that is not counted."""
    mine: list[Stream] = []
    baseline: list[Stream] = []
    for round_ in range(repeats + 1):
        served = concurrently(ours, clients)
        time.sleep(PAUSE_S)  # the door's idle OpenMP threads stop spinning before the other side runs
        reference = concurrently(theirs, clients)
        time.sleep(PAUSE_S)
        if round_:
            mine += served
            baseline += reference
    return mine, baseline


#: The threads ``generate`` runs on beside its streamer's reader, kept (as a server keeps its workers: a new thread
#: would start a new OpenMP thread team for every call).
_GENERATE = ThreadPoolExecutor(max_workers=8, thread_name_prefix="generate")


def transformers_stream(model: Any, tokenizer: Any, prompt: str, new_tokens: int) -> Stream:
    """One ``generate`` with a ``TextIteratorStreamer`` (on a worker thread), read as it writes."""
    from transformers import TextIteratorStreamer

    inputs = tokenizer(prompt, return_tensors="pt")
    streamer = TextIteratorStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
    started = time.perf_counter()
    outputs: list[Any] = []

    def generate() -> None:
        with torch.no_grad():
            outputs.append(model.generate(**inputs, max_new_tokens=new_tokens, do_sample=False, streamer=streamer,
                                          pad_token_id=tokenizer.pad_token_id))  # fmt: skip

    running = _GENERATE.submit(generate)
    first = None
    for text in streamer:
        if text and first is None:
            first = time.perf_counter() - started
    running.result()
    total = time.perf_counter() - started
    tokens = int(outputs[0].shape[1] - inputs["input_ids"].shape[1])
    return Stream(first if first is not None else total, total, tokens)


def served_stream(client: Any, model: str, prompt: str, new_tokens: int) -> Stream:
    """One streamed completion through the door's OpenAI API."""
    started = time.perf_counter()
    first = None
    tokens = 0
    for chunk in client.completions.create(model=model, prompt=prompt, max_tokens=new_tokens, temperature=0,
                                           stream=True, stream_options={"include_usage": True}):  # fmt: skip
        if chunk.choices and chunk.choices[0].text and first is None:
            first = time.perf_counter() - started
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    total = time.perf_counter() - started
    return Stream(first if first is not None else total, total, tokens)


class Door:
    """The KServe door (``python -m doors serve --server kserve``'s process) serving one checkpoint, packaged as
    ``make serve MODELS=lm=PATH`` packages it."""

    def __init__(self, checkpoint: Path, new_tokens: int, batch_size: int, folder: Path) -> None:
        from doors.kserve import launch as launcher
        from doors.torchserve.config import Ports
        from model_store.package import Settings, package

        settings = Settings(max_length=256, batch_size=batch_size, max_batch_delay=5, max_new_tokens=max(new_tokens, 8),
                            default_new_tokens=4)  # fmt: skip
        archive = package(checkpoint, "lm", folder / "store", settings).archive
        ports = Ports.free()
        self.run_dir = folder / "run"
        door = launcher.start("kserve", {"lm": archive.resolve()}, self.run_dir, ports.inference, ports.grpc_inference,
                              timeout=600)  # fmt: skip
        self.url = f"{door.url}/v1"

    def close(self) -> None:
        """Stop the door."""
        from doors.kserve import launch as launcher

        launcher.stop(self.run_dir)


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def cell(name: str, clients: int, ours: list[Stream], theirs: list[Stream]) -> dict[str, Any]:
    """One row of the table."""
    ttft = _median([stream.first for stream in ours])
    base_ttft = _median([stream.first for stream in theirs])
    rate = _median([stream.tokens / stream.total for stream in ours])
    base_rate = _median([stream.tokens / stream.total for stream in theirs])
    share = _median([stream.first / stream.total for stream in ours])
    return {
        "model": name, "c": clients, "tokens": _median([stream.tokens for stream in ours]),
        "ttft_ms": 1000 * ttft, "hf_ttft_ms": 1000 * base_ttft, "ttft_ratio": ttft / base_ttft,
        "tok_s": rate, "hf_tok_s": base_rate, "rate_ratio": rate / base_rate, "first_share": share,
        "goals": ttft <= 1.5 * base_ttft and rate >= 0.9 * base_rate and share <= 0.25,
    }  # fmt: skip


def markdown(rows: Sequence[dict[str, Any]]) -> str:
    """The table."""
    lines = [
        "| model | c | tokens | TTFT p50 (ms) | transformers TTFT (ms) | ratio (≤ 1.5) | tokens/s | transformers "
        "tokens/s | ratio (≥ 0.9) | first / whole (≤ 0.25) | goals |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['model']} | {row['c']} | {row['tokens']:.0f} | {row['ttft_ms']:.1f} | {row['hf_ttft_ms']:.1f} | "
            f"{row['ttft_ratio']:.2f} | {row['tok_s']:.1f} | {row['hf_tok_s']:.1f} | {row['rate_ratio']:.2f} | "
            f"{row['first_share']:.3f} | {'met' if row['goals'] else 'missed'} |"
        )
    return "\n".join(lines)


def measure(name: str, checkpoint: Path, prompt: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Both sides on one checkpoint, at every concurrency."""
    from openai import OpenAI
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(checkpoint)).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
    door = Door(checkpoint, args.new_tokens, max(args.concurrency), Path(tempfile.mkdtemp(prefix="bench-streaming-")))
    client = OpenAI(api_key="bench", base_url=door.url, max_retries=0, timeout=600)
    rows = []
    try:
        for clients in args.concurrency:
            ours, theirs = paired_rounds(
                lambda: served_stream(client, "lm", prompt, args.new_tokens),
                lambda: transformers_stream(model, tokenizer, prompt, args.new_tokens),
                clients,
                args.repeats,
            )
            rows.append(cell(name, clients, ours, theirs))
    finally:
        door.close()
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    """Command-line entry point: print the table."""
    parser = argparse.ArgumentParser(prog="python -m bench.streaming", description=__doc__.split("\n\n")[0])
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--repeats", type=int, default=5, help="rounds per side and cell (after a warm-up round)")
    parser.add_argument("--writer", type=Path, help=f"the writer's checkpoint (default: {WRITER_DEFAULT}, if built)")
    parser.add_argument("--no-writer", action="store_true", help="the tiny LM only")
    args = parser.parse_args(argv)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as folder:
        checkpoint, prompt = tiny_checkpoint(Path(folder) / "model")
        rows += measure("tiny llama", checkpoint, prompt, args)
    writer = args.writer or (WRITER_DEFAULT if WRITER_DEFAULT.is_dir() else None)
    if writer is not None and not args.no_writer:
        rows += measure("writer", writer, WRITER_PROMPT, args)
    elif not args.no_writer:
        print(f"(the writer is not built: {WRITER_DEFAULT}; `make writer` builds it)")
    print(markdown(rows))
    print(f"\n{args.new_tokens} new tokens, greedy; {args.repeats} rounds per cell; load average {load_average()}")


if __name__ == "__main__":
    main()
