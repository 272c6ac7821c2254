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
from transformers import (
    AttentionInterface,
    BertConfig,
    BertForSequenceClassification,
    Gemma2Config,
    Gemma2ForSequenceClassification,
)
from transformers.masking_utils import AttentionMaskInterface, eager_mask

from explainers import (
    InvalidOptionError,
    RowExplanation,
    RowRequest,
    capturing_attention,
    describe,
    explain,
    explain_batch,
)
from explainers.architectures.attention import FUSED_CAPTURE_IMPLEMENTATION, fused_implementation
from explainers.architectures.rule_hooks import attach_rules
from explainers.architectures.support import refusal
from explainers.memory import MemoryBudgetError, ModelSize, estimate_bytes

from .arch_zoo import VARIANTS, Variant, batch_for, image_batch, perturb, row_alone, text_batch

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


# ---- through explain / explain_batch: models loaded with sdpa -----------------------------------------------------

FAST_METHODS = ("grad_x_input", "integrated_gradients", "attnlrp", "cp_lrp")
OPTIONS: dict[str, dict[str, int]] = {"integrated_gradients": {"n_steps": 4}}
EXPLAIN_CASES = [(variant, method) for variant in VARIANTS for method in FAST_METHODS]


@functools.cache
def _loaded(name: str, implementation: str) -> Any:
    """The same weights as ``BY_NAME[name].build()``, loaded with ``implementation``."""
    model = BY_NAME[name].build()
    model.config._attn_implementation_internal = implementation
    return model


def _saved_square_maps(run: Any, length: int) -> list[tuple[int, ...]]:
    """Shapes of the per-head ``(batch, heads, n, n)`` maps autograd saved for the backward during ``run()`` (the
    boolean padding mask sdpa keeps, ``(batch, 1, n, n)``, is not one of them)."""
    shapes: list[tuple[int, ...]] = []

    def pack(tensor: Tensor) -> Tensor:
        if tensor.dim() == 4 and tensor.shape[1] > 1 and tuple(tensor.shape[-2:]) == (length, length):
            shapes.append(tuple(tensor.shape))
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        run()
    return shapes


@pytest.mark.parametrize("variant, method", EXPLAIN_CASES, ids=[f"{v.name}-{m}" for v, m in EXPLAIN_CASES])
def test_gradient_methods_on_sdpa_equal_the_eager_path(variant: Variant, method: str) -> None:
    """A model loaded with sdpa is explained on its own attention, equal to the same model loaded with eager; no
    attention map is saved for the backward (except on DeBERTa, whose attention has no fused form)."""
    eager, sdpa = _loaded(variant.name, "eager"), _loaded(variant.name, "sdpa")
    side = "left" if variant.is_decoder else "right"
    batch = batch_for(variant, sdpa, side)
    options = OPTIONS.get(method, {})
    expected = explain(eager, batch, method=method, **options)
    found: list[Any] = []
    length = int(next(iter(batch.values())).shape[-1]) if variant.is_text else 0
    maps = _saved_square_maps(lambda: found.append(explain(sdpa, batch, method=method, **options)), length)
    got = found[0]
    assert sdpa.config._attn_implementation == "sdpa" and not any(module.training for module in sdpa.modules())
    fused = fused_implementation(sdpa) is not None
    if fused:
        assert maps == []  # DeBERTa and the soft-capped Gemma 2 run eager attention and may keep them
    elif method == "grad_x_input" and variant.is_text:
        assert maps  # the eager path keeps the probabilities for its backward
    scale = float(expected.scores.abs().max())
    exact = variant.model_type not in FLOAT32_SOFTMAX or not fused
    assert torch.equal(got.target, expected.target)
    assert torch.allclose(got.scores, expected.scores, atol=(1e-10 if exact else 1e-5) * scale, rtol=0)
    if not exact:  # against the eager formula computed in float64 throughout
        reference = explain(_loaded(variant.name, EXACT_EAGER), batch, method=method, **options)
        assert torch.allclose(got.scores, reference.scores, atol=1e-10 * scale, rtol=0)


MIXED = [
    RowRequest("gae"),
    RowRequest(None),
    RowRequest("attnlrp"),
    RowRequest("rollout", options={"start_layer": 1}),
    RowRequest("grad_x_input", 1),
    RowRequest("cp_lrp"),
    RowRequest("integrated_gradients", options={"n_steps": 3}),
    RowRequest("attention"),
]


@pytest.mark.parametrize("name", ["bert", "llama", "modernbert", "gpt2", "vit", "deberta-v2"])
def test_a_batch_mixing_map_and_fused_methods_gives_each_row_its_own_answer(name: str) -> None:
    """Map rows on eager attention and gradient rows on sdpa in one batch: each row equals its method explained
    alone, and the gradient rows equal the eager-loaded model's at the family's tolerance."""
    variant = BY_NAME[name]
    sdpa, eager = _loaded(name, "sdpa"), _loaded(name, "eager")
    if variant.is_text:
        batch = text_batch(sdpa, lengths=(7, 3, 9, 5, 6, 4, 8, 2), side="left" if variant.is_decoder else "right")
    else:
        batch = image_batch(sdpa, size=len(MIXED))
    requests = [request for request in MIXED if request.method != "gae" or refusal(variant.model_type, "gae") is None]
    result = explain_batch(sdpa, batch, requests)
    with torch.no_grad():
        plain = explain(sdpa, batch, method="attention").logits
    assert torch.allclose(result.logits, plain, atol=1e-10, rtol=0)
    assert result.rows[1] is None and result.seconds["backward"] > 0  # the gradient rows' own passes
    tolerance = 1e-5 if variant.model_type in FLOAT32_SOFTMAX else 1e-9
    for index, request in enumerate(requests):
        row = result.rows[index]
        if request.method is None:
            continue
        assert isinstance(row, RowExplanation), (request, row)
        alone = row_alone(batch, index)
        for model in (sdpa, eager):
            expected = explain(model, alone, method=request.method, target=request.target, **request.options).scores[0]
            scale = float(expected.abs().max())
            assert torch.allclose(row.scores, expected, atol=tolerance * scale, rtol=0), (request, model.config)


def test_a_uniform_gradient_batch_is_one_pass_and_a_mixed_one_spares_the_prediction_rows() -> None:
    """A batch of attnlrp rows is one grad-enabled forward; with a prediction-only row the shared forward saves
    nothing for a backward and only the explained rows get one."""
    model = _loaded("bert", "sdpa")
    batch = text_batch(model)
    counted: list[int] = []
    handle = model.get_input_embeddings().register_forward_hook(lambda m, a, out: counted.append(out.shape[0]))
    try:
        explain_batch(model, batch, [RowRequest("attnlrp")] * 4)
        assert counted == [4]
        counted.clear()
        explain_batch(model, batch, [RowRequest("attnlrp"), RowRequest(None), RowRequest(None), RowRequest("attnlrp")])
        assert counted == [4, 2]  # the shared forward (no gradients), then the two attnlrp rows' own pass
    finally:
        handle.remove()


# ---- the memory budget ------------------------------------------------------------------------------------------


def test_the_memory_budget_refuses_before_running_and_names_what_fits() -> None:
    config = BertConfig(
        vocab_size=60, hidden_size=64, num_hidden_layers=2, num_attention_heads=16, intermediate_size=128,
        max_position_embeddings=512,
    )  # fmt: skip
    config.num_labels = 3
    model = BertForSequenceClassification(config).double().eval()  # loaded with sdpa, the library's default
    batch = text_batch(model, lengths=(400, 300))
    size = ModelSize.of(model, describe(model))
    gae, attnlrp = (estimate_bytes(size, method, 2, 400, {}) for method in ("gae", "attnlrp"))
    budget = (gae + attnlrp) // 2 // 2**20
    assert attnlrp < budget * 2**20 < gae
    calls: list[int] = []
    handle = model.get_input_embeddings().register_forward_hook(lambda m, a, out: calls.append(1))
    try:
        with pytest.raises(MemoryBudgetError, match=r"'gae' needs about [\d,]+ MiB .* budget of [\d,]+ MiB.*attnlrp"):
            explain(model, batch, method="gae", memory_budget_mib=budget)
        assert calls == []  # refused before the forward
        assert explain(model, batch, method="attnlrp", memory_budget_mib=budget).scores.shape == (2, 400)
        # served rows are checked alone, at their own length: a row of 300 tokens needs less than one of 400
        row_budget = estimate_bytes(size, "gae", 1, 350, {}) // 2**20
        requests = [RowRequest("gae"), RowRequest("gae"), RowRequest(None)]
        result = explain_batch(model, text_batch(model, lengths=(400, 300, 5)), requests, memory_budget_mib=row_budget)
        assert isinstance(result.rows[0], MemoryBudgetError) and "'gae' needs about" in str(result.rows[0])
        assert isinstance(result.rows[1], RowExplanation) and result.rows[2] is None
    finally:
        handle.remove()
    with pytest.raises(InvalidOptionError, match="memory_budget_mib"):
        explain(model, batch, method="attnlrp", memory_budget_mib=0)


def test_estimates_grow_with_n_squared_for_maps_and_with_n_on_fused_attention() -> None:
    sdpa, eager = _loaded("llama", "sdpa"), _loaded("llama", "eager")
    fused, plain = ModelSize.of(sdpa, describe(sdpa)), ModelSize.of(eager, describe(eager))
    assert fused.fused and not plain.fused and fused.element_bytes == 8
    for method in ("gae", "rollout", "relevance"):
        assert estimate_bytes(fused, method, 1, 8192, {}) > 3.5 * estimate_bytes(fused, method, 1, 4096, {})
    for method in FAST_METHODS:
        ratio = estimate_bytes(fused, method, 1, 8192, {}) / estimate_bytes(fused, method, 1, 4096, {})
        assert 1.9 < ratio < 2.1
        assert estimate_bytes(plain, method, 1, 8192, {}) > 10 * estimate_bytes(fused, method, 1, 8192, {})


def test_the_service_refuses_a_row_over_its_memory_budget_with_a_413_and_serves_the_others() -> None:
    """Served: ``handler.memory_budget_mib`` turns a row over budget into ``over_memory_budget`` (413,
    RESOURCE_EXHAUSTED) in JSON and protobuf, before it runs; the rows of the same batch that fit are served."""
    import dataclasses
    import json

    import yaml

    from explain_client import protos
    from serving_core.config import HandlerConfig
    from serving_core.tasks.classify_schema import decode_row, encode_outcome
    from serving_core.tasks.classify_service import ExplanationService
    from serving_core.wire import row_encoding
    from tests.serving_support import tiny_archives

    archive = tiny_archives()["sentiment"]
    config = HandlerConfig.from_model_yaml(yaml.safe_load((archive / "model-config.yaml").read_text()))
    service = ExplanationService(config, archive / "model", torch.device("cpu"))
    assert fused_implementation(service.model) == "sdpa"  # loaded with the library's default attention
    size = ModelSize.of(service.model, describe(service.model))
    length = config.max_length
    budget = -(-estimate_bytes(size, "attnlrp", 1, length, {}) // 2**20)  # attnlrp fits, just
    assert estimate_bytes(size, "relevance", 1, length, {}) > budget * 2**20
    service.config = dataclasses.replace(config, memory_budget_mib=budget)
    long_text = "the food was cold " * 200  # truncated to max_length tokens
    raw: list[dict[str, Any]] = [
        {"body": {"text": long_text, "explain": {"method": "relevance"}}},
        {"body": {"text": long_text, "explain": {"method": "attnlrp"}}},
        {"body": {"text": "short and sweet", "explain": {"method": "relevance"}}},
        {"body": {"text": long_text}},
    ]
    rows = [decode_row(row, False, service.config) for row in raw]
    outcomes, _ = service.run(rows, [row_encoding(row) for row in raw])
    refused = outcomes[0].error
    assert refused is not None and refused.code == "over_memory_budget" and refused.http_status == 413
    assert "'relevance' needs about" in refused.message and "attnlrp" in refused.message
    document = json.loads(encode_outcome(outcomes[0], config.labels))
    assert document["error"]["code"] == "over_memory_budget" and document["error"]["grpc_code"] == "RESOURCE_EXHAUSTED"
    outcomes[0].encoding = outcomes[0].encoding.PROTOBUF
    reply = protos.explain_messages().ExplainResponse.FromString(encode_outcome(outcomes[0], config.labels))
    assert reply.error.code == "over_memory_budget" and reply.error.http_status == 413
    assert outcomes[1].error is None and outcomes[1].scores and outcomes[2].error is None and outcomes[2].scores
    assert outcomes[3].error is None and outcomes[3].method is None


def test_the_service_on_sdpa_serves_what_an_eager_model_explains_in_process() -> None:
    """The service loads ``sdpa``: in one mixed batch (map methods, fused gradient methods, a prediction), each row's
    scores and probabilities equal the same checkpoint loaded with eager attention and explained alone in-process."""
    import yaml
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from serving_core.config import HandlerConfig
    from serving_core.tasks.classify_schema import decode_row
    from serving_core.tasks.classify_service import ExplanationService
    from serving_core.wire import row_encoding
    from tests.serving_support import tiny_archives

    archive = tiny_archives()["sentiment"]
    config = HandlerConfig.from_model_yaml(yaml.safe_load((archive / "model-config.yaml").read_text()))
    service = ExplanationService(config, archive / "model", torch.device("cpu"))
    assert fused_implementation(service.model) == "sdpa"
    eager = AutoModelForSequenceClassification.from_pretrained(str(archive / "model"), attn_implementation="eager")
    tokenizer = AutoTokenizer.from_pretrained(str(archive / "model"))
    texts = ["the crew was rude and the food cold", "great flight", "late again, never more", "ok", "lost my bag"]
    methods = ["attnlrp", "gae", None, "grad_x_input", "rollout"]
    raw: list[dict[str, Any]] = [
        {"body": {"text": text, **({"explain": {"method": method}} if method else {})}}
        for text, method in zip(texts, methods, strict=True)
    ]
    outcomes, _ = service.run([decode_row(row, False, config) for row in raw], [row_encoding(row) for row in raw])
    for text, method, outcome in zip(texts, methods, outcomes, strict=True):
        assert outcome.error is None, outcome.error
        inputs = dict(tokenizer([text], return_tensors="pt", truncation=True, max_length=config.max_length))
        expected = explain(eager, inputs, method=method or "attention")
        probabilities = expected.logits.softmax(dim=-1)[0].float()
        torch.testing.assert_close(torch.tensor(outcome.probabilities), probabilities, rtol=1e-5, atol=1e-6)
        if method is None:
            assert outcome.scores is None
            continue
        assert outcome.method == method and outcome.target == int(expected.target[0])
        torch.testing.assert_close(torch.tensor(outcome.scores), expected.scores[0].float(), rtol=1e-4, atol=1e-6)


def test_the_memory_budget_key_is_checked_when_the_model_loads() -> None:
    from serving_core.config import ConfigError, HandlerConfig

    section: dict[str, Any] = {"task": "text", "labels": ["a", "b"], "memory_budget_mib": 512}
    assert HandlerConfig.from_model_yaml({"handler": section}).memory_budget_mib == 512
    assert HandlerConfig.from_model_yaml({"handler": {**section, "memory_budget_mib": None}}).memory_budget_mib is None
    for wrong in (0, -3, "lots", 1.5):
        with pytest.raises(ConfigError, match="memory_budget_mib"):
            HandlerConfig.from_model_yaml({"handler": {**section, "memory_budget_mib": wrong}})
    with pytest.raises(ConfigError, match="text and image tasks only"):
        HandlerConfig.from_model_yaml({"handler": {**section, "task": "token_classification"}})
