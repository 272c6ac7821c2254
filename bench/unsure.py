"""Cost of explain-when-unsure (``RowRequest.below``) relative to a plain forward, measured in one run.

For a batch of ``--batch`` rows of ``--length`` tokens, :func:`explainers.explain_batch` is timed for: a prediction
only, every row explained (no ``below``), and every row asking ``below`` with 0, ``k`` (``--unsure``) or all rows
less sure than their threshold (each row's threshold is set just above or below its own confidence, so the count is
exact). Each case's time is divided by a plain forward (``torch.inference_mode``) timed just before it; the median
ratio over ``--repeats`` interleaved pairs is printed, so a shared machine's drift cancels.

    python -m bench.unsure                                   # MiniLM with a fresh 3-class head, 8 x 128, attnlrp
    python -m bench.unsure --checkpoint model_store/build/sentiment/model --method gae --unsure 2
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from bench.explainers import default_checkpoint, load_model
from explainers import RowRequest, explain_batch


def _timed(run: Callable[[], object]) -> float:
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point: prints one line per case (ratio to a plain forward)."""
    parser = argparse.ArgumentParser(prog="python -m bench.unsure", description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, default=None, help="a sequence-classifier folder (default MiniLM)")
    parser.add_argument("--method", default="attnlrp")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--unsure", type=int, default=2, help="rows below their threshold in the mixed case")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model = load_model(args.checkpoint or default_checkpoint(), "cpu")
    generator = torch.Generator().manual_seed(0)
    vocab_size = int(getattr(model.config, "vocab_size"))  # noqa: B009 - nn.Module's attribute typing
    ids = torch.randint(1000, vocab_size, (args.batch, args.length), generator=generator)
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}
    with torch.inference_mode():
        confidences = model(**inputs).logits.softmax(-1).max(-1).values.tolist()

    def below(unsure: int) -> list[RowRequest]:
        ranked = sorted(range(args.batch), key=lambda row: confidences[row])
        chosen = set(ranked[:unsure])
        return [
            RowRequest(args.method, below=min(1.0, c + 1e-4) if row in chosen else max(1e-6, c - 1e-4))
            for row, c in enumerate(confidences)
        ]

    cases: dict[str, list[RowRequest]] = {
        "prediction only": [RowRequest(None)] * args.batch,
        f"{args.method}, every row": [RowRequest(args.method)] * args.batch,
        "below, all confident": below(0),
        f"below, {args.unsure} of {args.batch} unsure": below(args.unsure),
        "below, all unsure": below(args.batch),
    }

    def forward() -> None:
        with torch.inference_mode():
            model(**inputs)

    ratios: dict[str, list[float]] = {name: [] for name in cases}
    forwards: list[float] = []
    forward()  # warm-up
    for rows in cases.values():
        explain_batch(model, inputs, rows)
    for _ in range(args.repeats):
        for name, rows in cases.items():
            plain = _timed(forward)
            forwards.append(plain)
            started = time.perf_counter()
            explain_batch(model, inputs, rows)
            ratios[name].append((time.perf_counter() - started) / plain)
    print(
        f"{args.method}, batch {args.batch} x {args.length} tokens, {torch.get_num_threads()} threads, "
        f"forward {1000 * statistics.median(forwards):.1f} ms (median of {len(forwards)}); time / forward:"
    )
    for name, values in ratios.items():
        print(f"  {name:<28} {statistics.median(values):5.2f}")


if __name__ == "__main__":
    main()
