"""Attention flow (Abnar & Zuidema, ACL 2020): the maximum flow through the layers' attention graph, exact and batched.

The graph is the authors' (``get_adjmat`` and ``compute_node_flow`` in samiraabnar/attention_flow,
``attention_graph_util.py``): a node per token and layer boundary (layer 0 = the input tokens, layer ``l`` = the
output of block ``l``), an edge from token ``i`` at layer ``l`` to token ``j`` at layer ``l - 1`` whose capacity is
``Â_l[i, j]``, with ``Â = norm(½·(mean_h A + I))`` the matrices of ``rollout``. A token's score is the value of the
maximum flow from the explained position at the last layer to that token at the input, and the scores are
normalised to sum to 1 (the authors divide each output node's flows by their sum).

The authors run one networkx Edmonds–Karp per (output, input) pair in Python. Here one call of SciPy's Dinic
(:func:`scipy.sparse.csgraph.maximum_flow`, compiled) per input position serves every row of the batch at once: the
rows' graphs are disjoint parts of one graph, joined by a super-source (to each row's explained position) and a
super-sink (from each row's token at that position), so the one maximum flow is the sum of the rows' own and each
row's part of its minimum cut is its own minimum cut.

SciPy's solver takes integer capacities: it runs on the capacities quantised to ``2⁻³⁰`` (floored), and only finds
the minimum cut. The value returned is that cut's capacity summed in float64 from the *unquantised* capacities, so
it is the exact flow wherever the quantised and the true graph have the same minimum cut (every graph whose
competing cuts differ by more than the quantisation, ``≤ n·L·2⁻³⁰``); against the authors' networkx code the
scores agree to ≤ 1.1e-16 on the tests' models (tests/test_reference_flow.py) and to ≤ 5.6e-17 on MiniLM's maps
(``python -m bench.attention_flow``).

An explained row with several read tokens (mean pooling, DeiT's class and distillation tokens, an entity's span)
starts its flow from a super-source whose edge to each read token has the token's readout weight as its capacity (a
single read token: capacity 1, as large as the token's outflow, so the authors' flow).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

#: Quantisation of the capacities for the integer solver (their sum out of any node is at most 1).
SCALE = 2**30
#: Capacity of the edges that join the rows (never part of a minimum cut).
_UNBOUNDED = 2**31 - 1


def flow_matrices(attentions: Sequence[Tensor]) -> Tensor:
    """The capacities of each layer's edges: ``(batch, layers, n, n)`` ``norm(½·(mean_h A + I))``, input side first
    (the matrices of :func:`~explainers.rules.maps.rollout_matrix`).

    Args:
        attentions: per layer ``(batch, heads, n, n)`` probabilities or their head means ``(batch, n, n)``.
    """
    matrices = []
    for attention in attentions:
        mixed = attention.mean(dim=1) if attention.dim() == 4 else attention
        eye = torch.eye(mixed.shape[-1], dtype=mixed.dtype, device=mixed.device)
        augmented = 0.5 * (mixed + eye)
        matrices.append(augmented / augmented.sum(dim=-1, keepdim=True))
    return torch.stack(matrices, dim=1)


def attention_flow_scores(attentions: Sequence[Tensor], mask: Tensor, readout: Tensor | None = None) -> Tensor:
    """Attention flow from the explained row at the last layer to every input token, normalised to sum to 1.

    Args:
        attentions: per layer ``(batch, heads, n, n)`` attention probabilities or their head means.
        mask: ``(batch, n)`` 1 for the tokens of each row's graph (real tokens; for a causal model's step, the
            positions it sees), or ``(batch, k, n)`` with ``k`` explained rows per example.
        readout: ``(batch, n)`` weights of the explained row (``None``: the first token), or ``(batch, k, n)``.

    Returns:
        ``(batch, n)`` (or ``(batch, k, n)``) scores summing to 1 over each row's tokens, exactly 0 elsewhere.
    """
    matrices = flow_matrices(attentions)
    batch, _, length, _ = matrices.shape
    several = mask.dim() == 3
    masks = mask if several else mask.unsqueeze(1)
    if readout is None:
        readout = torch.zeros_like(masks, dtype=matrices.dtype)
        readout[..., 0] = 1
    readouts = readout if readout.dim() == 3 else readout.unsqueeze(1)
    readouts = readouts.expand(batch, masks.shape[1], length)
    rows = masks.shape[1]
    capacities = matrices.detach().to("cpu", torch.float64).numpy()
    keep = masks.detach().to("cpu").bool().numpy()
    weights = readouts.detach().to("cpu", torch.float64).numpy()
    graphs = [
        _RowGraph(capacities[example], np.flatnonzero(keep[example, row]), weights[example, row])
        for example in range(batch)
        for row in range(rows)
    ]
    flows = _max_flows(graphs)
    scores = torch.zeros((batch * rows, length), dtype=torch.float64)
    for index, (graph, flow) in enumerate(zip(graphs, flows, strict=True)):
        total = flow.sum()
        if total > 0:
            scores[index, graph.tokens] = torch.from_numpy(flow / total)
    scores = scores.view(batch, rows, length).to(device=mask.device, dtype=matrices.dtype)
    return scores if several else scores[:, 0]


class _RowGraph:
    """One explained row's layered graph over its tokens (``tokens``: positions in the padded sequence)."""

    def __init__(self, capacities: np.ndarray, tokens: np.ndarray, readout: np.ndarray) -> None:
        layers = capacities.shape[0]
        size = tokens.shape[0]
        self.tokens = tokens
        self.size = size
        self.nodes = (layers + 1) * size
        picked = capacities[:, tokens][:, :, tokens]  # (layers, size, size)
        rows, cols = np.meshgrid(np.arange(size), np.arange(size), indexing="ij")
        levels = np.arange(1, layers + 1).reshape(-1, 1, 1)
        self.heads = (levels * size + rows).ravel()  # from token i at layer l ...
        self.tails = ((levels - 1) * size + cols).ravel()  # ... to token j at layer l - 1
        self.capacities = picked.ravel()
        read = readout[tokens]
        self.sources = layers * size + np.flatnonzero(read > 0)  # the explained row's tokens at the last layer
        self.source_capacities = read[read > 0]


def _max_flows(graphs: Sequence[_RowGraph]) -> list[np.ndarray]:
    """Each graph's maximum flow to each of its input tokens (the tokens at layer 0), one solver call per position."""
    from scipy.sparse import csr_matrix  # a dependency of the library, imported on first use (the method declares it)
    from scipy.sparse.csgraph import breadth_first_order, maximum_flow

    offsets = np.cumsum([0] + [graph.nodes for graph in graphs])
    source, sink = int(offsets[-1]), int(offsets[-1]) + 1
    heads = np.concatenate([graph.heads + offset for graph, offset in zip(graphs, offsets, strict=False)])
    tails = np.concatenate([graph.tails + offset for graph, offset in zip(graphs, offsets, strict=False)])
    exact = np.concatenate([graph.capacities for graph in graphs])
    owners = np.concatenate([np.full(graph.heads.shape[0], index) for index, graph in enumerate(graphs)])
    quantised = np.floor(exact * SCALE).astype(np.int32)
    starts = np.concatenate([graph.sources + offset for graph, offset in zip(graphs, offsets, strict=False)])
    start_exact = np.concatenate([graph.source_capacities for graph in graphs])
    start_owners = np.concatenate([np.full(graph.sources.shape[0], index) for index, graph in enumerate(graphs)])
    start_quantised = np.minimum(np.floor(start_exact * SCALE), _UNBOUNDED).astype(np.int32)
    flows = [np.zeros(graph.size) for graph in graphs]
    for position in range(max(graph.size for graph in graphs)):
        members = [index for index, graph in enumerate(graphs) if position < graph.size]
        chosen = np.isin(start_owners, members)
        ends = np.array([offsets[index] + position for index in members])
        all_heads = np.concatenate([heads, np.full(int(chosen.sum()), source), ends])
        all_tails = np.concatenate([tails, starts[chosen], np.full(len(members), sink)])
        all_capacities = np.concatenate(
            [quantised, start_quantised[chosen], np.full(len(members), _UNBOUNDED, dtype=np.int32)]
        )
        graph = csr_matrix((all_capacities, (all_heads, all_tails)), shape=(sink + 1, sink + 1))
        result = maximum_flow(graph, source, sink, method="dinic")
        residual = graph - result.flow
        residual.data = (residual.data > 0).astype(np.int8)
        residual.eliminate_zeros()
        reached = np.zeros(sink + 1, dtype=bool)
        reached[breadth_first_order(residual, source, directed=True, return_predecessors=False)] = True
        cut = reached[heads] & ~reached[tails]
        start_cut = chosen & ~reached[starts]
        values = np.bincount(owners[cut], weights=exact[cut], minlength=len(graphs)).astype(np.float64)
        values += np.bincount(start_owners[start_cut], weights=start_exact[start_cut], minlength=len(graphs))
        for index in members:
            flows[index][position] = values[index]
    return flows
