"""Attention flow against the authors' networkx code (samiraabnar/attention_flow, ``attention_graph_util.py``).

The authors build the layered graph with ``get_adjmat`` from the head-averaged, residual-augmented, row-normalised
maps, give every edge its weight as capacity (their ``draw_attention_graph`` does so before drawing), and run
``compute_node_flow`` from the output nodes at the last layer to the input nodes: one networkx Edmonds–Karp per pair,
each output node's flows divided by their sum. Ours runs a padded batch; each row is compared with the authors' flow
for that example alone, in float64, on small inputs. Skipped with one line unless ``ATTENTION_FLOW_REFERENCE`` names
a checkout (tests/references.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from explainers import explain, explain_tokens
from explainers.architectures.description import describe
from explainers.capture import ATTENTIONS, prepared_model, run_capture
from explainers.inputs import validate_inputs

from .arch_zoo import VARIANTS, batch_for, build_token_level, row_alone, text_batch
from .references import FLOW, FLOW_MARKER, checkout, flow_functions

checkout(FLOW, FLOW_MARKER)  # or skip this module, with one line
pytest.importorskip("networkx", reason="networkx is not installed: the authors' flow code uses it")

TOLERANCE = 1e-9
#: The rotary families' eager attention computes its softmax in float32 even in a float64 model, so their maps (and
#: the flow through them) differ from the row alone by float32 rounding (measured: 6.6e-9 on the flow's shares).
FLOAT32_SOFTMAX = 1e-7


def _their_flow(functions: dict[str, Any], matrices: np.ndarray, source: int) -> np.ndarray:
    """The authors' flow from token ``source`` at the last layer to every input token (their notebooks' steps)."""
    import networkx

    layers, length, _ = matrices.shape
    adjacency, labels = functions["get_adjmat"](mat=matrices, input_tokens=[f"t{i}" for i in range(length)])
    graph = networkx.from_numpy_array(adjacency, create_using=networkx.DiGraph())
    for head, tail in graph.edges:
        graph[head][tail]["capacity"] = adjacency[head, tail]
    inputs = [key for key in labels if labels[key] < length]
    outputs = [f"L{layers}_{source}"]
    flows = functions["compute_node_flow"](graph, labels, inputs, outputs, length=length)
    return flows[layers * length + source][(layers - 1) * length : layers * length]


def _matrices(model: Any, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """The capacities the authors' graph is built from, computed apart from the method (capture, then their maths)."""
    arch = describe(model)
    validated = validate_inputs(arch, model, inputs)
    with prepared_model(model):
        capture = run_capture(model, arch, validated, frozenset({ATTENTIONS}), lambda logits: logits.argmax(dim=-1))
    assert capture.attentions is not None
    mixed = torch.stack(capture.attentions, dim=1)  # (1, layers, n, n) head means
    augmented = mixed + torch.eye(mixed.shape[-1], dtype=mixed.dtype)
    return (augmented / augmented.sum(dim=-1, keepdim=True))[0]


@pytest.mark.parametrize("name", ["bert", "llama", "vit"])
def test_attention_flow_equals_the_authors_networkx_code(name: str) -> None:
    functions = flow_functions()
    variant = next(variant for variant in VARIANTS if variant.name == name)
    model = variant.build()
    batch = batch_for(variant, model)
    ours = explain(model, batch, method="attention_flow").scores
    worst = 0.0
    for row in range(next(iter(batch.values())).shape[0]):
        alone = row_alone(batch, row)
        matrices = _matrices(model, alone)
        length = matrices.shape[-1]
        source = length - 1 if variant.pooled == "last" else 0
        theirs = torch.from_numpy(_their_flow(functions, matrices.numpy(), source))
        if variant.is_text:
            got = ours[row][batch["attention_mask"][row].bool()]
        else:
            got = ours[row].flatten()
            theirs = theirs[1:]  # the class token's share (ours scores the patches)
        worst = max(worst, float((got - theirs).abs().max()))
        assert worst <= (FLOAT32_SOFTMAX if name == "llama" else TOLERANCE), (row, got, theirs)
    print(f"\n{name}: largest difference from the authors' attention flow {worst:.1e}")


def test_attention_flow_of_an_entity_equals_the_authors_flow_from_its_token() -> None:
    """A one-token entity of a token classifier: the flow from that token (the many-target path's readout)."""
    functions = flow_functions()
    model = build_token_level("bert", "token_classification")
    batch = text_batch(model)
    spans = [[(2, 3, 0)], [(1, 2, 1)], [(4, 5, 2)], [(0, 1, 0)]]
    ours = explain_tokens(model, batch, method="attention_flow", positions=spans).scores
    for row, ((start, _, _),) in enumerate(spans):
        matrices = _matrices(model, row_alone(batch, row))
        theirs = torch.from_numpy(_their_flow(functions, matrices.numpy(), start))
        got = ours[row, 0][batch["attention_mask"][row].bool()]
        assert torch.allclose(got, theirs, atol=TOLERANCE, rtol=0)
