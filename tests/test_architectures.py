"""The support matrix, generated from the registry: every family × every method, on tiny float64 models.

A cell that works must give the guarantees of every other cell (shapes, finite scores, exactly 0 at padding,
batched == per-example with mixed lengths on every accepted padding side, logits equal to a plain eager forward,
the model left exactly as found); a refused cell must raise :class:`UnsupportedMethodError` naming the model type
and the methods that work.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor, nn
from transformers import AttentionInterface, RobertaConfig, RobertaForSequenceClassification

from explainers import (
    CAPTURE_IMPLEMENTATION,
    FAMILIES,
    AttentionObserver,
    InvalidInputError,
    InvalidTargetError,
    RowExplanation,
    RowRequest,
    UnsupportedMethodError,
    available_methods,
    capturing_attention,
    explain,
    explain_batch,
    head_type,
    pooled_position,
    support_table,
    supported_methods,
    supported_model_types,
)
from explainers.architectures.support import refusal

from .arch_zoo import (
    LENGTHS,
    NUM_LABELS,
    VARIANTS,
    Variant,
    alone_tolerance,
    batch_for,
    pair_batch,
    row_alone,
    text_batch,
)

METHODS = available_methods()
FAST: dict[str, dict[str, int]] = {"integrated_gradients": {"n_steps": 4}}
BY_NAME = {variant.name: variant for variant in VARIANTS}
CELLS = [(variant, method) for variant in VARIANTS for method in METHODS]
MAP_METHODS = frozenset({"attention", "rollout"})


@functools.cache
def _model(name: str) -> Any:
    """One model per variant for the whole module: every test also checks it is left exactly as found."""
    return BY_NAME[name].build()


def _snapshot(model: Any) -> dict[str, Any]:
    configs = {id(model.config): model.config}
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "_attn_implementation_internal"):
            configs[id(config)] = config
    return {
        "weights": {name: value.detach().clone() for name, value in model.state_dict().items()},
        "training": [module.training for module in model.modules()],
        "requires_grad": [parameter.requires_grad for parameter in model.parameters()],
        "grads": [parameter.grad for parameter in model.parameters()],
        "attention": {key: config._attn_implementation_internal for key, config in configs.items()},
        "hooks": sum(
            len(module._forward_hooks) + len(module._forward_pre_hooks) + len(module._backward_hooks)
            for module in model.modules()
        ),
    }


def _assert_unchanged(model: nn.Module, before: dict[str, Any]) -> None:
    after = _snapshot(model)
    assert after["training"] == before["training"]
    assert after["requires_grad"] == before["requires_grad"]
    assert all(grad is None for grad in after["grads"])
    assert after["attention"] == before["attention"]
    assert after["hooks"] == before["hooks"] == 0
    for name, value in before["weights"].items():
        assert torch.equal(after["weights"][name], value), name


def _plain_logits(model: nn.Module, batch: dict[str, Tensor]) -> Tensor:
    """A plain eager forward, with the positions the explainers give decoder rows (real tokens counted)."""
    inputs = dict(batch)
    if pooled_position(model) == "last":
        inputs["position_ids"] = (batch["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        return model(**inputs).logits


def _sides(variant: Variant) -> list[str]:
    return list(FAMILIES[variant.model_type].padding) if variant.is_text else ["right"]


def test_every_registry_family_has_a_tiny_model_and_refusals_name_real_methods() -> None:
    assert {variant.model_type for variant in VARIANTS} == set(FAMILIES) == set(supported_model_types())
    for known in FAMILIES.values():
        assert set(known.refused) <= set(METHODS), known.model_type
    table = support_table(METHODS)
    for model_type in FAMILIES:
        assert f"`{model_type}`" in table
    serving = (Path(__file__).resolve().parent.parent / "docs" / "SERVING.md").read_text(encoding="utf-8")
    assert table in serving, "docs/SERVING.md's support matrix is stale: paste explainers.support_table(...) there"


@pytest.mark.parametrize("variant", VARIANTS, ids=[variant.name for variant in VARIANTS])
def test_pooled_position_and_head_type(variant: Variant) -> None:
    model = _model(variant.name)
    assert pooled_position(model) == variant.pooled
    assert head_type(model) == "single_label"


@pytest.mark.parametrize("variant, method", CELLS, ids=[f"{v.name}-{m}" for v, m in CELLS])
def test_cell(variant: Variant, method: str) -> None:
    model = _model(variant.name)
    before = _snapshot(model)
    reason = refusal(variant.model_type, method)
    batch = batch_for(variant, model)
    if reason is not None:
        with pytest.raises(UnsupportedMethodError) as raised:
            explain(model, batch, method=method)
        message = str(raised.value)
        assert repr(variant.model_type) in message and reason in message
        assert all(name in message for name in supported_methods(variant.model_type))
        size = next(iter(batch.values())).shape[0]
        refused_row = explain_batch(model, batch, [RowRequest(method)] + [RowRequest(None)] * (size - 1)).rows[0]
        assert isinstance(refused_row, UnsupportedMethodError)
        _assert_unchanged(model, before)
        return
    options = FAST.get(method, {})
    for side in _sides(variant):
        batch = batch_for(variant, model, side)
        result = explain(model, batch, method=method, **options)
        size = next(iter(batch.values())).shape[0]
        assert result.pooled == variant.pooled
        assert result.logits.shape == (size, NUM_LABELS)
        plain = _plain_logits(model, batch)
        finite = torch.isfinite(plain).all(dim=-1)
        assert torch.allclose(result.logits[finite], plain[finite], atol=1e-10, rtol=0)
        assert torch.isfinite(result.logits).all() and torch.isfinite(result.scores).all()
        if variant.is_text:
            assert result.scores.shape == batch["input_ids"].shape
            assert (result.scores[batch["attention_mask"] == 0] == 0).all()
        else:
            grid = model.config.image_size // model.config.patch_size
            assert result.scores.shape == (size, grid, grid)
        assert result.scores.abs().sum() > 0
        for row in range(size):
            alone_inputs = row_alone(batch, row)
            alone = explain(model, alone_inputs, method=method, **options)
            logits_tolerance = alone_tolerance(variant.model_type) * max(1.0, float(alone.logits.abs().max()))
            assert torch.allclose(result.logits[row], alone.logits[0], atol=logits_tolerance, rtol=0), (side, row)
            assert torch.allclose(alone.logits[0], _plain_logits(model, alone_inputs)[0], atol=1e-10, rtol=0)
            assert alone.target[0] == result.target[row]
            expected = alone.scores[0]
            got = result.scores[row][batch["attention_mask"][row].bool()] if variant.is_text else result.scores[row]
            scale = float(expected.abs().max().clamp(min=1e-30))
            tolerance = max(1e-7, alone_tolerance(variant.model_type, gradients=method not in MAP_METHODS))
            assert torch.allclose(got, expected, atol=tolerance * scale, rtol=0), (side, row, got, expected)
    _assert_unchanged(model, before)


@pytest.mark.parametrize("name", ["bert", "llama", "modernbert-mean", "deberta-v2", "vit", "albert"])
def test_explain_batch_rows_equal_explain_on_every_side(name: str) -> None:
    variant = BY_NAME[name]
    model = _model(name)
    for side in _sides(variant):
        batch = batch_for(variant, model, side)
        rows = [
            RowRequest("gae"),
            RowRequest(None),
            RowRequest("rollout", options={"start_layer": 1}),
            RowRequest("gae", 1),
        ]
        result = explain_batch(model, batch, rows[: next(iter(batch.values())).shape[0]])
        assert result.pooled == variant.pooled
        assert result.rows[1] is None
        for index in (0, 2):
            row = result.rows[index]
            assert isinstance(row, RowExplanation) and row.pooled == variant.pooled
            request = rows[index]
            assert request.method is not None
            alone = explain(model, row_alone(batch, index), method=request.method, **request.options)
            expected = alone.scores[0]
            assert row.scores.shape == expected.shape
            tolerance = alone_tolerance(variant.model_type, gradients=request.method == "gae")
            assert torch.allclose(row.scores, expected, atol=tolerance * float(expected.abs().max()), rtol=0)


# ---- the capture: attention implementation switched and restored, per-call records, observer slot ------------


@pytest.mark.parametrize("name", ["bert", "llama", "modernbert", "gpt2", "dinov2", "albert"])
def test_a_model_loaded_with_sdpa_is_switched_and_switched_back(name: str) -> None:
    """Explained under the capture (the architecture's eager attention) and handed back on ``sdpa``."""
    model = BY_NAME[name].build()
    batch = batch_for(BY_NAME[name], model)
    eager_logits = _plain_logits(model, batch)
    model.set_attn_implementation("sdpa")
    assert model.config._attn_implementation == "sdpa"
    before = _snapshot(model)
    result = explain(model, batch, method="gae")
    finite = torch.isfinite(eager_logits).all(dim=-1)
    assert torch.allclose(result.logits[finite], eager_logits[finite], atol=1e-10, rtol=0)
    _assert_unchanged(model, before)
    assert model.config._attn_implementation == "sdpa"


class _Raises(AttentionObserver):
    def after(self, call: Any, attn_output: Tensor, attn_weights: Tensor) -> None:
        raise RuntimeError("observer failed")


@pytest.mark.parametrize("name", ["llama", "deberta-v2"])
def test_capture_restores_everything_when_the_forward_raises(name: str) -> None:
    model = _model(name)
    before = _snapshot(model)
    batch = batch_for(BY_NAME[name], model)
    with pytest.raises(RuntimeError, match="observer failed"), capturing_attention(model, observer=_Raises()):
        assert model.config._attn_implementation == CAPTURE_IMPLEMENTATION
        model(**batch)
    _assert_unchanged(model, before)


def test_nothing_process_wide_changes_but_the_one_new_name() -> None:
    registered = dict(AttentionInterface._global_mapping)
    model = _model("qwen3")
    explain(model, batch_for(BY_NAME["qwen3"], model), method="gae")
    assert dict(AttentionInterface._global_mapping) == registered
    assert CAPTURE_IMPLEMENTATION in registered
    for name in ("sdpa", "flash_attention_2", "flex_attention"):
        assert registered[name].__module__.startswith("transformers.")


def test_albert_is_recorded_per_call_not_per_module() -> None:
    model = _model("albert")
    with torch.no_grad(), capturing_attention(model, keep="mean") as capture:
        model(**text_batch(model))
    assert [call.index for call in capture.calls] == [0, 1]
    assert capture.calls[0].module is capture.calls[1].module
    assert [call.repeat for call in capture.calls] == [0, 1]
    assert not torch.equal(capture.probabilities[0], capture.probabilities[1])


class _Recorder(AttentionObserver):
    """Checks the shapes of the protocol and replaces the inputs as ``replace`` says."""

    def __init__(self, replace: str) -> None:
        self.replace = replace
        self.shapes: list[tuple[Any, ...]] = []

    def before(self, call: Any, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        self.shapes.append((tuple(query.shape), tuple(key.shape), tuple(value.shape)))
        if self.replace == "stop_qk":
            return query.detach(), key.detach(), value
        if self.replace == "zero_v":
            return query, key, value * 0
        return query, key, value

    def after(self, call: Any, attn_output: Tensor, attn_weights: Tensor) -> None:
        batch, heads, length, _ = attn_weights.shape
        assert attn_output.shape[:3] == (batch, length, heads)
        if self.replace != "stop_qk":
            assert attn_weights.requires_grad == torch.is_grad_enabled()


def _embedding_gradient(
    model: nn.Module, batch: dict[str, Tensor], observer: AttentionObserver
) -> tuple[Tensor, Tensor]:
    embeddings = model.get_input_embeddings()  # type: ignore[operator]
    kept: list[Tensor] = []

    def leaf(module: nn.Module, args: Any, output: Tensor) -> Tensor:
        kept.append(output.detach().requires_grad_(True))
        return kept[0]

    handle = embeddings.register_forward_hook(leaf)
    try:
        with capturing_attention(model, keep="none", observer=observer):
            logits = model(**batch).logits
    finally:
        handle.remove()
    (gradient,) = torch.autograd.grad(logits[:, 0].sum(), kept)
    return logits.detach(), gradient


@pytest.mark.parametrize("name", ["llama", "deberta-v2", "bert"])
def test_the_observer_replaces_query_key_value(name: str) -> None:
    """An observer's replacement is what the attention runs on: a stopped gradient into q, k keeps the forward
    and changes the gradient; a zeroed value changes the forward."""
    model = _model(name)
    batch = text_batch(model, lengths=(5, 5))
    plain = _Recorder("none")
    logits, gradient = _embedding_gradient(model, batch, plain)
    heads = model.config.num_attention_heads
    assert len(plain.shapes) == model.config.num_hidden_layers
    assert all(query[:3] == (2, heads, 5) and key[2] == value[2] == 5 for query, key, value in plain.shapes)
    stopped_logits, stopped_gradient = _embedding_gradient(model, batch, _Recorder("stop_qk"))
    assert torch.equal(stopped_logits, logits)
    assert not torch.allclose(stopped_gradient, gradient)
    zeroed_logits, _ = _embedding_gradient(model, batch, _Recorder("zero_v"))
    assert not torch.allclose(zeroed_logits, logits)


def test_rollout_keeps_only_head_means() -> None:
    """Memory: a capture for rollout keeps ``(batch, n, n)`` head means, not per-head maps."""
    model = _model("modernbert")
    with torch.no_grad(), capturing_attention(model, keep="mean") as capture:
        model(**text_batch(model))
    assert all(probabilities.dim() == 3 and not probabilities.requires_grad for probabilities in capture.probabilities)


# ---- inputs and heads people serve ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["bert", "albert", "electra", "deberta-v2"])
def test_sentence_pairs_score_both_segments(name: str) -> None:
    model = _model(name)
    batch = pair_batch(model)
    for method in ("gae", "grad_x_input"):
        result = explain(model, batch, method=method)
        plain = _plain_logits(model, batch)
        assert torch.allclose(result.logits, plain, atol=1e-10, rtol=0)
        without_types = _plain_logits(model, {k: v for k, v in batch.items() if k != "token_type_ids"})
        assert not torch.allclose(plain, without_types)  # the segments reach the model
        for row in range(len(LENGTHS)):
            alone = explain(model, row_alone(batch, row), method=method)
            got = result.scores[row][: LENGTHS[row]]
            assert torch.allclose(got, alone.scores[0], atol=1e-9 * float(alone.scores.abs().max()), rtol=0)
            second = batch["token_type_ids"][row, : LENGTHS[row]] == 1
            assert got[second].abs().sum() > 0 and got[~second].abs().sum() > 0


@pytest.mark.parametrize("name", ["roberta", "llama", "vit"])
def test_multi_label_head_explains_every_label_with_sigmoid_probabilities(name: str) -> None:
    variant = BY_NAME[name]
    model = variant.build()
    model.config.problem_type = "multi_label_classification"
    batch = batch_for(variant, model)
    assert head_type(model) == "multi_label"
    scores = []
    for target in range(NUM_LABELS):
        result = explain(model, batch, method="gae", target=target)
        assert result.head_type == "multi_label"
        assert torch.allclose(result.probabilities, result.logits.sigmoid())
        assert (result.target == target).all()
        scores.append(result.scores)
    assert not torch.allclose(scores[0], scores[1])


@pytest.mark.parametrize("name", ["bert", "qwen2", "deit"])
def test_regression_head_explains_its_single_output(name: str) -> None:
    variant = BY_NAME[name]
    model = variant.build()
    model.config.num_labels = 1
    head = getattr(model, "score", None) or getattr(model, "classifier", None) or model.cls_classifier
    if isinstance(head, nn.Linear):
        replacement = nn.Linear(head.in_features, 1, bias=head.bias is not None).double()
    else:
        replacement = head
        replacement.out_proj = nn.Linear(head.out_proj.in_features, 1).double()
    for attribute in ("score", "classifier", "cls_classifier"):
        if getattr(model, attribute, None) is head:
            setattr(model, attribute, replacement)
    if hasattr(model, "distillation_classifier"):
        model.distillation_classifier = nn.Linear(head.in_features, 1).double()
    batch = batch_for(variant, model)
    assert head_type(model) == "regression"
    result = explain(model, batch, method="gae")
    assert result.head_type == "regression" and (result.target == 0).all()
    assert torch.equal(result.probabilities, result.logits)
    assert torch.equal(explain(model, batch, method="gae", target=0).scores, result.scores)
    with pytest.raises(InvalidTargetError, match="regression head with one output"):
        explain(model, batch, method="gae", target=1)


def test_padding_sides_are_validated_per_architecture() -> None:
    encoder = _model("electra")
    left = text_batch(encoder, side="left")
    with pytest.raises(InvalidInputError, match="padding_side='right'"):
        explain(encoder, left, method="rollout")
    decoder = _model("mistral")
    mixed = text_batch(decoder)
    mixed["attention_mask"][0] = torch.tensor([0, 1, 1, 1, 1, 1, 1, 0, 0])
    with pytest.raises(InvalidInputError, match=r"left-padded .* or right-padded"):
        explain(decoder, mixed, method="rollout")


def test_token_types_beyond_the_models_segments_are_refused_clearly() -> None:
    config = RobertaConfig(
        vocab_size=60, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16,
        max_position_embeddings=40, pad_token_id=1, type_vocab_size=1,  # as roberta-base: one segment type
    )  # fmt: skip
    model = RobertaForSequenceClassification(config).eval()
    batch = pair_batch(model)
    with pytest.raises(InvalidInputError, match=r"token_type_ids of a roberta model must be in \[0, 0\]"):
        explain(model, batch, method="gae")


def test_a_decoder_without_pad_token_id_explains_single_rows_only() -> None:
    model = BY_NAME["llama"].build()
    model.config.pad_token_id = None
    batch = text_batch(model, lengths=(4, 4))
    with pytest.raises(InvalidInputError, match="pad_token_id"):
        explain(model, batch, method="rollout")
    single = explain(model, row_alone(batch, 0), method="rollout")
    assert single.pooled == "last" and torch.isfinite(single.scores).all()


def test_decoder_reads_the_token_the_head_reads() -> None:
    """The explained row is the last real token: for attention, the row of that token in the last layer."""
    model = _model("gpt2")
    batch = text_batch(model, lengths=(6, 3), side="left")
    result = explain(model, batch, method="attention")
    with torch.no_grad():
        attentions = model(
            **batch, position_ids=(batch["attention_mask"].cumsum(-1) - 1).clamp(min=0), output_attentions=True
        ).attentions
    expected = attentions[-1].mean(dim=1)[:, -1] * batch["attention_mask"]
    assert torch.allclose(result.scores, expected, atol=1e-12)


def test_dinov2_is_explained_on_the_grid_of_the_image_it_gets() -> None:
    """DINOv2 interpolates its position embeddings: a 24×20 image on 4-pixel patches is a 6×5 grid."""
    model = _model("dinov2")
    pixels = torch.randn((2, 3, 24, 20), generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    for method in ("rollout", "gae", "grad_x_input"):
        result = explain(model, {"pixel_values": pixels}, method=method)
        assert result.scores.shape == (2, 6, 5) and torch.isfinite(result.scores).all()
        alone = explain(model, {"pixel_values": pixels[1:]}, method=method)
        assert torch.allclose(result.scores[1], alone.scores[0], atol=1e-9 * float(alone.scores.abs().max()))


def test_deberta_v3_shared_keys_explained_as_separate_position_projections() -> None:
    """DeBERTa-v3 checkpoints set ``share_att_key``: the layer's query/key projections also run on the relative
    position embeddings. The adapter swaps only the tokens' projections (AttnLRP and CP-LRP raised an index error on
    such a model before), so every method equals the same weights with the position projections as modules of their
    own (``share_att_key=False``, ``pos_query_proj``/``pos_key_proj`` copied from the query/key projections)."""
    shared = Variant("deberta-v3", "deberta-v2", "first", config_key="deberta-v2", overrides={"share_att_key": True})
    model = shared.build()
    separate = Variant("deberta-v3-separate", "deberta-v2", "first", config_key="deberta-v2").build()
    state = dict(model.state_dict())
    for key, value in model.state_dict().items():
        for name, position in (("query_proj", "pos_query_proj"), ("key_proj", "pos_key_proj")):
            if f".attention.self.{name}." in key:
                state[key.replace(f".{name}.", f".{position}.")] = value
    separate.load_state_dict(state, strict=True)
    batch = text_batch(model)
    with torch.no_grad():
        assert torch.equal(model(**batch).logits, separate(**batch).logits)
    before = _snapshot(model)
    for method in supported_methods("deberta-v2"):
        got = explain(model, batch, method=method, **FAST.get(method, {}))
        expected = explain(separate, batch, method=method, **FAST.get(method, {}))
        assert torch.isfinite(got.scores).all(), method
        scale = float(expected.scores.abs().max())
        assert torch.allclose(got.scores, expected.scores, atol=1e-9 * scale, rtol=0), method
    _assert_unchanged(model, before)
