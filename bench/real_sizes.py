"""What the methods cost on models of the sizes people serve: random weights, the exact shapes of real checkpoints.

The shapes below are copied from the published ``config.json`` of each checkpoint (nothing is downloaded; the
weights are the library's random initialisation, which does not change the cost). Each model gets a fresh
3-label classification head, is loaded with the library's default attention (``sdpa`` where the architecture has
it, as the service loads it), and is measured at each
``--shapes`` (default 1 × 512 and 8 × 128 tokens) and ``--dtypes``:

* time: the median of ``--repeats`` paired ratios ``method / plain forward`` (a forward timed right before each
  method call, so that the drift of a shared machine cancels), and the forward's median in ms;
* memory: each method's peak above the memory in use before the call (:mod:`bench.memory`), next to a plain
  forward's and a plain input-gradient backward's.

``bf16`` runs the forward under bfloat16 autocast (the attribution maths stays in float32); on CPU it is run only
where the CPU has native bfloat16 (``avx512_bf16`` or ``amx_bf16``), unless ``--dtypes bf16`` is given explicitly.
Integrated gradients is left out by default: it costs ``n_steps`` gradient passes (``n_steps / internal_batch_size``
batched ones), which the ``grad_x_input`` column gives.

    python -m bench.real_sizes                                   # all five models, CPU, float32 (+ bf16 if native)
    python -m bench.real_sizes --models bert-base --shapes 8x128 --repeats 3
    python -m bench.real_sizes --device cuda --dtypes bf16       # what bench/gpu.py runs
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bench.explainers import make_inputs, median_ratio, plain_gradient, timed
from bench.memory import peak_memory, prepare_cpu_allocator

log = logging.getLogger("bench.real_sizes")


@dataclass(frozen=True)
class Shape:
    """A published checkpoint's architecture: its ``model_type`` and the config keys that set its size."""

    checkpoint: str
    model_type: str
    config: Mapping[str, Any]


SHAPES: dict[str, Shape] = {
    "bert-base": Shape(
        "google-bert/bert-base-uncased",
        "bert",
        {"vocab_size": 30522, "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
         "intermediate_size": 3072, "max_position_embeddings": 512, "type_vocab_size": 2, "hidden_act": "gelu",
         "layer_norm_eps": 1e-12, "pad_token_id": 0},
    ),
    "deberta-v3-base": Shape(
        "microsoft/deberta-v3-base",
        "deberta-v2",
        {"vocab_size": 128100, "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
         "intermediate_size": 3072, "max_position_embeddings": 512, "relative_attention": True,
         "position_buckets": 256, "norm_rel_ebd": "layer_norm", "share_att_key": True,
         "pos_att_type": ["p2c", "c2p"], "layer_norm_eps": 1e-7, "max_relative_positions": -1,
         "position_biased_input": False, "type_vocab_size": 0, "hidden_act": "gelu", "pad_token_id": 0},
    ),
    "modernbert-base": Shape(
        "answerdotai/ModernBERT-base",
        "modernbert",
        {"vocab_size": 50368, "hidden_size": 768, "num_hidden_layers": 22, "num_attention_heads": 12,
         "intermediate_size": 1152, "max_position_embeddings": 8192, "global_attn_every_n_layers": 3,
         "local_attention": 128, "global_rope_theta": 160000.0, "local_rope_theta": 10000.0, "norm_eps": 1e-5,
         "norm_bias": False, "attention_bias": False, "mlp_bias": False, "classifier_pooling": "mean",
         "hidden_activation": "gelu", "pad_token_id": 50283, "bos_token_id": 50281, "eos_token_id": 50282,
         "cls_token_id": 50281, "sep_token_id": 50282},
    ),
    "qwen2-0.5b": Shape(
        "Qwen/Qwen2-0.5B",
        "qwen2",
        {"vocab_size": 151936, "hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14,
         "num_key_value_heads": 2, "intermediate_size": 4864, "max_position_embeddings": 131072,
         "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "hidden_act": "silu",
         "bos_token_id": 151643, "eos_token_id": 151643, "pad_token_id": 151643},
    ),
    "llama-3.2-1b": Shape(
        "meta-llama/Llama-3.2-1B",
        "llama",
        {"vocab_size": 128256, "hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32,
         "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 8192, "max_position_embeddings": 131072,
         "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": True, "hidden_act": "silu",
         "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                          "original_max_position_embeddings": 8192},
         "bos_token_id": 128000, "eos_token_id": 128001, "pad_token_id": 128004},
    ),
}  # fmt: skip

DEFAULT_METHODS = ("attention", "rollout", "gae", "grad_x_input", "attnlrp", "cp_lrp", "relevance")


def build(name: str, device: str, layers: int | None = None) -> nn.Module:
    """A random 3-label classifier with the shape of ``name`` (``layers``: fewer layers, for a quick check only),
    initialised on ``device``, with the library's default attention (``sdpa`` where the architecture has it, as the
    service loads it; DeBERTa has only eager), in eval mode."""
    from transformers import AutoConfig, AutoModelForSequenceClassification
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    shape = SHAPES[name]
    sizes = dict(shape.config)
    if layers is not None:
        sizes["num_hidden_layers"] = layers
    config = AutoConfig.for_model(shape.model_type, **sizes, num_labels=3)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForSequenceClassification.from_config(config)
    return model.eval()


def parameter_count(name: str, layers: int | None = None) -> float:
    """Millions of parameters of :func:`build`'s model (built on the ``meta`` device: no memory, no time)."""
    return sum(parameter.numel() for parameter in build(name, "meta", layers).parameters()) / 1e6


def native_bf16() -> bool:
    """Whether this CPU computes bfloat16 natively (AVX512-BF16 or AMX); elsewhere bf16 is emulated, and slower."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


@dataclass
class Row:
    """One (model, dtype, shape) measurement."""

    model: str
    params_m: float
    dtype: str
    batch: int
    length: int
    forward_ms: float
    ratios: dict[str, float | None] = field(default_factory=dict)
    memory_mib: dict[str, float | None] = field(default_factory=dict)
    load: float = 0.0


def measure(
    model: nn.Module,
    name: str,
    dtype: str,
    batch: int,
    length: int,
    methods: list[str],
    repeats: int,
    device: str,
) -> Row:
    """Time and memory of each method on one random batch (refused methods: ``None``)."""
    from explainers import describe, explain
    from explainers.architectures.support import refusal

    model_type = describe(model).model_type
    autocast = torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=dtype == "bf16")
    inputs = make_inputs(model, batch, length, device)

    def forward() -> object:
        with torch.inference_mode(), autocast:
            return model(**inputs).logits

    def gradient() -> object:
        with autocast:
            return plain_gradient(model, inputs)

    timed(forward, device)
    base = statistics.median(timed(forward, device) for _ in range(max(1, repeats)))
    params = sum(parameter.numel() for parameter in model.parameters()) / 1e6
    row = Row(name, round(params, 1), dtype, batch, length, round(base * 1e3, 1), load=os.getloadavg()[0])
    for label, run in (("forward", forward), ("gradient", gradient)):
        with peak_memory(device) as peak:
            run()
        row.memory_mib[label] = round(peak.mib)
    row.ratios["gradient"] = round(median_ratio(gradient, forward, repeats, device), 2)
    for method in methods:
        if refusal(model_type, method) is not None:
            row.ratios[method] = row.memory_mib[method] = None
            continue

        def run(method: str = method) -> object:
            with autocast:
                return explain(model, inputs, method=method)

        row.ratios[method] = round(median_ratio(run, forward, repeats, device), 2)
        gc.collect()
        with peak_memory(device) as peak:
            run()
        row.memory_mib[method] = round(peak.mib)
        log.info("%s %s %dx%d %s: %.2fx, %.0f MiB", name, dtype, batch, length, method, row.ratios[method], peak.mib)
    return row


def format_tables(rows: list[Row], methods: list[str]) -> str:
    """Two markdown tables: time ratios (with the forward in ms) and peak memory above the loaded model."""
    columns = ["gradient", *methods]

    def cell(value: float | None, unit: str = "") -> str:
        return "refused" if value is None else f"{value:g}{unit}"

    lines = [
        "| model | params M | dtype | batch x len | forward ms | "
        + " | ".join(f"{c} x" for c in columns)
        + " | load |",
        "|---|---:|---|---|---:|" + "---:|" * len(columns) + "---:|",
    ]
    for row in rows:
        ratios = " | ".join(cell(row.ratios.get(c)) for c in columns)
        lines.append(
            f"| {row.model} | {row.params_m:g} | {row.dtype} | {row.batch}x{row.length} | {row.forward_ms:g} "
            f"| {ratios} | {row.load:.1f} |"
        )
    memory_columns = ["forward", *columns]
    lines += [
        "",
        "| model | dtype | batch x len | " + " | ".join(f"{c} MiB" for c in memory_columns) + " |",
        "|---|---|---|" + "---:|" * len(memory_columns),
    ]
    for row in rows:
        cells = " | ".join(cell(row.memory_mib.get(c)) for c in memory_columns)
        lines.append(f"| {row.model} | {row.dtype} | {row.batch}x{row.length} | {cells} |")
    return "\n".join(lines)


def parse_shape(text: str) -> tuple[int, int]:
    """``"8x128"`` → ``(8, 128)``."""
    batch, _, length = text.partition("x")
    return int(batch), int(length)


def run(args: argparse.Namespace, on_row: Callable[[Row], None] | None = None) -> list[Row]:
    """Measure every model × dtype × shape of ``args``; models are built one at a time and freed after."""
    if args.device == "cpu":
        prepare_cpu_allocator()
    dtypes = args.dtypes or (["float32", "bf16"] if args.device == "cuda" or native_bf16() else ["float32"])
    rows: list[Row] = []
    for name in args.models:
        started = time.perf_counter()
        model = build(name, args.device, args.layers)
        log.info("%s built in %.1f s", name, time.perf_counter() - started)
        for dtype in dtypes:
            for batch, length in map(parse_shape, args.shapes):
                row = measure(model, name, dtype, batch, length, args.methods, args.repeats, args.device)
                rows.append(row)
                if on_row is not None:
                    on_row(row)
        del model
        gc.collect()
        if args.device == "cuda":
            torch.cuda.empty_cache()
    return rows


def parser() -> argparse.ArgumentParser:
    """The command line (shared with :mod:`bench.gpu`)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--shapes", nargs="+", default=["1x512", "8x128"], help="BATCHxLENGTH")
    parser.add_argument("--dtypes", nargs="+", choices=["float32", "bf16"], help="default: float32 (+ bf16 if native)")
    parser.add_argument("--methods", nargs="+", default=list(DEFAULT_METHODS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--layers", type=int, default=None, help="fewer layers, to check the script quickly only")
    parser.add_argument("--out", type=Path, default=Path("run") / "bench-real-sizes.json")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the tables."""
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    log.info("device=%s torch threads=%d load=%.1f", args.device, torch.get_num_threads(), os.getloadavg()[0])
    if args.device == "cpu" and not native_bf16() and not args.dtypes:
        log.info("this CPU has no native bfloat16 (no avx512_bf16/amx_bf16 flag): float32 only")
    rows = run(args)
    print(format_tables(rows, args.methods))
    if args.layers is not None:
        print(f"\n(--layers {args.layers}: NOT the real sizes, a quick check of the script only)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps([asdict(row) for row in rows], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
