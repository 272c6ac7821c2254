"""Chefer et al.'s relevance against an independent per-example implementation, and LRP conservation.

The oracle below is written separately from ``explainers/``: it captures activations with its own hooks and
applies each LRP rule through ``torch.autograd.grad`` on the forward expression (the "gradient × input" form of
the rules, as in the authors' code), one example at a time, summing over the whole tensor where the authors do.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import AlbertConfig, AlbertForSequenceClassification

from explainers import explain
from explainers.architectures.description import describe
from explainers.capture import ACTIVATIONS, ATTENTION_GRADIENTS, ATTENTIONS, prepared_model, run_capture
from explainers.methods.lrp_pass import block_weights as _block_weights
from explainers.rules.lrp import block_relprop, head_relprop, linear_relprop

from .arch_zoo import VARIANTS, batch_for, row_alone
from .conftest import build_bert, build_roberta, build_vit, build_vit_wide, image_batch, row_inputs, text_batch
from .weights import perturb


def _divide(numerator: Tensor, denominator: Tensor) -> Tensor:
    return torch.where(denominator == 0, torch.zeros_like(numerator), numerator / (denominator + 1e-9))


def _gradprop(output: Tensor, inputs: list[Tensor], relevance: Tensor) -> list[Tensor]:
    """LRP-z through ``output = f(inputs)``: ``x · ∂(Σ Z·S)/∂x`` with ``S = R / Z``."""
    grads = torch.autograd.grad(output, inputs, _divide(relevance, output.detach()))
    return [x.detach() * g for x, g in zip(inputs, grads, strict=True)]


def _linear(x: Tensor, weight: Tensor, relevance: Tensor) -> Tensor:
    px = x.clamp(min=0).requires_grad_(True)
    nx = x.clamp(max=0).requires_grad_(True)
    z = F.linear(px, weight.clamp(min=0)) + F.linear(nx, weight.clamp(max=0))
    first, second = _gradprop(z, [px, nx], relevance)
    return first + second


def _matmul(a: Tensor, b: Tensor, relevance: Tensor) -> tuple[Tensor, Tensor]:
    a = a.detach().requires_grad_(True)
    b = b.detach().requires_grad_(True)
    ra, rb = _gradprop(a @ b, [a, b], relevance)
    return ra, rb


def _add(a: Tensor, b: Tensor, relevance: Tensor) -> tuple[Tensor, Tensor]:
    a = a.detach().requires_grad_(True)
    b = b.detach().requires_grad_(True)
    ra, rb = _gradprop(a + b, [a, b], relevance)
    total = relevance.sum()
    sa, sb = ra.sum(), rb.sum()
    return ra * (sa.abs() / (sa.abs() + sb.abs()) * total) / sa, rb * (sb.abs() / (sa.abs() + sb.abs()) * total) / sb


class _Tape:
    """Own hooks: inputs and outputs of named modules, per call (a shared ALBERT layer is called once per layer).

    ``modules`` maps a name to ``(module, call)``: the value kept under the name is the module's ``call``-th call.
    """

    def __init__(self, modules: dict[str, tuple[nn.Module, int]]) -> None:
        self.calls: dict[int, list[tuple[Any, Any]]] = {}
        self.modules = modules
        unique = {id(module): module for module, _ in modules.values()}
        self.handles = [module.register_forward_hook(self._hook) for module in unique.values()]

    def _hook(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        self.calls.setdefault(id(module), []).append((args[0].detach() if args else None, output))

    @property
    def values(self) -> dict[str, Any]:
        return {name: self.calls[id(module)][call] for name, (module, call) in self.modules.items()}

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()


# Where each family keeps the modules the oracle reads, written here independently of
# explainers/architectures/blocks.py:
# (attention module, q, k, v, attention output, first and second feed-forward linears), relative to a layer.
_BERT_PATHS = ("attention.self", "attention.self.query", "attention.self.key", "attention.self.value",
               "attention.output.dense", "intermediate.dense", "output.dense")  # fmt: skip
_VIT_PATHS = ("attention", "attention.q_proj", "attention.k_proj", "attention.v_proj", "attention.o_proj",
              "mlp.fc1", "mlp.fc2")  # fmt: skip
_PATHS = {
    "bert": _BERT_PATHS,
    "roberta": _BERT_PATHS,
    "xlm-roberta": _BERT_PATHS,
    "electra": _BERT_PATHS,
    "albert": (
        "attention",
        "attention.query",
        "attention.key",
        "attention.value",
        "attention.dense",
        "ffn",
        "ffn_output",
    ),
    "distilbert": (
        "attention",
        "attention.q_lin",
        "attention.k_lin",
        "attention.v_lin",
        "attention.out_lin",
        "ffn.lin1",
        "ffn.lin2",
    ),
    "vit": _VIT_PATHS,
    "deit": _VIT_PATHS,
}


def _get(root: Any, path: str) -> Any:
    for name in path.split("."):
        root = getattr(root, name)
    return root


def _layers_and_heads(model: Any) -> tuple[list[nn.Module], list[list[nn.Linear]], list[int]]:
    """The layers in call order, the linear layers of each head, and the token each head reads."""
    model_type = model.config.model_type
    if model_type == "albert":
        groups = model.albert.encoder.albert_layer_groups
        count, group_count = model.config.num_hidden_layers, model.config.num_hidden_groups
        layers = [layer for i in range(count) for layer in groups[i * group_count // count].albert_layers]
        return layers, [[model.albert.pooler, model.classifier]], [0]
    if model_type in ("vit", "deit"):
        base = model.vit if model_type == "vit" else model.deit
        if hasattr(model, "distillation_classifier"):
            return list(base.layers), [[model.cls_classifier], [model.distillation_classifier]], [0, 1]
        return list(base.layers), [[model.classifier]], [0]
    if model_type == "distilbert":
        return list(model.distilbert.transformer.layer), [[model.pre_classifier, model.classifier]], [0]
    base = model.bert if model_type == "bert" else model.electra if model_type == "electra" else model.roberta
    head = [model.bert.pooler.dense, model.classifier] if model_type == "bert" else [
        model.classifier.dense, model.classifier.out_proj]  # fmt: skip
    return list(base.encoder.layer), [head], [0]


def _layer_names(layers: list[nn.Module], paths: tuple[str, ...]) -> dict[str, tuple[nn.Module, int]]:
    """What the oracle tapes of each layer (``{i}.layer``, ``{i}.attn``, ``{i}.q`` ... ``{i}.fc2``), each with the call
    of its module that belongs to layer ``i`` (a shared ALBERT layer is called once per layer)."""
    names: dict[str, tuple[nn.Module, int]] = {}
    seen: dict[int, int] = {}
    for i, layer in enumerate(layers):
        call = seen.get(id(layer), 0)
        seen[id(layer)] = call + 1
        names[f"{i}.layer"] = (layer, call)
        for key, path in zip(("attn", "q", "k", "v", "o", "fc1", "fc2"), paths, strict=True):
            names[f"{i}.{key}"] = (_get(layer, path), call)
    return names


def _oracle_blocks(
    model: Any,
    v: dict[str, Any],
    modules: dict[str, Any],
    count: int,
    probabilities: list[Tensor],
    token_relevance: Tensor,
    start_layer: int,
) -> dict[int, Tensor]:
    """The oracle's LRP through the blocks (taped values ``v``), from the relevance of the last block's output down to
    ``start_layer``: each block's attention relevance ("cam")."""
    heads = model.config.num_attention_heads
    vit = model.config.model_type in ("vit", "deit")
    cams: dict[int, Tensor] = {}
    for i in reversed(range(start_layer, count)):
        x = v[f"{i}.q"][0]
        hidden = v[f"{i}.layer"][0]
        attention_out = v[f"{i}.o"][1].detach()
        residual = hidden + attention_out if vit else v[f"{i}.fc1"][0]
        r_ffn, r_res = _add(v[f"{i}.fc2"][1].detach(), residual, token_relevance)
        r_ffn = _linear(v[f"{i}.fc2"][0], modules[f"{i}.fc2"].weight.detach(), r_ffn)
        r_ffn = _linear(v[f"{i}.fc1"][0], modules[f"{i}.fc1"].weight.detach(), r_ffn)
        r_mid = r_ffn + r_res
        r_att, r_skip = _add(attention_out, hidden, r_mid)
        r_ctx = _linear(v[f"{i}.o"][0], modules[f"{i}.o"].weight.detach(), r_att)

        def heads_of(t: Tensor) -> Tensor:
            return t.detach().reshape(1, t.shape[1], heads, -1).permute(0, 2, 1, 3)

        def merge(t: Tensor) -> Tensor:
            return t.permute(0, 2, 1, 3).reshape(1, t.shape[2], -1)

        r_probs, r_value = _matmul(probabilities[i].detach(), heads_of(v[f"{i}.v"][1]), heads_of(r_ctx))
        cams[i] = r_probs / 2
        q, k = heads_of(v[f"{i}.q"][1]), heads_of(v[f"{i}.k"][1])
        r_scores = cams[i]
        if not vit:  # the reference BERT code passes relevance through "scores + mask" (mask 0 here)
            scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
            r_scores = scores * _divide(r_scores, scores)
            r_scores = r_scores * cams[i].sum() / r_scores.sum()
        r_q, r_kt = _matmul(q, k.transpose(-1, -2), r_scores)
        r_x = (
            _linear(x, modules[f"{i}.q"].weight.detach(), merge(r_q / 2))
            + _linear(x, modules[f"{i}.k"].weight.detach(), merge(r_kt.transpose(-1, -2) / 2))
            + _linear(x, modules[f"{i}.v"].weight.detach(), merge(r_value / 2))
        )
        token_relevance = r_x + r_skip
    return cams


def _oracle_rollout(
    gradients: tuple[Tensor, ...], cams: dict[int, Tensor], start_layer: int, read: list[int]
) -> Tensor:
    """Chefer et al.'s rollout of ``norm(E_h[(∇A ⊙ R)⁺] + I)`` from ``start_layer`` up, the mean of the rows ``read``,
    their own entries set to the row's minimum (the authors' [CLS] rule, at every token read)."""
    length = gradients[0].shape[-1]
    joint = torch.eye(length, dtype=torch.float64)
    for i in range(start_layer, len(gradients)):
        weighted = (gradients[i][0] * cams[i][0]).clamp(min=0).mean(0) + torch.eye(length, dtype=torch.float64)
        joint = (weighted / weighted.sum(-1, keepdim=True)) @ joint
    scores = sum(joint[token] for token in read) / len(read)
    assert isinstance(scores, Tensor)
    scores = scores.clone()
    minimum = scores.min()
    for token in read:
        scores[token] = minimum
    return scores


def _oracle(model: Any, inputs: dict[str, Tensor], target: int, start_layer: int) -> Tensor:
    """Relevance of one example (batch 1, no padding), from scratch."""
    model_type = model.config.model_type
    vit = model_type in ("vit", "deit")
    layers, heads_linears, head_tokens = _layers_and_heads(model)
    names = _layer_names(layers, _PATHS[model_type])
    for h, head_linears in enumerate(heads_linears):
        for j, linear in enumerate(head_linears):
            names[f"head{h}.{j}"] = (linear, 0)
    modules: dict[str, Any] = {name: module for name, (module, _) in names.items()}
    tape = _Tape(names)
    try:
        output = model(**inputs)
    finally:
        tape.close()
    v = tape.values
    probabilities = [v[f"{i}.attn"][1][1] for i in range(len(layers))]
    gradients = torch.autograd.grad(output.logits[0, target], probabilities)

    hidden_last = v[f"{len(layers) - 1}.layer"][1]
    hidden_last = hidden_last[0] if isinstance(hidden_last, tuple) else hidden_last
    token_relevance = torch.zeros_like(hidden_last.detach())
    # Several heads whose logits the model averages (DeiT with a teacher): each gets the share |z_h| / Σ|z| of the
    # target's relevance, the magnitude normalisation of Chefer et al.'s skip-connection rule.
    head_logits = [
        v[f"head{h}.{len(linears) - 1}"][1][0, target].detach().abs() for h, linears in enumerate(heads_linears)
    ]
    for h, head_linears in enumerate(heads_linears):
        relevance = torch.zeros_like(output.logits)
        relevance[0, target] = head_logits[h] / sum(head_logits) if len(heads_linears) > 1 else 1.0
        for j in reversed(range(len(head_linears))):
            relevance = _linear(v[f"head{h}.{j}"][0], head_linears[j].weight.detach(), relevance)
        token_relevance[:, head_tokens[h]] += relevance
    cams = _oracle_blocks(model, v, modules, len(layers), probabilities, token_relevance, start_layer)

    scores = _oracle_rollout(gradients, cams, start_layer, head_tokens)
    return scores[2 if model_type == "deit" else 1 :] if vit else scores  # DeiT: class and distillation tokens


ORACLE_CASES = [("bert", build_bert), ("roberta", build_roberta), ("vit", build_vit), ("vit_wide", build_vit_wide)]


@pytest.mark.parametrize("name, build", ORACLE_CASES, ids=[c[0] for c in ORACLE_CASES])
@pytest.mark.parametrize("start_layer", [0, 1])
def test_relevance_matches_an_independent_per_example_implementation(name: str, build: Any, start_layer: int) -> None:
    model = build().double()
    batch = image_batch(model) if name.startswith("vit") else text_batch(model)
    result = explain(model, batch, method="relevance", start_layer=start_layer)
    for row in range(result.target.shape[0]):
        for target in (int(result.target[row]), (int(result.target[row]) + 1) % 3):
            expected = _oracle(model, row_inputs(batch, row), target, start_layer)
            alone = explain(model, row_inputs(batch, row), method="relevance", target=target, start_layer=start_layer)
            got = alone.scores[0].flatten()
            assert torch.allclose(got, expected, atol=1e-6 * float(expected.abs().max()), rtol=0), (row, target)
            if target == int(result.target[row]):
                padded = result.scores[row].flatten()[: expected.shape[0]]
                assert torch.allclose(padded, expected, atol=1e-6 * float(expected.abs().max()), rtol=0)


ZOO_ORACLE_CASES = ["xlm-roberta", "electra", "albert", "distilbert", "deit", "deit-teacher"]


@pytest.mark.parametrize("name", ZOO_ORACLE_CASES)
def test_relevance_of_every_supported_family_matches_the_oracle(name: str) -> None:
    """The families added for issue 9 (shared ALBERT layers, ELECTRA's head, DeiT's two prefix tokens and, with a
    teacher, its two averaged heads) against the same independent per-example implementation, batched too."""
    variant = next(variant for variant in VARIANTS if variant.name == name)
    model = variant.build()
    batch = batch_for(variant, model)
    result = explain(model, batch, method="relevance")
    for row in range(result.target.shape[0]):
        for target in (int(result.target[row]), (int(result.target[row]) + 1) % 3):
            expected = _oracle(model, row_alone(batch, row), target, 0)
            alone = explain(model, row_alone(batch, row), method="relevance", target=target)
            got = alone.scores[0].flatten()
            assert torch.allclose(got, expected, atol=1e-6 * float(expected.abs().max()), rtol=0), (row, target)
            if target == int(result.target[row]):
                padded = result.scores[row].flatten()[: expected.shape[0]]
                assert torch.allclose(padded, expected, atol=1e-6 * float(expected.abs().max()), rtol=0)


def test_relevance_of_albert_with_layer_groups_matches_the_oracle() -> None:
    """ALBERT with two groups of two shared layers (four layers, eight attention calls)."""
    config = AlbertConfig(
        vocab_size=60, hidden_size=32, num_hidden_layers=4, num_attention_heads=4, intermediate_size=48,
        embedding_size=16, num_hidden_groups=2, inner_group_num=2,
    )  # fmt: skip
    config.num_labels = 3
    config._attn_implementation = "eager"
    model = perturb(AlbertForSequenceClassification(config), 5).double().eval()
    batch = text_batch(model)
    result = explain(model, batch, method="relevance")
    for row in range(result.target.shape[0]):
        expected = _oracle(model, row_inputs(batch, row), int(result.target[row]), 0)
        got = result.scores[row][: expected.shape[0]]
        assert torch.allclose(got, expected, atol=1e-6 * float(expected.abs().max()), rtol=0), row


def _zoo(name: str) -> Any:
    return next(variant for variant in VARIANTS if variant.name == name).build()


CONSERVATION_CASES = [build_bert, build_roberta, build_vit] + [
    functools.partial(_zoo, name) for name in ("xlm-roberta", "electra", "albert", "distilbert", "deit")
]
CONSERVATION_IDS = ["bert", "roberta", "vit", "xlm-roberta", "electra", "albert", "distilbert", "deit"]


@pytest.mark.parametrize("build", CONSERVATION_CASES, ids=CONSERVATION_IDS)
def test_relevance_is_conserved_through_every_block(build: Any) -> None:
    """Chefer et al., Eq. 7–10: with α=1, β=0 and the skip-connection normalisation, Σ R is the same at every block."""
    model = build().double()
    batch = image_batch(model) if model.config.model_type in ("vit", "deit") else text_batch(model)
    arch = describe(model)
    with prepared_model(model):
        capture = run_capture(
            model, arch, batch, frozenset({ATTENTIONS, ATTENTION_GRADIENTS, ACTIVATIONS}), lambda x: x.argmax(-1)
        )
    assert capture.activations is not None and capture.head_inputs is not None
    one_hot = F.one_hot(capture.targets, 3).double()
    first = head_relprop(capture.head_inputs, [lin.weight.detach() for lin in arch.head], one_hot)
    assert torch.allclose(first.sum(-1), torch.ones(first.shape[0], dtype=torch.float64), atol=1e-9)
    relevance = torch.zeros_like(capture.activations[-1].hidden)
    relevance[:, 0] = first
    weights = _block_weights(arch, torch.float64)
    for index in reversed(range(arch.num_layers)):
        below, cam = block_relprop(
            capture.activations[index], weights[index], relevance, arch.num_heads, arch.norm_first
        )
        assert below is not None
        assert torch.allclose(below.sum(dim=(1, 2)), relevance.sum(dim=(1, 2)), atol=1e-8)
        assert cam.shape == capture.activations[index].probabilities.shape
        if "attention_mask" in batch:
            padding = batch["attention_mask"] == 0
            assert (below[padding] == 0).all() and (cam.sum(1)[padding] == 0).all()
        relevance = below


@pytest.mark.parametrize("with_bias", [True, False])
def test_linear_rule_from_the_forward_output_equals_the_two_matmul_form(with_bias: bool) -> None:
    """The one-matmul denominator ((x·Wᵀ + |x|·|W|ᵀ)/2 from the layer's output) gives the α1β0 shares of the
    direct x⁺W⁺ + x⁻W⁻ form, also for outputs whose positive contributions are all exactly 0, and conserves
    relevance wherever the denominator is not 0."""
    generator = torch.Generator().manual_seed(3)
    layer = nn.Linear(24, 10, bias=with_bias).double()
    with torch.no_grad():
        layer.weight.copy_(torch.randn(10, 24, generator=generator, dtype=torch.float64))
        layer.weight[0] = -layer.weight[0].abs()  # output 0: no positive contribution from non-negative inputs
    inputs = torch.randn(2, 5, 24, generator=generator, dtype=torch.float64)
    inputs[0, 0] = inputs[0, 0].abs()
    relevance = torch.randn(2, 5, 10, generator=generator, dtype=torch.float64)
    with torch.no_grad():
        output = layer(inputs)
    direct = linear_relprop(inputs, layer.weight, relevance)
    reused = linear_relprop(inputs, layer.weight, relevance, output, layer.bias)
    assert torch.isfinite(reused).all()
    torch.testing.assert_close(reused, direct, rtol=1e-9, atol=1e-12)
    positive = inputs.clamp(min=0) @ layer.weight.clamp(min=0).T + inputs.clamp(max=0) @ layer.weight.clamp(max=0).T
    assert positive[0, 0, 0] == 0  # the all-zero case is exercised
    kept = (relevance * (positive > 0)).sum(dim=-1)
    torch.testing.assert_close(direct.sum(dim=-1), kept)


def test_half_precision_forward_is_not_reused_as_exact_products() -> None:
    """Under a bf16 autocast the captured layer outputs are rounded: the LRP rules must recompute their products
    (``forward_precision`` False after the float32 upcast) and still give finite, zero-padded relevance near the
    float32 result."""
    model = build_bert()
    batch = text_batch(model)
    arch = describe(model)
    needs = frozenset({ATTENTIONS, ATTENTION_GRADIENTS, ACTIVATIONS})
    with prepared_model(model), torch.autocast("cpu", dtype=torch.bfloat16):
        capture = run_capture(model, arch, batch, needs, lambda x: x.argmax(-1))
    assert capture.activations is not None
    assert all(not acts.forward_precision and acts.ffn_pre.dtype == torch.float32 for acts in capture.activations)
    with prepared_model(model):
        exact = run_capture(model, arch, batch, needs, lambda x: x.argmax(-1))
    assert exact.activations is not None and all(acts.forward_precision for acts in exact.activations)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        half = explain(model, batch, method="relevance", target=0).scores
    full = explain(model, batch, method="relevance", target=0).scores
    assert torch.isfinite(half).all() and (half[batch["attention_mask"] == 0] == 0).all()
    # bf16 keeps ~3 significant digits per layer: 13 % of the largest score measured on this tiny random model.
    assert (half - full).abs().max() <= 0.25 * full.abs().max()
