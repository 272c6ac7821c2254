"""``explain_generation`` on tiny causal LMs of every decoder family, float64, batched and left-padded: each step's
scores equal the classifier path for that step's context alone (the LM head read as a classifier over the
vocabulary, :func:`tests.causal_zoo.classifier_twin`), target the step's token; padding, unseen positions, ended rows
and unasked steps are exactly 0; batched equals alone, right padding equals left, a given continuation equals the
generated one; ``steps`` lists, ``"sum"`` and ``contrast`` mean what they say; refusals name the problem."""

from __future__ import annotations

import functools
import math
from typing import Any

import pytest
import torch

from explainers import (
    InvalidTargetError,
    StepSum,
    UnknownMethodError,
    UnsupportedMethodError,
    UnsupportedModelError,
    available_methods,
    explain,
    explain_generation,
)
from explainers.architectures.support import refusal

from .arch_zoo import VARIANTS
from .causal_zoo import FAMILIES, build_causal, classifier_twin, prompts

#: SmoothGrad without noise here: its noise and scale belong to the whole sequence, so a step's noisy scores are not
#: the classifier path's on the context alone (tests/test_new_methods.py checks the noisy ones).
FAST: dict[str, dict[str, Any]] = {
    "integrated_gradients": {"n_steps": 4},
    "smoothgrad": {"n_samples": 2, "stdev": 0.0},
}
NEW = 3
CELLS = [(family, method) for family in FAMILIES for method in available_methods()]


@functools.cache
def _pair(model_type: str) -> tuple[Any, Any]:
    lm = build_causal(model_type)
    return lm, classifier_twin(lm)


def _snapshot(model: Any) -> dict[str, Any]:
    return {
        "weights": {name: value.detach().clone() for name, value in model.state_dict().items()},
        "training": [module.training for module in model.modules()],
        "attention": model.config._attn_implementation,
        "hooks": sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules()),
        "grads": [parameter.grad for parameter in model.parameters()],
    }


def _assert_unchanged(model: Any, before: dict[str, Any]) -> None:
    after = _snapshot(model)
    assert after["training"] == before["training"] and after["attention"] == before["attention"]
    assert after["hooks"] == before["hooks"] == 0 and all(grad is None for grad in after["grads"])
    assert all(torch.equal(after["weights"][name], value) for name, value in before["weights"].items())


def _context(result: Any, row: int, step: int) -> torch.Tensor:
    """Row ``row``'s context of step ``step`` alone: its real tokens before the step."""
    mask = result.attention_mask[row].bool().clone()
    mask[result.prompt_length + step :] = False
    return result.sequences[row][mask]


#: Relative tolerance of "equal": the eager attention of the rotary families computes its softmax in float32 even for
#: a float64 model, so a row padded in a batch and the same row alone differ by float32 rounding there (measured:
#: up to 2e-6 of the largest score for gradient methods, 2e-7 for maps); GPT-2's softmax is float64 (1e-15).
TOLERANCE = {"gpt2": 1e-9}
FLOAT32_SOFTMAX = 1e-5


def _close(got: torch.Tensor, expected: torch.Tensor, what: Any, family: str = "") -> None:
    scale = float(expected.abs().max().clamp(min=1e-30))
    assert got.shape == expected.shape, what
    tolerance = TOLERANCE.get(family, FLOAT32_SOFTMAX)
    assert torch.allclose(got, expected, atol=tolerance * scale, rtol=0), (what, got, expected)


@pytest.mark.parametrize("family, method", CELLS, ids=[f"{f}-{m}" for f, m in CELLS])
def test_each_step_equals_the_classifier_path_on_its_context_alone(family: str, method: str) -> None:
    lm, twin = _pair(family)
    batch = prompts()
    options = FAST.get(method, {})
    reason = refusal(family, method)
    if reason is not None:
        with pytest.raises(UnsupportedMethodError, match=reason[:40]):
            explain_generation(lm, batch, method=method, max_new_tokens=NEW)
        return
    before = _snapshot(lm)
    result = explain_generation(lm, batch, method=method, max_new_tokens=NEW, **options)
    _assert_unchanged(lm, before)
    rows, width = result.sequences.shape
    assert result.scores.shape == (rows, result.generated.shape[1], width)
    assert result.method == method and result.steps == tuple(range(result.generated.shape[1]))
    assert torch.isfinite(result.scores).all()
    for row in range(rows):
        for step in range(int(result.generated_mask[row].sum())):
            context = _context(result, row, step)
            token = int(result.generated[row, step])
            expected = explain(twin, {"input_ids": context[None]}, method=method, target=token, **options)
            _close(result.context_scores(row, step), expected.scores[0], (row, step), family)
            probability = expected.logits[0].softmax(-1)[token]
            # float32 softmax inside several architectures' eager attention: ~1e-8 between batched and alone
            assert math.isclose(float(result.probabilities[row, step]), float(probability), rel_tol=1e-6)
            assert math.isclose(float(result.values[row, step]), float(expected.logits[0, token]), rel_tol=1e-6)
            unseen = torch.ones(width, dtype=torch.bool)
            unseen[: result.prompt_length + step] = False
            assert (result.scores[row, step][unseen] == 0).all()
            assert (result.scores[row, step][result.attention_mask[row] == 0] == 0).all()


@pytest.mark.parametrize("family", FAMILIES)
def test_batched_equals_alone_right_equals_left_and_given_equals_generated(family: str) -> None:
    lm, _ = _pair(family)
    batch = prompts()
    for method in ("rollout", "attnlrp"):
        left = explain_generation(lm, batch, method=method, max_new_tokens=NEW)
        right = explain_generation(lm, prompts(side="right"), method=method, max_new_tokens=NEW)
        assert torch.equal(left.sequences, right.sequences)
        assert torch.allclose(left.scores, right.scores, atol=1e-10, rtol=0)
        given = explain_generation(lm, batch, method=method, continuation=left.generated)
        assert torch.equal(given.generated, left.generated) and given.seconds["generate"] == 0.0
        assert torch.allclose(given.scores, left.scores, atol=1e-10, rtol=0)
        assert torch.allclose(given.probabilities, left.probabilities, atol=1e-10, rtol=0)
        for row in range(3):
            keep = batch["attention_mask"][row].bool()
            alone = explain_generation(
                lm, {"input_ids": batch["input_ids"][row : row + 1, keep]}, method=method, max_new_tokens=NEW
            )
            steps = int(alone.generated_mask[0].sum())
            assert left.generated[row, :steps].tolist() == alone.generated[0, :steps].tolist()
            for step in range(steps):
                _close(left.context_scores(row, step), alone.context_scores(0, step), (method, row, step), family)


def test_ended_rows_and_unasked_steps_are_exactly_zero() -> None:
    lm, _ = _pair("llama")
    batch = prompts()
    free = explain_generation(lm, batch, method="grad_x_input", max_new_tokens=5, generation={"eos_token_id": None})
    stop = int(free.generated[1, 1])
    ended = explain_generation(lm, batch, method="grad_x_input", max_new_tokens=5, generation={"eos_token_id": stop})
    for row in range(3):
        length = int(ended.generated_mask[row].sum())
        tokens = free.generated[row].tolist()
        assert length == (tokens.index(stop) + 1 if stop in tokens[:5] else 5)
        assert (ended.scores[row, length:] == 0).all() and (ended.probabilities[row, length:] == 0).all()
        assert (ended.values[row, length:] == 0).all()
    picked = explain_generation(lm, batch, method="grad_x_input", continuation=free.generated, steps=[0, -1])
    last = free.generated.shape[1] - 1
    assert picked.steps == (0, last)
    assert torch.allclose(picked.scores[:, [0, last]], free.scores[:, [0, last]], atol=1e-10, rtol=0)
    assert (picked.scores[:, 1:last] == 0).all()


def test_sum_is_the_summed_log_probability_and_spans_sum_their_steps() -> None:
    lm, twin = _pair("qwen2")
    batch = prompts()
    made = explain_generation(lm, batch, method="grad_x_input", max_new_tokens=NEW, generation={"eos_token_id": None})
    tokens = made.generated
    summed = explain_generation(lm, batch, method="grad_x_input", continuation=tokens, steps="sum")
    assert summed.summed and summed.scores.shape == (3, 1, made.sequences.shape[1])
    assert torch.allclose(summed.values[:, 0], made.probabilities.log().sum(dim=1), atol=1e-6)
    one_by_one: Any = sum(
        explain_generation(lm, batch, method="grad_x_input", continuation=tokens, steps=StepSum(t, t + 1)).scores
        for t in range(NEW)
    )
    _close(summed.scores, one_by_one, "sum", "qwen2")
    span = explain_generation(lm, batch, method="attnlrp", continuation=tokens, steps=StepSum(1, 3))
    assert torch.allclose(span.values[:, 0], made.probabilities[:, 1:3].log().sum(dim=1), atol=1e-6)
    # one step's log-probability = the classifier path on the log-softmax: logit gradient minus the expected one
    step = explain_generation(lm, batch, method="grad_x_input", continuation=tokens, steps=StepSum(2, 3))
    for row in range(1):
        context = _context(made, row, 2)
        probabilities = explain(twin, {"input_ids": context[None]}, method="grad_x_input", target=0).probabilities[0]
        expected = -sum(
            float(probabilities[label])
            * explain(twin, {"input_ids": context[None]}, method="grad_x_input", target=label).scores[0]
            for label in range(probabilities.shape[0])
        )
        token = int(tokens[row, 2])
        expected = expected + explain(twin, {"input_ids": context[None]}, method="grad_x_input", target=token).scores[0]
        _close(step.context_scores(row, 0), expected, row, "qwen2")


def test_contrast_explains_the_token_minus_its_foil() -> None:
    lm, twin = _pair("gpt2")
    batch = prompts()
    made = explain_generation(lm, batch, method="grad_x_input", max_new_tokens=3, generation={"eos_token_id": None})
    foils = [7, 8, 9]
    contrasted = explain_generation(lm, batch, method="grad_x_input", continuation=made.generated, contrast=foils)
    assert contrasted.contrast is not None and contrasted.contrast[0].tolist() == foils
    for row in range(3):
        for step in range(3):
            context = _context(made, row, step)
            token = explain(
                twin, {"input_ids": context[None]}, method="grad_x_input", target=int(made.generated[row, step])
            )
            foil = explain(twin, {"input_ids": context[None]}, method="grad_x_input", target=foils[step])
            _close(contrasted.context_scores(row, step), token.scores[0] - foil.scores[0], (row, step), "gpt2")
            difference = token.logits[0, int(made.generated[row, step])] - token.logits[0, foils[step]]
            assert math.isclose(float(contrasted.values[row, step]), float(difference), rel_tol=1e-9, abs_tol=1e-9)
    one_for_all = explain_generation(lm, batch, method="grad_x_input", continuation=made.generated, contrast=7)
    assert one_for_all.contrast is not None and bool((one_for_all.contrast == 7).all())
    with pytest.raises(InvalidTargetError, match="vocabulary"):
        explain_generation(lm, batch, method="grad_x_input", continuation=made.generated, contrast=60)
    with pytest.raises(InvalidTargetError, match="one per step"):
        explain_generation(lm, batch, method="grad_x_input", continuation=made.generated, contrast=[1, 2])


def test_a_capped_gemma_explains_its_capped_logits() -> None:
    """Gemma 2 caps its LM logits (``c·tanh(z/c)``): a step explains the capped logit, so its gradient × input is
    the uncapped classifier's times the cap's derivative ``1 - tanh²(z/c)``."""
    capped = build_causal("gemma2", softcap=True)
    twin = classifier_twin(capped)
    cap = float(capped.config.final_logit_softcapping)
    result = explain_generation(capped, prompts(), method="grad_x_input", max_new_tokens=2)
    for row in range(3):
        context = _context(result, row, 1)
        token = int(result.generated[row, 1])
        plain = explain(twin, {"input_ids": context[None]}, method="grad_x_input", target=token)
        logit = plain.logits[0, token]
        assert math.isclose(float(result.values[row, 1]), cap * float(torch.tanh(logit / cap)), rel_tol=1e-6)
        _close(result.context_scores(row, 1), plain.scores[0] * (1 - torch.tanh(logit / cap) ** 2), row, "gemma2")


def test_refusals_name_the_problem() -> None:
    lm, _ = _pair("mistral")
    batch = prompts()
    with pytest.raises(UnknownMethodError, match="valid methods"):
        explain_generation(lm, batch, method="saliency", max_new_tokens=2)
    with pytest.raises(InvalidTargetError, match="out of range"):
        explain_generation(lm, batch, method="rollout", max_new_tokens=2, steps=[2])
    with pytest.raises(InvalidTargetError, match="'sum'"):
        explain_generation(lm, batch, method="rollout", max_new_tokens=2, steps="all")
    with pytest.raises(InvalidTargetError, match="start < stop"):
        explain_generation(lm, batch, method="rollout", max_new_tokens=2, steps=StepSum(1, 1))
    classifier = next(variant for variant in VARIANTS if variant.name == "mistral").build()
    with pytest.raises(UnsupportedModelError):
        explain_generation(classifier, batch, method="rollout", max_new_tokens=2)
