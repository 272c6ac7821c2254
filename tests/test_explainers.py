"""Generated tests over every registered method and every supported architecture."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from torch import nn

import explainers.methods.registry as methods_module
from explainers import (
    ExplainError,
    InvalidInputError,
    InvalidOptionError,
    InvalidTargetError,
    NonFiniteScoresError,
    RowExplanation,
    RowRequest,
    UnknownMethodError,
    UnsupportedModelError,
    available_methods,
    explain,
    explain_batch,
    supported_model_types,
)

from .conftest import NUM_LABELS, Case, build_bert, build_vit, make_batch, row_inputs, text_batch

METHODS = available_methods()
FAST_OPTIONS: dict[str, dict[str, int]] = {"integrated_gradients": {"n_steps": 8}}


def test_registry_lists_the_issue_methods() -> None:
    assert set(METHODS) == {
        "attention",
        "rollout",
        "relevance",
        "gae",
        "grad_x_input",
        "integrated_gradients",
        "attnlrp",
        "cp_lrp",
        "gradient",
        "smoothgrad",
        "occlusion",
        "attention_flow",
        "gradcam",
        "lrp",
        "partial_lrp",
    }


def _plain_logits(model: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    with torch.no_grad():
        return model(**batch).logits


@pytest.mark.parametrize("method", METHODS)
def test_shapes_finite_and_zero_padding(case: Case, method: str) -> None:
    model: Any = case.build()
    batch = make_batch(case, model)
    result = explain(model, batch, method=method, **FAST_OPTIONS.get(method, {}))
    size = next(iter(batch.values())).shape[0]
    assert result.method == method
    assert result.target.shape == (size,) and result.target.dtype == torch.long
    assert result.logits.shape == (size, NUM_LABELS)
    assert torch.isfinite(result.scores).all()
    if case.is_text:
        assert result.scores.shape == batch["input_ids"].shape
        assert (result.scores[batch["attention_mask"] == 0] == 0).all()
        assert result.modality == "text"
    else:
        config = model.config
        height, width = config.image_size if isinstance(config.image_size, list) else [config.image_size] * 2
        assert result.scores.shape == (size, height // config.patch_size, width // config.patch_size)
        assert result.modality == "image"
    assert result.scores.abs().sum() > 0


@pytest.mark.parametrize("method", METHODS)
def test_batched_equals_per_example(case: Case, method: str) -> None:
    model = case.build().double()
    batch = make_batch(case, model)
    options = FAST_OPTIONS.get(method, {})
    batched = explain(model, batch, method=method, **options)
    for row in range(batched.target.shape[0]):
        alone = explain(model, row_inputs(batch, row), method=method, **options)
        assert alone.target[0] == batched.target[row]
        expected = alone.scores[0]
        got = batched.scores[row][: expected.shape[0]] if case.is_text else batched.scores[row]
        scale = expected.abs().max().clamp(min=1e-30)
        assert torch.allclose(got, expected, atol=1e-5 * float(scale), rtol=0), (row, got, expected)
        assert torch.allclose(batched.logits[row], alone.logits[0], atol=1e-9)


@pytest.mark.parametrize("method", METHODS)
def test_logits_equal_a_plain_forward(case: Case, method: str) -> None:
    model = case.build().double()
    batch = make_batch(case, model)
    result = explain(model, batch, method=method, **FAST_OPTIONS.get(method, {}))
    assert torch.allclose(result.logits, _plain_logits(model, batch), atol=1e-10, rtol=0)
    assert torch.equal(result.target, _plain_logits(model, batch).argmax(-1))


def _snapshot(model: Any) -> dict[str, Any]:
    return {
        "state": {key: value.clone() for key, value in model.state_dict().items()},
        "training": [(name, module.training) for name, module in model.named_modules()],
        "requires_grad": [(name, p.requires_grad) for name, p in model.named_parameters()],
        "grad": [(name, p.grad) for name, p in model.named_parameters()],
        "attn": model.config._attn_implementation,
        "hooks": [
            (name, dict(m._forward_hooks), dict(m._forward_pre_hooks), dict(m._backward_hooks))
            for name, m in model.named_modules()
        ],
    }


def _assert_same(before: dict[str, Any], after: dict[str, Any]) -> None:
    assert before["state"].keys() == after["state"].keys()
    for key, value in before["state"].items():
        assert torch.equal(value, after["state"][key]), key
    for field in ("training", "requires_grad", "grad", "attn", "hooks"):
        assert before[field] == after[field], field


def _unusual_state(model: Any) -> Any:
    """Fused attention, a submodule in training mode and a frozen parameter: all must survive an explanation."""
    model.set_attn_implementation("sdpa")
    next(iter(model.modules())).training = False
    list(model.modules())[3].train()
    next(model.parameters()).requires_grad_(False)
    return model


@pytest.mark.parametrize("method", METHODS)
def test_model_left_unchanged(case: Case, method: str) -> None:
    model = _unusual_state(case.build())
    batch = make_batch(case, model)
    before = _snapshot(model)
    explain(model, batch, method=method, **FAST_OPTIONS.get(method, {}))
    _assert_same(before, _snapshot(model))


def test_model_left_unchanged_when_the_call_raises(case: Case) -> None:
    model = _unusual_state(case.build())
    batch = make_batch(case, model)

    def boom(module: nn.Module, args: Any, output: Any) -> None:
        raise RuntimeError("boom")

    classifier = model.classifier if hasattr(model, "classifier") else None
    assert isinstance(classifier, nn.Module)
    handle = classifier.register_forward_hook(boom)
    before = _snapshot(model)
    with pytest.raises(RuntimeError, match="boom"):
        explain(model, batch, method="relevance")
    _assert_same(before, _snapshot(model))
    handle.remove()


def test_fused_attention_model_gives_the_eager_result() -> None:
    eager = build_bert()
    fused = build_bert()
    fused.set_attn_implementation("sdpa")
    batch = text_batch(eager)
    a, b = explain(eager, batch, method="relevance"), explain(fused, batch, method="relevance")
    assert fused.config._attn_implementation == "sdpa"
    assert torch.allclose(a.scores, b.scores, atol=1e-6)


def _rollout_oracle(attentions: list[torch.Tensor]) -> torch.Tensor:
    """Abnar & Zuidema rollout for one example, written with explicit loops over rows."""
    length = attentions[0].shape[-1]
    joint = torch.eye(length, dtype=torch.float64)
    for attention in attentions:
        mixed = attention.mean(dim=0)
        augmented = torch.zeros(length, length, dtype=torch.float64)
        for i in range(length):
            row = 0.5 * mixed[i] + 0.5 * torch.nn.functional.one_hot(torch.tensor(i), length).double()
            augmented[i] = row / row.sum()
        joint = augmented @ joint
    return joint


def test_rollout_rows_sum_to_one_and_match_an_oracle(case: Case) -> None:
    from explainers.rules.maps import rollout_matrix

    model = case.build().double()
    batch = make_batch(case, model)
    result = explain(model, batch, method="rollout")
    for row in range(result.target.shape[0]):
        single = row_inputs(batch, row)
        with torch.no_grad():
            attentions = [a[0] for a in model(**single, output_attentions=True).attentions]
        oracle = _rollout_oracle(attentions)
        matrix = rollout_matrix([a.unsqueeze(0) for a in attentions])[0]
        assert torch.allclose(matrix.sum(-1), torch.ones(matrix.shape[0], dtype=torch.float64))
        assert torch.allclose(matrix, oracle, atol=1e-12)
        scores = result.scores[row]
        expected = oracle[0] if case.is_text else oracle[0, 1:].reshape(scores.shape)
        if case.is_text:
            scores = scores[: expected.shape[0]]
            assert torch.isclose(scores.sum(), torch.tensor(1.0, dtype=torch.float64))
        assert torch.allclose(scores, expected, atol=1e-12)


def test_raw_attention_rows_sum_to_one() -> None:
    model = build_bert().double()
    batch = text_batch(model)
    for layer in (0, -1):
        result = explain(model, batch, method="attention", layer=layer)
        assert torch.allclose(result.scores.sum(-1), torch.ones(len(batch["input_ids"]), dtype=torch.float64))
    assert explain(model, batch, method="attention").options == {"layer": -1}


def _attention_and_gradients(model: Any, single: dict[str, torch.Tensor], target: int):
    output = model(**single, output_attentions=True)
    gradients = torch.autograd.grad(output.logits[0, target], output.attentions)
    return [a[0].detach() for a in output.attentions], [g[0] for g in gradients]


@pytest.mark.parametrize("start_layer", [0, 1])
def test_gae_matches_a_loop_oracle(case: Case, start_layer: int) -> None:
    model = case.build().double()
    batch = make_batch(case, model)
    result = explain(model, batch, method="gae", start_layer=start_layer)
    for row in range(result.target.shape[0]):
        attentions, gradients = _attention_and_gradients(model, row_inputs(batch, row), int(result.target[row]))
        length = attentions[0].shape[-1]
        joint = torch.eye(length, dtype=torch.float64)
        for layer in range(start_layer, len(attentions)):
            weighted = torch.zeros(length, length, dtype=torch.float64)
            for head in range(attentions[layer].shape[0]):
                weighted += (gradients[layer][head] * attentions[layer][head]).clamp(min=0)
            joint = joint + (weighted / attentions[layer].shape[0]) @ joint
        expected = joint[0].clone()
        expected[0] = expected.min()
        scores = result.scores[row]
        if case.is_text:
            scores = scores[:length]
        else:
            expected = expected[1:].reshape(scores.shape)
        assert torch.allclose(scores, expected, atol=1e-10)


def test_different_targets_give_different_relevance(case: Case) -> None:
    model = case.build().double()
    batch = make_batch(case, model)
    first = explain(model, batch, method="relevance", target=0)
    second = explain(model, batch, method="relevance", target=torch.full((first.target.shape[0],), 2))
    assert (first.target == 0).all() and (second.target == 2).all()
    assert not torch.allclose(first.scores, second.scores, atol=1e-6)


def test_integrated_gradients_completeness() -> None:
    """Σ attributions ≈ f(x) − f(baseline) (the zero word embedding), the IG axiom, at 300 midpoint steps."""
    model = build_bert().double()
    batch = text_batch(model, lengths=(6, 4))
    result = explain(model, batch, method="integrated_gradients", n_steps=300, internal_batch_size=128)
    with torch.no_grad():
        embeddings = model.bert.embeddings.word_embeddings(batch["input_ids"])
        baseline = model(inputs_embeds=torch.zeros_like(embeddings), attention_mask=batch["attention_mask"],
                         token_type_ids=batch["token_type_ids"]).logits  # fmt: skip
    gathered = result.logits.gather(1, result.target[:, None])[:, 0] - baseline.gather(1, result.target[:, None])[:, 0]
    assert torch.allclose(result.scores.sum(-1), gathered, rtol=1e-3, atol=1e-6)


def test_integrated_gradients_does_not_depend_on_chunking() -> None:
    model = build_bert().double()
    batch = text_batch(model)
    small = explain(model, batch, method="integrated_gradients", n_steps=10, internal_batch_size=3)
    large = explain(model, batch, method="integrated_gradients", n_steps=10, internal_batch_size=1000)
    assert torch.allclose(small.scores, large.scores, atol=1e-10)


# ---- errors -------------------------------------------------------------------------------------------------


def test_unknown_method_lists_the_valid_ones() -> None:
    model = build_bert()
    with pytest.raises(UnknownMethodError) as raised:
        explain(model, text_batch(model), method="lime")
    assert isinstance(raised.value, ValueError)
    for method in METHODS:
        assert method in str(raised.value)


@pytest.mark.parametrize(
    "target, message",
    [(3, r"\[0, 2\]"), (-1, r"\[0, 2\]"), (1.5, "int"), (True, "bool"), (torch.tensor([0, 1]), "shape"),
     (torch.zeros(4), "LongTensor")],
)  # fmt: skip
def test_bad_targets(target: Any, message: str) -> None:
    model = build_bert()
    with pytest.raises(InvalidTargetError, match=message):
        explain(model, text_batch(model), target=target)


@pytest.mark.parametrize(
    "options, message",
    [({"start_layer": 3}, r"\[0, 2\]"), ({"start_layer": -1}, r"\[0, 2\]"), ({"start_layer": "0"}, "integer"),
     ({"layers": 1}, "valid options: start_layer")],
)  # fmt: skip
def test_bad_options(options: dict[str, Any], message: str) -> None:
    model = build_bert()
    with pytest.raises(InvalidOptionError, match=message):
        explain(model, text_batch(model), method="relevance", **options)


def test_wrong_input_keys() -> None:
    model = build_bert()
    batch = text_batch(model)
    with pytest.raises(InvalidInputError, match="missing input_ids"):
        explain(model, {"attention_mask": batch["attention_mask"]})
    with pytest.raises(InvalidInputError, match="unexpected pixel_values"):
        explain(model, {**batch, "pixel_values": torch.zeros(1)})
    with pytest.raises(InvalidInputError, match="accepted keys: pixel_values"):
        explain(build_vit(), batch)
    with pytest.raises(InvalidInputError, match="right-padded"):
        explain(model, {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"].flip(-1)})
    with pytest.raises(InvalidInputError, match="shape of input_ids"):
        explain(model, {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"][:, :2]})


def test_unsupported_model() -> None:
    with pytest.raises(UnsupportedModelError, match=", ".join(supported_model_types())):
        explain(nn.Linear(2, 2), {"input_ids": torch.zeros(1, 2, dtype=torch.long)})


# ---- explain_batch: the serving path ------------------------------------------------------------------------


def test_explain_batch_mixes_methods_rows_and_errors() -> None:
    model = build_bert().double()
    batch = text_batch(model)
    rows = [
        RowRequest("relevance", target=1),
        RowRequest(None),
        RowRequest("attention", options={"layer": 0}),
        RowRequest("nope"),
    ]
    result = explain_batch(model, batch, rows)
    assert torch.allclose(result.logits, _plain_logits(model, batch), atol=1e-10)
    assert result.rows[1] is None
    assert isinstance(result.rows[3], ExplainError) and "valid methods" in str(result.rows[3])
    for row, request in [(0, rows[0]), (2, rows[2])]:
        got = result.rows[row]
        assert isinstance(got, RowExplanation) and request.method is not None
        alone = explain(model, row_inputs(batch, row), method=request.method, target=request.target, **request.options)
        assert got.scores.shape == (int(batch["attention_mask"][row].sum()),)
        assert torch.allclose(got.scores, alone.scores[0], atol=1e-10)
        assert got.target == int(alone.target[0])
    assert set(result.seconds) == {"forward", "backward"}


def test_explain_batch_turns_non_finite_scores_into_that_rows_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """A NaN or infinity in one row's scores (a numerical breakdown) never reaches a response: that row gets a
    NonFiniteScoresError, the other rows of the same method and of other methods are served unchanged."""
    model = build_bert().double()
    batch = text_batch(model)
    rollout = methods_module.get_method("rollout")
    alone = explain(model, row_inputs(batch, 0), method="rollout")  # before the method is broken below

    def breaks_row_one(ctx: methods_module.MethodInputs) -> torch.Tensor:
        scores = rollout.compute(ctx).clone()
        scores[1, 1] = float("nan")
        scores[2, 0] = float("inf")
        return scores

    monkeypatch.setitem(methods_module._REGISTRY, "rollout", dataclasses.replace(rollout, compute=breaks_row_one))
    rows = [RowRequest("rollout"), RowRequest("rollout"), RowRequest("rollout"), RowRequest("attention")]
    result = explain_batch(model, batch, rows)
    assert isinstance(result.rows[1], NonFiniteScoresError) and "NaN or infinite" in str(result.rows[1])
    assert isinstance(result.rows[2], NonFiniteScoresError)
    served = result.rows[0]
    assert isinstance(served, RowExplanation) and torch.isfinite(served.scores).all()
    assert torch.allclose(served.scores, alone.scores[0], atol=1e-10)
    assert isinstance(result.rows[3], RowExplanation) and result.rows[3].method == "attention"


def test_explain_batch_prediction_only_needs_no_backward() -> None:
    model = build_bert()
    result = explain_batch(model, text_batch(model), [RowRequest(None)] * 4)
    assert set(result.seconds) == {"forward"} and result.rows == [None] * 4
