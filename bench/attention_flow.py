"""Attention flow's cost against the input length, beside the authors' networkx implementation on the same matrices.

The matrices are a real model's: the MiniLM checkpoint the ``sentiment`` model is built from (6 layers, 12 heads;
``--arch`` a random model instead), run on random token ids of each length ``n``; the flow runs from the first token
at the last layer to every input token, for one example. Ours is :func:`explainers.rules.flow.attention_flow_scores`
(the method's kernel, the capture not included). The authors' is ``compute_node_flow`` of samiraabnar/attention_flow
(``--reference``: a checkout of it; networkx), one Edmonds–Karp per (output, input) pair: at lengths where running all
``n`` of them would take too long (``--networkx-sinks K`` of them are timed; default: every sink up to ``n = 32``,
4 sinks above), its time is the mean time of one pair times ``n`` (every pair solves a graph of the same size), and
the table says so. The numbers of both are compared where they both ran.

    python -m bench.attention_flow --reference /path/to/attention_flow
    python -m bench.attention_flow --lengths 16 32 64 128 256 512 --repeats 3 --reference /path/to/attention_flow
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from explainers.architectures.description import describe
from explainers.capture import ATTENTIONS, prepared_model, run_capture
from explainers.inputs import validate_inputs
from explainers.rules.flow import attention_flow_scores, flow_matrices

from .explainers import build_model, default_checkpoint, load_model, make_inputs

log = logging.getLogger("bench.attention_flow")


def head_means(model: Any, length: int) -> list[torch.Tensor]:
    """Per layer ``(1, n, n)`` head-mean attention of ``model`` on random token ids of ``length``."""
    inputs = make_inputs(model, 1, length, "cpu")
    arch = describe(model)
    validated = validate_inputs(arch, model, inputs)
    with prepared_model(model):
        capture = run_capture(model, arch, validated, frozenset({ATTENTIONS}), lambda logits: logits.argmax(dim=-1))
    assert capture.attentions is not None
    return [attention.double() for attention in capture.attentions]


def networkx_flow(reference: Path, matrices: np.ndarray, sinks: int) -> tuple[np.ndarray | None, float]:
    """The authors' flow from token 0 (``None`` unless every sink ran) and their time for all ``n`` sinks (measured
    over ``sinks`` of them, times ``n / sinks``)."""
    import networkx

    functions = _reference_functions(reference)
    layers, length, _ = matrices.shape
    adjacency, labels = functions["get_adjmat"](mat=matrices, input_tokens=[f"t{i}" for i in range(length)])
    graph = networkx.from_numpy_array(adjacency, create_using=networkx.DiGraph())
    for head, tail in graph.edges:
        graph[head][tail]["capacity"] = adjacency[head, tail]
    inputs = [key for key in labels if labels[key] < length][: min(sinks, length)]
    started = time.perf_counter()
    flows = functions["compute_node_flow"](graph, labels, inputs, [f"L{layers}_0"], length=length)
    seconds = (time.perf_counter() - started) * length / len(inputs)
    if len(inputs) < length:
        return None, seconds
    return flows[layers * length][(layers - 1) * length : layers * length], seconds


def _reference_functions(reference: Path) -> dict[str, Any]:
    """``get_adjmat`` and ``compute_node_flow`` compiled from the checkout's own file (it imports TensorFlow,
    unused by them)."""
    import ast

    import networkx

    path = reference / "attention_graph_util.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = ("get_adjmat", "compute_node_flow")
    wanted: list[ast.stmt] = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name in names]
    namespace: dict[str, Any] = {"nx": networkx, "np": np}
    exec(compile(ast.Module(body=wanted, type_ignores=[]), str(path), "exec"), namespace)
    return {name: namespace[name] for name in names}


def main(argv: list[str] | None = None) -> None:
    """Print the table: per length, our time, the authors' time, their ratio and the largest difference."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[16, 32, 64, 128, 256, 512])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--reference", type=Path, help="a checkout of samiraabnar/attention_flow (networkx timings)")
    parser.add_argument("--networkx-sinks", type=int, default=None, help="sinks timed per length (default: see above)")
    parser.add_argument("--networkx-max-length", type=int, default=128, help="longest length the authors' code runs")
    parser.add_argument("--arch", default=None, help="a random 6-layer model of this architecture, not MiniLM")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_grad_enabled(False)
    if args.arch:
        model = build_model(args.arch, 6, 384, 12, 1536, max(args.lengths))
    else:
        model = load_model(default_checkpoint(), "cpu")
    log.info("torch threads=%d", torch.get_num_threads())
    print("| n | ours s | authors' networkx s | networkx / ours | largest difference |")
    print("|---|---|---|---|---|")
    for length in args.lengths:
        attentions = head_means(model, length)
        mask = torch.ones((1, length), dtype=torch.float64)
        times = []
        for _ in range(args.repeats):
            started = time.perf_counter()
            ours = attention_flow_scores(attentions, mask)
            times.append(time.perf_counter() - started)
        mine = statistics.median(times)
        theirs_cell, ratio_cell, difference_cell = "-", "-", "-"
        if args.reference is not None and length <= args.networkx_max_length:
            sinks = args.networkx_sinks or (length if length <= 32 else 4)
            matrices = flow_matrices(attentions)[0].numpy()
            theirs, seconds = networkx_flow(args.reference, matrices, sinks)
            estimated = "" if theirs is not None else f" (from {sinks} sinks)"
            theirs_cell, ratio_cell = f"{seconds:.2f}{estimated}", f"{seconds / mine:.0f}"
            if theirs is not None:
                difference_cell = f"{float(np.abs(ours[0].numpy() - theirs).max()):.1e}"
        print(f"| {length} | {mine:.3f} | {theirs_cell} | {ratio_cell} | {difference_cell} |", flush=True)


if __name__ == "__main__":
    main()
