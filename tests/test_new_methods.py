"""Properties of the founding papers' baselines that hold without their authors' code (which the reference tests use):
SmoothGrad's noise, occlusion's oracle, attention flow's one-layer case and its length limit, GradCAM's range.

The generated matrix (tests/test_architectures.py, test_token_classification.py, test_targets.py, test_generation.py)
checks every method for batched == alone, padding 0 and the model left as found; these are the methods' own promises.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor
from transformers import BertConfig, BertForSequenceClassification

from explainers import (
    InvalidInputError,
    InvalidOptionError,
    RowExplanation,
    RowRequest,
    UnsupportedMethodError,
    explain,
    explain_batch,
    get_method,
)
from explainers.methods import FLOW_MAX_TOKENS
from explainers.tasks.targets import Targets, explain_targets

from .arch_zoo import VARIANTS, batch_for, build_token_level, row_alone, text_batch
from .weights import perturb


def _variant_model(name: str) -> tuple[Any, dict[str, Tensor]]:
    variant = next(variant for variant in VARIANTS if variant.name == name)
    model = variant.build()
    return model, batch_for(variant, model)


def _difference(got: Tensor, expected: Tensor) -> float:
    """The largest difference relative to the largest expected score."""
    return float((got - expected).abs().max()) / float(expected.abs().max().clamp(min=1e-30))


def _close(got: Tensor, expected: Tensor, tolerance: float = 1e-10) -> None:
    assert _difference(got, expected) <= tolerance, (got, expected)


# ---- SmoothGrad ------------------------------------------------------------------------------------------------


def test_smoothgrad_without_noise_is_gradient_times_input() -> None:
    for name in ("bert", "llama", "vit"):
        model, batch = _variant_model(name)
        plain = explain(model, batch, method="grad_x_input").scores
        noiseless = explain(model, batch, method="smoothgrad", n_samples=3, stdev=0).scores
        assert _difference(noiseless, plain) <= 1e-10, (name, noiseless, plain)


def test_smoothgrad_is_seeded_and_its_copies_may_be_chunked_anyhow() -> None:
    model, batch = _variant_model("bert")
    first = explain(model, batch, method="smoothgrad", n_samples=6, seed=3).scores
    assert torch.equal(first, explain(model, batch, method="smoothgrad", n_samples=6, seed=3).scores)
    other = explain(model, batch, method="smoothgrad", n_samples=6, seed=4).scores
    assert not torch.allclose(first, other)
    chunked = explain(model, batch, method="smoothgrad", n_samples=6, seed=3, internal_batch_size=1).scores
    _close(chunked, first)
    assert not torch.allclose(first, explain(model, batch, method="grad_x_input").scores)


def test_smoothgrad_of_an_lm_target_is_its_row_alone_and_its_round_alone() -> None:
    """The noise is each row's own: a target's scores do not depend on the other rows, nor on the other targets."""
    lm = build_token_level("llama", "causal_lm")
    batch = text_batch(lm, (7, 3, 9, 5), side="left")
    mask = batch["attention_mask"]
    width = mask.shape[1]
    positions = torch.tensor([[width - 1] * 4, [width - 2] * 4])
    labels = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
    active = torch.ones_like(positions, dtype=torch.bool)
    targets = Targets.at_positions(positions, labels, active, mask, causal=True)
    options: dict[str, Any] = {"n_samples": 4, "stdev": 0.3, "seed": 1}
    whole = explain_targets(lm, batch, targets, method="smoothgrad", **options).scores
    for row in range(4):
        alone = row_alone(batch, row)
        real = mask[row].bool()
        one = Targets.at_positions(
            positions[:, row : row + 1] - int((~real).sum()), labels[:, row : row + 1], active[:, :1],
            alone["attention_mask"], causal=True,
        )  # fmt: skip
        scores = explain_targets(lm, alone, one, method="smoothgrad", **options).scores
        # llama's eager softmax and rotary angles are float32 even in float64 (tests/test_generation.py): measured 4e-7
        assert _difference(whole[:, row][:, real], scores[:, 0]) <= 1e-5, (row, whole[:, row], scores[:, 0])
    first_round = Targets.at_positions(positions[:1], labels[:1], active[:1], mask, causal=True)
    alone_round = explain_targets(lm, batch, first_round, method="smoothgrad", **options).scores[0]
    assert _difference(alone_round, whole[0]) <= 1e-10, (alone_round, whole[0])


# ---- occlusion -------------------------------------------------------------------------------------------------


def _zeroed(model: Any, inputs: dict[str, Tensor], position: int, replacement: Tensor | None) -> Tensor:
    def erase(module: Any, args: Any, output: Tensor) -> Tensor:
        output = output.clone()
        output[:, position] = 0 if replacement is None else replacement
        return output

    handle = model.get_input_embeddings().register_forward_hook(erase)
    try:
        with torch.no_grad():
            return model(**inputs).logits
    finally:
        handle.remove()


@pytest.mark.parametrize("token", [-1, 7])
def test_occlusion_is_the_drop_of_the_target_logit_when_one_embedding_is_erased(token: int) -> None:
    model, batch = _variant_model("bert")
    result = explain(model, batch, method="occlusion", baseline_token_id=token, internal_batch_size=5)
    replacement = None if token < 0 else model.get_input_embeddings().weight[token].detach()
    with torch.no_grad():
        full = model(**batch).logits.gather(1, result.target[:, None])[:, 0]
    mask = batch["attention_mask"]
    for position in range(mask.shape[1]):
        erased = _zeroed(model, batch, position, replacement).gather(1, result.target[:, None])[:, 0]
        torch.testing.assert_close(result.scores[:, position], (full - erased) * mask[:, position], rtol=0, atol=1e-12)
    assert not get_method("occlusion").needs_gradients


def test_occlusion_refuses_a_token_on_an_image_model_and_an_unknown_token() -> None:
    model, batch = _variant_model("vit")
    with pytest.raises(InvalidOptionError, match=r"baseline_token_id.*\[-1, -1\]"):
        explain(model, batch, method="occlusion", baseline_token_id=0)
    text, inputs = _variant_model("bert")
    with pytest.raises(InvalidOptionError, match="baseline_token_id"):
        explain(text, inputs, method="occlusion", baseline_token_id=text.config.vocab_size)


# ---- attention flow --------------------------------------------------------------------------------------------


def test_attention_flow_sums_to_one_and_is_rollout_on_one_layer() -> None:
    """Through one layer the graph is one edge per token, so the flow to a token is rollout's weight of it."""
    model, batch = _variant_model("bert")
    flow = explain(model, batch, method="attention_flow").scores
    mask = batch["attention_mask"].bool()
    assert (flow >= 0).all() and (flow[~mask] == 0).all()
    torch.testing.assert_close(flow.sum(dim=-1), torch.ones(flow.shape[0], dtype=flow.dtype), rtol=0, atol=1e-12)
    config = BertConfig(vocab_size=60, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=16, max_position_embeddings=64, num_labels=3)  # type: ignore[call-arg]  # fmt: skip
    one_layer = perturb(BertForSequenceClassification(config).double().eval(), seed=2)
    inputs = text_batch(one_layer)
    _close(
        explain(one_layer, inputs, method="attention_flow").scores, explain(one_layer, inputs, method="rollout").scores
    )


def test_attention_flow_refuses_a_row_longer_than_its_limit_and_serves_the_others() -> None:
    config = BertConfig(vocab_size=60, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=8, max_position_embeddings=FLOW_MAX_TOKENS + 8, num_labels=3)  # type: ignore[call-arg]  # fmt: skip
    model = BertForSequenceClassification(config).double().eval()
    batch = text_batch(model, lengths=(FLOW_MAX_TOKENS + 1, 5))
    with pytest.raises(
        InvalidInputError, match=rf"at most {FLOW_MAX_TOKENS} tokens.*has {FLOW_MAX_TOKENS + 1}.*rollout"
    ):
        explain(model, batch, method="attention_flow")
    rows = explain_batch(model, batch, [RowRequest("attention_flow"), RowRequest("attention_flow")]).rows
    assert isinstance(rows[0], InvalidInputError) and isinstance(rows[1], RowExplanation)


# ---- GradCAM, partial LRP --------------------------------------------------------------------------------------


def test_gradcam_is_rescaled_to_the_unit_range_and_partial_lrp_is_never_negative() -> None:
    for name in ("bert", "vit", "llama"):
        model, batch = _variant_model(name)
        gradcam = explain(model, batch, method="gradcam").scores
        assert (gradcam >= 0).all() and (gradcam <= 1 + 1e-12).all()
        if name != "llama":
            assert (explain(model, batch, method="partial_lrp").scores >= 0).all()


def test_attention_flow_is_refused_with_the_install_command_where_scipy_is_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SciPy is not a dependency of the library (torch and transformers): the method names it, before any work."""
    import explainers.methods.registry as methods_module

    real = methods_module.find_spec
    monkeypatch.setattr(methods_module, "find_spec", lambda name: None if name == "scipy" else real(name))
    model, batch = _variant_model("bert")
    with pytest.raises(UnsupportedMethodError, match=r"needs scipy>=1\.11.*pip install 'scipy>=1\.11'"):
        explain(model, batch, method="attention_flow")
    rows = explain_batch(
        model, batch, [RowRequest("attention_flow"), RowRequest("rollout"), RowRequest(None), RowRequest(None)]
    ).rows
    assert isinstance(rows[0], UnsupportedMethodError) and isinstance(rows[1], RowExplanation)
