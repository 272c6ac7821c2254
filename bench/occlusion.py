"""Occlusion of a causal LM with and without the unchanged prefix's key/value cache, against the input length.

For each model and length ``n`` it times :func:`explainers.methods.perturbation.occluded_objectives` (occlusion's
forwards: the unchanged copy and one copy per erased position, ``--internal-batch-size`` rows per forward) on random
token ids of ``n`` tokens (``--batch`` rows, unpadded; one round: the next-token logit after the last token), without
the cache and with it, in pairs timed back to back (so that a shared machine's drift cancels in the ratio), and prints
the medians and the ratio ``uncached / cached`` (above 1: the cache is faster). It also checks that both give the same
objectives. Models: ``tiny`` (a random Llama-shaped causal LM, ``--hidden``/``--layers``/``--heads``) and ``writer``
(the demo writer, SmolLM2-135M, when it is built: ``make writer``; ``--writer`` names another checkpoint), loaded with
the library's default attention (sdpa), as the service loads them.
:data:`explainers.methods.perturbation.OCCLUSION_CACHE_MIN_TOKENS` is chosen from this table.

    python -m bench.occlusion                                # tiny and (if built) the writer, n = 64, 128, 256
    python -m bench.occlusion --models tiny --lengths 16 32 64 128 256 --repeats 5
    OMP_NUM_THREADS=1 python -m bench.occlusion --clock cpu  # a shared machine: this process's CPU time
"""

from __future__ import annotations

import argparse
import logging
import statistics
from pathlib import Path
from typing import Any

import torch

from explainers import Targets
from explainers.architectures.attention import fused_implementation
from explainers.architectures.description import describe
from explainers.capture import prepared_model
from explainers.inputs import validate_inputs
from explainers.methods import COPIES_PER_PASS, ForwardInputs, Objective, occluded_objectives

from .explainers import CLOCKS, _clock, timed

log = logging.getLogger("bench.occlusion")
REPO = Path(__file__).resolve().parent.parent
WRITER = REPO / "model_store" / "build" / "writer" / "model"


def tiny_lm(hidden: int, layers: int, heads: int, vocab: int = 2048) -> Any:
    """A random Llama-shaped causal LM (float32, eval mode, the library's default attention)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=int(hidden * 8 / 3) // 8 * 8, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=max(1, heads // 2), max_position_embeddings=4096,
    )  # fmt: skip
    return LlamaForCausalLM(config).eval()


def writer_lm(path: Path) -> Any:
    """The writer's checkpoint as the service loads it."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    return AutoModelForCausalLM.from_pretrained(str(path)).eval()


def measure(model: Any, length: int, batch: int, internal: int, repeats: int) -> dict[str, float]:
    """Median seconds of occlusion's forwards without and with the prefix cache, their ratio and largest relative
    difference, for ``batch`` random rows of ``length`` tokens."""
    generator = torch.Generator().manual_seed(length)
    vocab = int(model.config.vocab_size)
    ids = torch.randint(3, vocab, (batch, length), generator=generator)
    arch = describe(model)
    fused = fused_implementation(model)
    inputs = validate_inputs(arch, model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)})
    mask = inputs["attention_mask"]
    positions = torch.full((1, batch), length - 1)
    labels = torch.randint(3, vocab, (1, batch), generator=generator)
    targets = Targets.at_positions(positions, labels, torch.ones_like(positions, dtype=torch.bool), mask, causal=True)
    options = {"baseline_token_id": -1, "internal_batch_size": internal}
    run = ForwardInputs(model, arch, inputs, Objective(1, targets.objective), options, torch.float32, fused)
    results: dict[str, list[float]] = {"uncached": [], "cached": []}
    outputs: dict[str, torch.Tensor] = {}
    with prepared_model(model), torch.no_grad():
        for cached in (False, True):  # warm-up, and the objectives to compare
            outputs[str(cached)] = occluded_objectives(run, prefix_cache=cached)
        for _ in range(repeats):
            results["uncached"].append(timed(lambda: occluded_objectives(run, prefix_cache=False), "cpu"))
            results["cached"].append(timed(lambda: occluded_objectives(run, prefix_cache=True), "cpu"))
    plain, reused = outputs["False"], outputs["True"]
    difference = float((plain - reused).abs().max() / plain.abs().max().clamp(min=1e-30))
    ratios = [u / c for u, c in zip(results["uncached"], results["cached"], strict=True)]
    return {
        "uncached": statistics.median(results["uncached"]),
        "cached": statistics.median(results["cached"]),
        "ratio": statistics.median(ratios),
        "difference": difference,
    }


def main(argv: list[str] | None = None) -> None:
    """Print the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["tiny", "writer"], choices=["tiny", "writer"])
    parser.add_argument("--lengths", nargs="+", type=int, default=[64, 128, 256])
    parser.add_argument("--batch", type=int, default=1, help="rows explained together (default 1)")
    parser.add_argument("--internal-batch-size", type=int, default=COPIES_PER_PASS, help="rows per forward")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--writer", type=Path, default=WRITER, help="the writer's checkpoint (default: its build)")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    _clock[0] = CLOCKS[args.clock]
    print(f"occlusion's forwards, batch {args.batch}, {args.internal_batch_size} rows per forward, "
          f"median of {args.repeats} ({args.clock} clock, {torch.get_num_threads()} threads)")  # fmt: skip
    print(f"{'model':<10} {'n':>5} {'uncached s':>11} {'cached s':>9} {'uncached/cached':>16} {'max rel diff':>13}")
    for name in args.models:
        if name == "writer":
            if not (args.writer / "config.json").is_file():
                print(f"{'writer':<10} not built at {args.writer} (make writer): skipped")
                continue
            model = writer_lm(args.writer)
        else:
            model = tiny_lm(args.hidden, args.layers, args.heads)
        for length in args.lengths:
            row = measure(model, length, args.batch, args.internal_batch_size, args.repeats)
            print(f"{name:<10} {length:>5} {row['uncached']:>11.3f} {row['cached']:>9.3f} {row['ratio']:>16.2f} "
                  f"{row['difference']:>13.1e}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
