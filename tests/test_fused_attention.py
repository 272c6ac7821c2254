"""The fused capture: the observer around the model's own ``sdpa`` attention gives the eager path's gradients.

Every family loaded with ``sdpa`` (tiny float64 models of ``tests/arch_zoo.py``): the input-embedding gradient of
a logit, plain and under the AttnLRP and CP-LRP rules, through :func:`capturing_attention` with ``fused="sdpa"``
equals the same gradient through the eager capture. Tolerances, relative to the largest score: 1e-10 where the
architecture's eager attention computes in the model's dtype; where it runs its softmax in float32 by design
(Llama, Qwen, Mistral, ModernBERT, ViT, DeiT), the eager path is itself only float32-accurate, so the comparison
is at 1e-5 and, at 1e-10, against an exact float64 eager reference registered under a test-only name.
"""

from __future__ import annotations

import functools
from contextlib import ExitStack
from typing import Any

import pytest
import torch
from torch import Tensor, nn
from transformers import AttentionInterface, Gemma2Config, Gemma2ForSequenceClassification
from transformers.masking_utils import AttentionMaskInterface, eager_mask

from explainers import capturing_attention, describe
from explainers.attention_capture import FUSED_CAPTURE_IMPLEMENTATION, fused_implementation
from explainers.attnlrp import attach_rules

from .arch_zoo import VARIANTS, Variant, batch_for, perturb

BY_NAME = {variant.name: variant for variant in VARIANTS}
#: Families whose eager attention runs its softmax in float32 whatever the model's dtype.
FLOAT32_SOFTMAX = frozenset({"modernbert", "llama", "qwen2", "qwen3", "mistral", "gemma2", "vit", "deit"})
EXACT_EAGER = "tests_exact_float64_eager"


def _exact_eager(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[Tensor, Tensor]:
    """Scaled dot-product attention written out in the inputs' dtype: the reference for float64 models."""
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    scores = query @ key.transpose(-1, -2) * scale
    if attention_mask is not None:
        scores = scores + attention_mask[..., : key.shape[-2]]
    weights = scores.softmax(dim=-1)
    return (weights @ value).transpose(1, 2).contiguous(), weights


if EXACT_EAGER not in AttentionInterface._global_mapping:
    AttentionInterface.register(EXACT_EAGER, _exact_eager)
    AttentionMaskInterface.register(EXACT_EAGER, eager_mask)


@functools.cache
def _model(name: str) -> Any:
    model = BY_NAME[name].build()
    model.config._attn_implementation_internal = "sdpa"
    return model


def _score_gradient(model: nn.Module, batch: dict[str, Tensor], rules: str | None, fused: str | None) -> Tensor:
    """Σ_hidden embedding × gradient of logit 0 (per token), under ``rules`` (None, attnlrp, cp_lrp)."""
    arch = describe(model)
    kept: list[Tensor] = []

    def leaf(module: nn.Module, args: Any, output: Tensor) -> Tensor:
        kept.append(output.detach().requires_grad_(True))
        return kept[0]

    inputs = dict(batch)
    if arch.pooled == "last":
        inputs["position_ids"] = (batch["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    with ExitStack() as hooks:
        hooks.callback(arch.input_embeddings.register_forward_hook(leaf).remove)
        observer = None if rules is None else attach_rules(model, arch, hooks, variant=rules)  # type: ignore[arg-type]
        with capturing_attention(model, keep="none", observer=observer, fused=fused):
            logits = model(**inputs).logits
    (gradient,) = torch.autograd.grad(logits[:, 0].sum(), kept)
    return (gradient * kept[0]).sum(dim=-1).detach()


FUSED = [variant for variant in VARIANTS if variant.model_type not in ("deberta-v2", "gemma2")]
CASES = [(variant, rules) for variant in FUSED for rules in (None, "attnlrp", "cp_lrp")]


@pytest.mark.parametrize("variant, rules", CASES, ids=[f"{v.name}-{r or 'gradient'}" for v, r in CASES])
def test_fused_capture_equals_the_eager_capture(variant: Variant, rules: str | None) -> None:
    model = _model(variant.name)
    assert fused_implementation(model) == "sdpa"
    side = "left" if variant.is_decoder else "right"
    batch = batch_for(variant, model, side)
    registered = dict(AttentionInterface._global_mapping)
    fused = _score_gradient(model, batch, rules, "sdpa")
    assert dict(AttentionInterface._global_mapping) == registered
    assert model.config._attn_implementation == "sdpa"
    eager = _score_gradient(model, batch, rules, None)
    scale = float(eager.abs().max())
    exact = variant.model_type not in FLOAT32_SOFTMAX
    assert torch.allclose(fused, eager, atol=(1e-10 if exact else 1e-5) * scale, rtol=0)
    if not exact:
        model.config._attn_implementation_internal = EXACT_EAGER
        try:
            reference = _score_gradient(model, batch, rules, EXACT_EAGER)
        finally:
            model.config._attn_implementation_internal = "sdpa"
        assert torch.allclose(fused, reference, atol=1e-10 * scale, rtol=0)


def test_models_without_a_fused_path_are_named() -> None:
    deberta = BY_NAME["deberta-v2"].build()
    deberta.config._attn_implementation_internal = "sdpa"
    assert fused_implementation(deberta) is None  # DeBERTa's attention does not go through the interface
    assert fused_implementation(BY_NAME["bert"].build()) is None  # loaded with eager: eager stays eager
    capped = Gemma2ForSequenceClassification(
        Gemma2Config(vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
                     num_key_value_heads=2, head_dim=8, pad_token_id=1, attn_logit_softcapping=50.0)
    )  # fmt: skip
    capped.config._attn_implementation_internal = "sdpa"
    assert fused_implementation(capped) is None  # sdpa cannot soft-cap attention logits


def test_gemma2_without_soft_capping_runs_fused() -> None:
    config = Gemma2Config(
        vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
        num_key_value_heads=2, head_dim=8, pad_token_id=1, attn_logit_softcapping=None,
        sliding_window=4, query_pre_attn_scalar=8,
    )  # fmt: skip
    config.num_labels = 3
    model = perturb(Gemma2ForSequenceClassification(config), 3).double().eval()
    model.config._attn_implementation_internal = "sdpa"
    assert fused_implementation(model) == "sdpa"
    batch = batch_for(BY_NAME["gemma2"], model, "left")
    fused = _score_gradient(model, batch, "attnlrp", "sdpa")
    eager = _score_gradient(model, batch, "attnlrp", None)
    assert torch.allclose(fused, eager, atol=1e-5 * float(eager.abs().max()), rtol=0)


def test_fused_capture_refuses_what_it_cannot_do() -> None:
    model = _model("bert")
    with pytest.raises(ValueError, match="keeps no probabilities"), capturing_attention(model, fused="sdpa"):
        pass
    for name in ("eager", "no_such_kernel", FUSED_CAPTURE_IMPLEMENTATION):
        with (
            pytest.raises(ValueError, match="not a fused attention"),
            capturing_attention(model, keep="none", fused=name),
        ):
            pass
    assert model.config._attn_implementation == "sdpa"


def test_the_fused_capture_records_every_call_and_restores_the_model() -> None:
    model = _model("albert")  # one shared attention module called once per layer
    batch = batch_for(BY_NAME["albert"], model)
    with torch.no_grad(), capturing_attention(model, keep="none", fused="sdpa") as capture:
        assert model.config._attn_implementation == FUSED_CAPTURE_IMPLEMENTATION
        logits = model(**batch).logits
    assert [call.repeat for call in capture.calls] == [0, 1] and capture.probabilities == []
    assert model.config._attn_implementation == "sdpa"
    with torch.no_grad():
        assert torch.allclose(logits, model(**batch).logits, atol=1e-12, rtol=0)
