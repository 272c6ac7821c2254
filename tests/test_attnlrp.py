"""AttnLRP and CP-LRP: each rule on its own, an explicit rule-by-rule propagation through one block, conservation
(CP-LRP, biases zero), the softmax rule's absorption, mixed-batch isolation and state hygiene.

The generated tests of ``test_explainers.py`` cover both methods too (shapes, padding exactly 0, batched ==
per-example, logits equal a plain forward, model unchanged).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
import transformers
from torch import Tensor, nn
from transformers import BertConfig, BertForSequenceClassification

from explainers import RowExplanation, RowRequest, describe, explain, explain_batch
from explainers.architectures.attention import capturing_attention
from explainers.architectures.rule_hooks import attach_rules
from explainers.capture import prepared_model
from explainers.rules import attnlrp as rules

from .conftest import _eager, _labelled, build_bert, build_vit, image_batch, row_inputs, text_batch
from .test_explainers import _assert_same, _snapshot, _unusual_state
from .weights import perturb

# ---- the rules, one by one ---------------------------------------------------------------------------------


def _gradient(output: Tensor, x: Tensor, upstream: Tensor) -> Tensor:
    (gradient,) = torch.autograd.grad(output, x, upstream, retain_graph=True)
    return gradient


def _inputs(seed: int, *shape: int) -> tuple[Tensor, Tensor]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=generator, dtype=torch.float64).requires_grad_(True)
    return x, torch.randn(*shape, generator=generator, dtype=torch.float64)


@pytest.mark.parametrize("factor", [0.25, 0.5])
def test_uniform_rule_keeps_the_value_and_scales_the_gradient(factor: float) -> None:
    x, upstream = _inputs(0, 3, 5)
    y = rules.uniform_rule(x, factor)
    assert torch.equal(y, x)
    assert torch.equal(_gradient(y, x, upstream), upstream * factor)


@pytest.mark.parametrize("activation", [nn.GELU(), nn.SiLU(), nn.Tanh(), transformers.activations.NewGELUActivation()])
def test_identity_rule_passes_the_output_relevance_to_the_input(activation: nn.Module) -> None:
    x, upstream = _inputs(1, 4, 6)
    y = activation(x)
    ruled = rules.identity_rule(x, y)
    assert torch.equal(ruled, y)
    relevance_in = x * _gradient(ruled, x, upstream)
    assert torch.allclose(relevance_in, y.detach() * upstream, rtol=1e-8, atol=1e-12)


def test_layer_norm_rule_is_the_gradient_with_the_deviation_held_constant() -> None:
    x, upstream = _inputs(2, 3, 8)
    norm = nn.LayerNorm(8, eps=1e-5).double()
    with torch.no_grad():
        norm.weight.normal_()
        norm.bias.normal_()
    y = norm(x)
    ruled = rules.layer_norm_rule(x, y, norm.weight, norm.eps)
    assert torch.equal(ruled, y)
    std = (x.var(-1, keepdim=True, unbiased=False) + norm.eps).sqrt().detach()
    surrogate = (x - x.mean(-1, keepdim=True)) / std * norm.weight + norm.bias
    assert torch.allclose(_gradient(ruled, x, upstream), _gradient(surrogate, x, upstream), atol=1e-12)
    # conserving up to the bias's share: Σ x ⊙ ∂ = Σ (y − b) ⊙ g
    relevance_in = (x * _gradient(ruled, x, upstream)).sum(-1)
    assert torch.allclose(relevance_in, ((y - norm.bias) * upstream).sum(-1).detach(), atol=1e-12)


def test_ratio_rule_on_an_rms_norm_is_the_gradient_with_the_statistic_held_constant() -> None:
    x, upstream = _inputs(3, 3, 8)
    norm = nn.RMSNorm(8, eps=1e-6).double()
    with torch.no_grad():
        norm.weight.normal_()
    ruled = rules.ratio_rule(x, norm(x))
    scale = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6).detach()
    assert torch.allclose(_gradient(ruled, x, upstream), upstream * norm.weight.detach() * scale, rtol=1e-8)


def test_softmax_rule_is_the_plain_gradient_times_input() -> None:
    """R_in = x ⊙ (R_out − s Σ R_out) with R_out = s ⊙ g equals x ⊙ ∂softmax/∂x·g (the docstring's derivation)."""
    x, upstream = _inputs(4, 2, 3, 7)
    s = x.softmax(-1)
    relevance_out = s.detach() * upstream
    expected = x.detach() * _gradient(s, x, upstream)
    assert torch.allclose(rules.softmax_relevance(x.detach(), s.detach(), relevance_out), expected, atol=1e-12)
    absorbed = rules.softmax_absorption(x.detach(), s.detach(), relevance_out)
    assert torch.allclose(absorbed, relevance_out.sum(-1) - expected.sum(-1), atol=1e-12)
    assert absorbed.abs().min() > 1e-3  # the rule does not conserve


# ---- an explicit rule-by-rule propagation through one BERT block -------------------------------------------


def _one_block_bert() -> Any:
    config = BertConfig(
        vocab_size=40, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16,
        max_position_embeddings=16, hidden_act="gelu",
    )  # fmt: skip
    return _eager(perturb(BertForSequenceClassification(_labelled(config)), 7, unit_embeddings="embeddings")).double()


def _linear_rule(x: Tensor, linear: nn.Linear, relevance_out: Tensor) -> Tensor:
    """LRP-ε (ε → 0) written out: R_i = Σ_j x_i W_ji R_j / z_j, with z = Wx + b."""
    weight = linear.weight.detach()
    z = x @ weight.T + (0 if linear.bias is None else linear.bias.detach())
    return torch.einsum("ni,ji,nj->ni", x, weight, relevance_out / z)


def _layer_norm_rule(u: Tensor, norm: nn.LayerNorm, relevance_out: Tensor) -> Tensor:
    """LayerNorm as the affine map y = M_n u + b per token, M_n = diag(w/σ_n)(I − 11ᵀ/N), then LRP-ε on it."""
    size = u.shape[-1]
    centring = torch.eye(size, dtype=u.dtype) - 1.0 / size
    sigma = (u.var(-1, unbiased=False) + norm.eps).sqrt()
    relevance_in = torch.zeros_like(u)
    for n in range(u.shape[0]):
        matrix = torch.diag(norm.weight.detach() / sigma[n]) @ centring
        y = matrix @ u[n] + norm.bias.detach()
        relevance_in[n] = torch.einsum("i,ji,j->i", u[n], matrix, relevance_out[n] / y)
    return relevance_in


def _layer_norm(u: Tensor, norm: nn.LayerNorm) -> Tensor:
    centred = u - u.mean(-1, keepdim=True)
    return centred / (u.var(-1, unbiased=False, keepdim=True) + norm.eps).sqrt() * norm.weight + norm.bias


def _explicit_relevance(model: Any, ids: Tensor, target: int, variant: str) -> tuple[Tensor, Tensor]:
    """The relevance of each word embedding of one unpadded example, propagated rule by rule with explicit
    formulas (no autograd): LRP-ε for linear layers and residual sums, identity rule for GELU and the pooler's tanh
    and for LayerNorm's σ, the uniform rule for both attention matmuls, the softmax rule (AttnLRP) or constant
    attention weights (CP-LRP). Returns the relevances ``(n,)`` and the logits."""
    bert = model.bert
    layer = bert.encoder.layer[0]
    attention = layer.attention.self
    heads, size = attention.num_attention_heads, attention.attention_head_size
    n = ids.shape[0]
    with torch.no_grad():
        word = bert.embeddings.word_embeddings.weight[ids]
        position = bert.embeddings.position_embeddings.weight[:n]
        token_type = bert.embeddings.token_type_embeddings.weight[torch.zeros_like(ids)]
        summed = word + token_type + position
        h = _layer_norm(summed, bert.embeddings.LayerNorm)

        def split(t: Tensor) -> Tensor:
            return t.view(n, heads, size).transpose(0, 1)  # (heads, n, size)

        q, k, v = (split(linear(h)) for linear in (attention.query, attention.key, attention.value))
        scores = q @ k.transpose(-1, -2)  # (heads, n, n)
        scaled = scores / math.sqrt(size)
        probabilities = scaled.softmax(-1)
        context = probabilities @ v  # (heads, n, size)
        merged = context.transpose(0, 1).reshape(n, heads * size)
        attention_out = layer.attention.output.dense(merged)
        u1 = h + attention_out
        a = _layer_norm(u1, layer.attention.output.LayerNorm)
        pre = layer.intermediate.dense(a)
        act = torch.nn.functional.gelu(pre)
        f = layer.output.dense(act)
        u2 = a + f
        out = _layer_norm(u2, layer.output.LayerNorm)
        pooled_pre = bert.pooler.dense(out[:1])
        pooled = torch.tanh(pooled_pre)
        logits = model.classifier(pooled)[0]

        # backward, rule by rule
        relevance = torch.zeros_like(logits)
        relevance[target] = logits[target]
        r_pooled = _linear_rule(pooled, model.classifier, relevance[None])
        r_out = torch.zeros_like(out)
        r_out[:1] = _linear_rule(out[:1], bert.pooler.dense, r_pooled)  # tanh: identity rule
        r_u2 = _layer_norm_rule(u2, layer.output.LayerNorm, r_out)
        r_a, r_f = a * r_u2 / u2, f * r_u2 / u2  # residual sum: LRP-ε
        r_act = _linear_rule(act, layer.output.dense, r_f)
        r_a = r_a + _linear_rule(a, layer.intermediate.dense, r_act)  # GELU: identity rule
        r_u1 = _layer_norm_rule(u1, layer.attention.output.LayerNorm, r_a)
        r_h, r_attention_out = h * r_u1 / u1, attention_out * r_u1 / u1
        r_context = split(_linear_rule(merged, layer.attention.output.dense, r_attention_out))
        # A·V: contribution of (i, j, d) = A_ij V_jd / ctx_id · R_ctx_id
        shares = torch.einsum("hij,hjd,hid->hijd", probabilities, v, r_context / context)
        if variant == "attnlrp":
            r_v = 0.5 * shares.sum(dim=1)  # uniform rule: half to V …
            r_probabilities = 0.5 * shares.sum(dim=3)  # … half to A
            total = r_probabilities.sum(-1, keepdim=True)
            r_scaled = scaled * (r_probabilities - probabilities * total)  # softmax rule
            r_scores = r_scaled  # the scaling by 1/√d is linear without bias
            products = torch.einsum("hid,hjd,hij->hijd", q, k, r_scores / scores)
            r_q, r_k = 0.5 * products.sum(dim=2), 0.5 * products.sum(dim=1)  # uniform rule on Q·Kᵀ
        else:
            r_v = shares.sum(dim=1)  # CP-LRP: A is a constant, V gets everything
            r_q = r_k = torch.zeros_like(q)

        def merge(t: Tensor) -> Tensor:
            return t.transpose(0, 1).reshape(n, heads * size)

        for linear, r_part in ((attention.query, r_q), (attention.key, r_k), (attention.value, r_v)):
            r_h = r_h + _linear_rule(h, linear, merge(r_part))
        r_summed = _layer_norm_rule(summed, bert.embeddings.LayerNorm, r_h)
        r_word = word * r_summed / summed
    return r_word.sum(-1), logits


@pytest.mark.parametrize("method", ["attnlrp", "cp_lrp"])
def test_matches_an_explicit_rule_by_rule_propagation_through_one_block(method: str) -> None:
    model = _one_block_bert()
    generator = torch.Generator().manual_seed(11)
    ids = torch.randint(3, 40, (6,), generator=generator)
    ids[0] = 2
    for target in range(3):
        expected, logits = _explicit_relevance(model, ids, target, method)
        result = explain(model, {"input_ids": ids[None]}, method=method, target=target)
        assert torch.allclose(result.logits[0], logits, atol=1e-12)
        scale = float(expected.abs().max())
        assert torch.allclose(result.scores[0], expected, atol=1e-8 * scale, rtol=0), (result.scores[0], expected)


# ---- conservation and absorption ---------------------------------------------------------------------------


def _zero_biases(model: Any) -> Any:
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("bias"):
                parameter.zero_()
    return model


def _relevances(
    model: Any, inputs: dict[str, Tensor], targets: Tensor, variant: str, at: dict[str, nn.Module]
) -> tuple[dict[str, Tensor], list[tuple[Tensor, Tensor]], Tensor]:
    """One pass with ``variant``'s rules attached: relevance (tensor × modified gradient, summed over hidden) at the
    outputs of the modules ``at``, and per attention call its probabilities and their modified gradients."""
    arch = describe(model)
    outputs: dict[str, Tensor] = {}
    batch = targets.shape[0]

    def keep(name: str) -> Callable[[nn.Module, Any, Tensor], Tensor]:
        def hook(module: nn.Module, args: Any, output: Tensor) -> Tensor:
            if output.shape[0] != batch:  # position embeddings come as (1, n, hidden): give each row its own copy
                output = output.expand(batch, *output.shape[1:]).clone()
            outputs[name] = output if output.requires_grad else output.detach().requires_grad_(True)
            return outputs[name]

        return hook

    with prepared_model(model) as hooks, torch.enable_grad():
        for name, module in at.items():
            hooks.callback(module.register_forward_hook(keep(name)).remove)
        observer = attach_rules(model, arch, hooks, variant=variant)  # type: ignore[arg-type]
        recorded = hooks.enter_context(capturing_attention(model, keep="heads", observer=observer))
        logits = model(**inputs).logits
        selected = logits.gather(1, targets[:, None]).sum()
        probabilities = [p for p in recorded.probabilities if p.requires_grad]  # CP-LRP: constants
        gradients = torch.autograd.grad(selected, [*outputs.values(), *probabilities])
    relevance = {
        name: (tensor * gradient).sum(-1).detach()
        for (name, tensor), gradient in zip(outputs.items(), gradients, strict=False)
    }
    attention = [(p.detach(), g) for p, g in zip(probabilities, gradients[len(outputs) :], strict=True)]
    return relevance, attention, logits.detach().gather(1, targets[:, None])[:, 0]


def _bert_embeddings(model: Any) -> dict[str, nn.Module]:
    embeddings = model.bert.embeddings
    return {
        "word": embeddings.word_embeddings,
        "position": embeddings.position_embeddings,
        "token_type": embeddings.token_type_embeddings,
    }


def test_cp_lrp_conserves_on_bert_with_zero_biases() -> None:
    """Word + position + token-type relevances sum to the target logit; the served scores are the word share."""
    model = _zero_biases(build_bert().double())
    batch = text_batch(model)
    served = explain(model, batch, method="cp_lrp")
    relevance, _, target_logits = _relevances(model, batch, served.target, "cp_lrp", _bert_embeddings(model))
    mask = batch["attention_mask"].double()
    total = torch.stack([(r * mask).sum(-1) for r in relevance.values()]).sum(0)
    assert torch.allclose(total, target_logits, atol=1e-6, rtol=0), (total, target_logits)
    assert torch.allclose(served.scores, relevance["word"] * mask, atol=1e-12)
    assert (relevance["position"] * mask).abs().sum() > 1e-3  # the position embeddings do take a share


def test_cp_lrp_conserves_on_vit_with_zero_biases() -> None:
    """For ViT the embedding module's output (patches + class token + position embeddings) carries the logit."""
    model = _zero_biases(build_vit().double())
    batch = image_batch(model)
    served = explain(model, batch, method="cp_lrp")
    at = {"embeddings": model.vit.embeddings, "patches": model.vit.embeddings.patch_embeddings}
    relevance, _, target_logits = _relevances(model, batch, served.target, "cp_lrp", at)
    assert torch.allclose(relevance["embeddings"].sum(-1), target_logits, atol=1e-6, rtol=0)
    assert torch.allclose(served.scores.flatten(1), relevance["patches"], atol=1e-12)


def test_attnlrp_absorbs_what_the_softmax_rule_says() -> None:
    """With biases zero AttnLRP's only leak is the softmax rule: logit − Σ relevance of all embeddings equals the
    sum over every attention row of Σ R_out − Σ x ⊙ (R_out − s Σ R_out), where R_out = ½ s ⊙ ∂/∂s is the attention
    weights' half of the uniform rule at A·V (the factor ½ is applied on the query and key, upstream of the
    softmax, so the gradient read at s is not yet halved).

    The softmax input x is recovered as log s (the rule is invariant to a shift of x per row), masked keys
    (s = 0) carry no relevance. The absorbed amount is stated, not assumed small.
    """
    model = _zero_biases(build_bert().double())
    batch = text_batch(model)
    served = explain(model, batch, method="attnlrp")
    relevance, attention, target_logits = _relevances(model, batch, served.target, "attnlrp", _bert_embeddings(model))
    mask = batch["attention_mask"].double()
    total = torch.stack([(r * mask).sum(-1) for r in relevance.values()]).sum(0)
    absorbed = torch.zeros_like(total)
    for probabilities, gradient in attention:
        real = probabilities > 0
        x = torch.where(real, probabilities.clamp(min=1e-300).log(), torch.zeros_like(probabilities))
        per_row = rules.softmax_absorption(x, probabilities, 0.5 * probabilities * gradient)  # (batch, heads, n)
        absorbed += (per_row * mask[:, None, :]).sum(dim=(1, 2))  # query rows of padding carry no relevance
    assert torch.allclose(total + absorbed, target_logits, atol=1e-6, rtol=0), (total, absorbed, target_logits)
    assert absorbed.abs().min() > 1e-3  # AttnLRP does not conserve: the softmax absorbs this much
    assert torch.allclose(served.scores, relevance["word"] * mask, atol=1e-12)


# ---- the serving path: mixed batches, state hygiene --------------------------------------------------------


def test_mixed_batch_gives_each_row_what_it_gives_alone() -> None:
    model = build_bert().double()
    batch = text_batch(model, lengths=(7, 3, 9, 5, 6, 4, 8))
    rows = [
        RowRequest("attnlrp"),
        RowRequest("gae", target=2),
        RowRequest("grad_x_input"),
        RowRequest("integrated_gradients", options={"n_steps": 4}),
        RowRequest("cp_lrp", target=0),
        RowRequest("attnlrp", target=1),
        RowRequest(None),
    ]
    result = explain_batch(model, batch, rows)
    with torch.no_grad():
        assert torch.allclose(result.logits, model(**batch).logits, atol=1e-10)
    for index, request in enumerate(rows):
        got = result.rows[index]
        if request.method is None:
            assert got is None
            continue
        assert isinstance(got, RowExplanation)
        alone = explain(
            model, row_inputs(batch, index), method=request.method, target=request.target, **request.options
        )
        assert got.target == int(alone.target[0])
        assert torch.allclose(got.scores, alone.scores[0], atol=1e-10, rtol=0), (request.method, got.scores)


@pytest.mark.parametrize("methods", [("attnlrp", "attention"), ("attnlrp", "cp_lrp"), ("attnlrp",) * 2])
def test_batches_without_true_gradient_rows(methods: tuple[str, ...]) -> None:
    """With no true-gradient row the shared pass carries one kind's rules; the attention values are unchanged."""
    model = build_bert().double()
    batch = text_batch(model, lengths=(7, 4))
    result = explain_batch(model, batch, [RowRequest(method) for method in methods])
    for index, method in enumerate(methods):
        got = result.rows[index]
        assert isinstance(got, RowExplanation)
        alone = explain(model, row_inputs(batch, index), method=method)
        assert torch.allclose(got.scores, alone.scores[0], atol=1e-10, rtol=0), method


def _process_wide_state() -> dict[str, Any]:
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    from transformers.models.bert import modeling_bert

    return {
        "classes": {cls: dict(vars(cls)) for cls in (nn.LayerNorm, nn.Linear, nn.GELU, nn.Tanh, nn.Dropout)},
        "activations": {
            name: dict(vars(cls))
            for name, cls in vars(transformers.activations).items()
            if isinstance(cls, type) and issubclass(cls, nn.Module)
        },
        "bert_module": dict(vars(modeling_bert)),
        "attention_functions": dict(ALL_ATTENTION_FUNCTIONS._global_mapping),
        "functional": dict(vars(torch.nn.functional)),
        "global_hooks": (
            dict(torch.nn.modules.module._global_forward_hooks),
            dict(torch.nn.modules.module._global_forward_pre_hooks),
        ),
    }


@pytest.mark.parametrize("method", ["attnlrp", "cp_lrp"])
def test_nothing_process_wide_changes_not_even_during_the_call(method: str) -> None:
    model = build_bert().double()
    before = _process_wide_state()
    during: list[dict[str, Any]] = []
    handle = model.classifier.register_forward_hook(lambda *args: during.append(_process_wide_state()))
    try:
        explain(model, text_batch(model), method=method)
    finally:
        handle.remove()
    assert len(during) == 1 and during[0] == before
    assert _process_wide_state() == before


@pytest.mark.parametrize("method", ["attnlrp", "cp_lrp"])
def test_model_left_unchanged_when_the_call_raises(method: str) -> None:
    model = _unusual_state(build_bert())
    batch = text_batch(model)

    def boom(module: nn.Module, args: Any, output: Any) -> None:
        raise RuntimeError("boom")

    handle = model.classifier.register_forward_hook(boom)
    before = _snapshot(model)
    with pytest.raises(RuntimeError, match="boom"):
        explain(model, batch, method=method)
    _assert_same(before, _snapshot(model))
    handle.remove()


def test_the_rules_do_not_leak_into_a_later_true_gradient() -> None:
    model = build_bert().double()
    batch = text_batch(model)
    first = explain(model, batch, method="grad_x_input")
    explain(model, batch, method="attnlrp")
    assert torch.equal(explain(model, batch, method="grad_x_input").scores, first.scores)
    assert not torch.allclose(explain(model, batch, method="attnlrp").scores, first.scores, atol=1e-3)


# ---- every architecture family -----------------------------------------------------------------------------

_COMMON: dict[str, Any] = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64}
_DECODER: dict[str, Any] = {"vocab_size": 60, "num_key_value_heads": 2, "pad_token_id": 0, **_COMMON}


def _families() -> dict[str, Callable[[], Any]]:
    t = transformers

    def text(config: Any, cls: type) -> Callable[[], Any]:
        return lambda: cls(_labelled(config))

    return {
        "xlm-roberta": text(
            t.XLMRobertaConfig(vocab_size=60, max_position_embeddings=72, pad_token_id=1, **_COMMON),
            t.XLMRobertaForSequenceClassification,
        ),
        "electra": text(
            t.ElectraConfig(vocab_size=60, embedding_size=16, max_position_embeddings=64, **_COMMON),
            t.ElectraForSequenceClassification,
        ),
        "albert": text(
            t.AlbertConfig(vocab_size=60, embedding_size=16, max_position_embeddings=64, **_COMMON),
            t.AlbertForSequenceClassification,
        ),
        "modernbert": text(
            t.ModernBertConfig(vocab_size=60, max_position_embeddings=64, pad_token_id=0, **_COMMON),
            t.ModernBertForSequenceClassification,
        ),
        "deberta-v2": text(
            t.DebertaV2Config(
                vocab_size=60,
                max_position_embeddings=64,
                relative_attention=True,
                pos_att_type=["p2c", "c2p"],
                **_COMMON,
            ),
            t.DebertaV2ForSequenceClassification,
        ),
        "llama": text(t.LlamaConfig(**_DECODER), t.LlamaForSequenceClassification),
        "qwen2": text(t.Qwen2Config(**_DECODER), t.Qwen2ForSequenceClassification),
        "qwen3": text(t.Qwen3Config(head_dim=8, **_DECODER), t.Qwen3ForSequenceClassification),
        "mistral": text(t.MistralConfig(**_DECODER), t.MistralForSequenceClassification),
        "gemma2": text(t.Gemma2Config(head_dim=8, **_DECODER), t.Gemma2ForSequenceClassification),
        "gpt2": text(
            t.GPT2Config(vocab_size=60, n_embd=32, n_layer=2, n_head=4, n_positions=64, pad_token_id=0),
            t.GPT2ForSequenceClassification,
        ),
        "deit": text(t.DeiTConfig(image_size=16, patch_size=4, **_COMMON), t.DeiTForImageClassification),
        "dinov2": text(t.Dinov2Config(image_size=16, patch_size=4, **_COMMON), t.Dinov2ForImageClassification),
    }


FAMILIES = _families()
DECODERS = ("llama", "qwen2", "qwen3", "mistral", "gemma2")  # rotary: the word embedding is the only input embedding


def _family_model(name: str) -> Any:
    return _eager(perturb(FAMILIES[name](), 5, unit_embeddings="embeddings")).double()


def _family_batch(model: Any, lengths: tuple[int, ...] = (7, 3, 6)) -> dict[str, Tensor]:
    if model.config.model_type in ("deit", "dinov2"):
        return image_batch(model, size=2)
    generator = torch.Generator().manual_seed(3)
    ids = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, length in enumerate(lengths):
        ids[row, :length] = torch.randint(3, 60, (length,), generator=generator)
        mask[row, :length] = 1
    return {"input_ids": ids, "attention_mask": mask}


@pytest.mark.parametrize("method", ["attnlrp", "cp_lrp"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_batched_equals_alone_padding_zero_model_unchanged(family: str, method: str) -> None:
    model = _family_model(family)
    batch = _family_batch(model)
    before = _snapshot(model)
    result = explain(model, batch, method=method)
    _assert_same(before, _snapshot(model))
    with torch.no_grad():
        assert torch.allclose(result.logits, model(**batch).logits, atol=1e-10)
    assert torch.isfinite(result.scores).all() and result.scores.abs().sum() > 0
    if "attention_mask" in batch:
        assert (result.scores[batch["attention_mask"] == 0] == 0).all()
    for row in range(result.target.shape[0]):
        alone = explain(model, row_inputs(batch, row), method=method)
        expected = alone.scores[0]
        got = result.scores[row][: expected.shape[0]] if "attention_mask" in batch else result.scores[row]
        scale = float(expected.abs().max())
        assert torch.allclose(got, expected, atol=1e-9 * scale, rtol=0), (family, row)


@pytest.mark.parametrize("family", DECODERS)
def test_cp_lrp_conserves_on_decoders_with_zero_biases(family: str) -> None:
    """Rotary decoders: the word embeddings are all that enters the first layer, so they carry the whole logit."""
    model = _zero_biases(_family_model(family))
    batch = _family_batch(model)
    result = explain(model, batch, method="cp_lrp")
    target_logits = result.logits.gather(1, result.target[:, None])[:, 0]
    # transformers computes RMSNorm and rotary embeddings in float32 even in a float64 model; measured ~1e-9 here
    assert torch.allclose(result.scores.sum(-1), target_logits, atol=1e-5, rtol=0), (
        result.scores.sum(-1),
        target_logits,
    )
