"""The multi-target core (:mod:`explainers.tasks.targets`): one forward, many targets, batched vector-Jacobian products.

The reference for a causal LM is the classifier path itself: a target at position ``p`` with token ``y`` must get
exactly the scores :func:`explainers.explain` gives for the context up to ``p`` alone, on the family's sequence
classifier whose head is the LM head (the LM read as a classifier over the vocabulary), target ``y`` — for every
method, on every decoder family, from a left-padded batch, in float64. For token classifiers the references are
plain autograd (gradient × input of the span's summed logit) and the rows of the attention maps.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
import transformers

from explainers import (
    FAMILIES,
    InvalidTargetError,
    UnsupportedMethodError,
    UnsupportedModelError,
    available_methods,
    describe,
    explain,
    explain_batch,
)
from explainers.architectures.support import refusal
from explainers.tasks.targets import Targets, explain_targets

from .arch_zoo import FLOAT32_SOFTMAX, PAD, TOKEN_LEVEL_FAMILIES, VOCAB, build_token_level, text_batch

LM_FAMILIES = TOKEN_LEVEL_FAMILIES["causal_lm"]
TOKEN_FAMILIES = TOKEN_LEVEL_FAMILIES["token_classification"]
#: The methods the decoder families accept for causal LMs (the LRP methods are refused there: test_refusals).
LM_METHODS = [method for method in available_methods() if refusal("llama", method, "causal_lm") is None]
#: SmoothGrad without noise here: its noise and scale belong to the whole row, so a step's noisy scores are not the
#: classifier path's on the context alone (tests/test_new_methods.py checks the noisy ones).
FAST: dict[str, dict[str, Any]] = {
    "integrated_gradients": {"n_steps": 3},
    "smoothgrad": {"n_samples": 3, "stdev": 0.0},
}
LENGTHS = (7, 3, 9, 5)


def _tolerance(model_type: str) -> float:
    """Worst difference allowed, relative to the largest score: float32 rounding where the softmax is float32
    (:data:`tests.arch_zoo.FLOAT32_SOFTMAX`: a row's softmax sums a different number of masked terms in the padded
    batch than in the context alone), float64 rounding elsewhere."""
    return 1e-5 if model_type in FLOAT32_SOFTMAX else 1e-10


@functools.cache
def _lm(model_type: str) -> Any:
    model = build_token_level(model_type, "causal_lm")
    if hasattr(model.config, "final_logit_softcapping"):
        # The sequence classifier of the oracle has no final soft-capping; the LM's objective must be the same logit.
        model.config.final_logit_softcapping = None
    return model


@functools.cache
def _lm_as_classifier(model_type: str) -> Any:
    """The family's sequence classifier with the LM's weights and its LM head as the score head (vocabulary labels)."""
    lm = _lm(model_type)
    config = lm.config.__class__.from_dict(lm.config.to_dict())
    config.num_labels = VOCAB
    config.pad_token_id = PAD
    config._attn_implementation = "eager"
    classifier = getattr(transformers, FAMILIES[model_type].classes[0])(config).double().eval()
    state = {("score.weight" if key == "lm_head.weight" else key): value for key, value in lm.state_dict().items()}
    classifier.load_state_dict(state, strict=True)
    return classifier


def _lm_targets(batch: dict[str, torch.Tensor], rounds: int = 3, seed: int = 0) -> Targets:
    """Per row its last ``rounds`` real positions (fewer for a short row: the later rounds inactive), a random token
    to explain at each."""
    generator = torch.Generator().manual_seed(seed)
    mask = batch["attention_mask"]
    width = mask.shape[1]
    positions = torch.zeros((rounds, mask.shape[0]), dtype=torch.long)
    active = torch.zeros_like(positions, dtype=torch.bool)
    for row in range(mask.shape[0]):
        real = int(mask[row].sum())
        for k in range(min(rounds, real)):
            positions[k, row] = width - 1 - k  # left padding: the real tokens end the row
            active[k, row] = True
    labels = torch.randint(3, VOCAB, positions.shape, generator=generator)
    return Targets.at_positions(positions, labels, active, mask, causal=True)


def _max_abs(tensor: torch.Tensor) -> float:
    return float(tensor.abs().max()) if tensor.numel() else 0.0


@pytest.mark.parametrize("model_type", LM_FAMILIES)
@pytest.mark.parametrize("method", LM_METHODS)
def test_lm_target_equals_the_classifier_path_on_the_context_alone(model_type: str, method: str) -> None:
    lm, classifier = _lm(model_type), _lm_as_classifier(model_type)
    batch = text_batch(lm, LENGTHS, side="left")
    targets = _lm_targets(batch)
    result = explain_targets(lm, batch, targets, method=method, **FAST.get(method, {}))
    width = batch["input_ids"].shape[1]
    assert result.scores.shape == (targets.rounds, len(LENGTHS), width)
    for k in range(targets.rounds):
        for row in range(len(LENGTHS)):
            if not bool(targets.active[k, row]):
                assert bool((result.scores[k, row] == 0).all())
                assert float(result.values[k, row]) == 0.0
                continue
            position = int(targets.positions[k, row, 0])
            real = batch["attention_mask"][row].bool()
            context = batch["input_ids"][row][real][: int(real[: position + 1].sum())]
            label = int(targets.labels[k, row, 0])
            alone = explain(
                classifier,
                {"input_ids": context.view(1, -1), "attention_mask": torch.ones(1, context.numel(), dtype=torch.long)},
                method=method,
                target=label,
                **FAST.get(method, {}),
            )
            first = width - int(real.sum())
            ours = result.scores[k, row]
            expected = torch.zeros(width, dtype=ours.dtype)
            expected[first : position + 1] = alone.scores[0].to(ours.dtype)
            scale = max(_max_abs(expected), 1e-300)
            assert _max_abs(ours - expected) <= _tolerance(model_type) * scale, (k, row, ours, expected)
            logit = float(alone.logits[0, label])
            assert float(result.values[k, row]) == pytest.approx(logit, abs=10 * _tolerance(model_type) * max(1, logit))


@pytest.mark.parametrize("model_type", ["gpt2", "llama"])
@pytest.mark.parametrize("method", ["grad_x_input", "gae", "rollout"])
def test_lm_batched_equals_each_row_alone_and_right_padding(model_type: str, method: str) -> None:
    lm = _lm(model_type)
    tolerance = _tolerance(model_type)
    left = text_batch(lm, LENGTHS, side="left")
    targets = _lm_targets(left)
    together = explain_targets(lm, left, targets, method=method)
    right = text_batch(lm, LENGTHS, side="right")
    width = left["input_ids"].shape[1]
    for row, length in enumerate(LENGTHS):
        keep = left["attention_mask"][row].bool()
        alone_batch = {key: value[row : row + 1][:, keep] for key, value in left.items()}
        shift = width - length
        positions = (targets.positions[:, row : row + 1, 0] - shift).clamp(min=0)
        alone_targets = Targets.at_positions(
            positions,
            targets.labels[:, row : row + 1, 0],
            targets.active[:, row : row + 1],
            alone_batch["attention_mask"],
            causal=True,
        )
        alone = explain_targets(lm, alone_batch, alone_targets, method=method)
        scale = _max_abs(alone.scores)
        torch.testing.assert_close(together.scores[:, row, shift:], alone.scores[:, 0], rtol=0, atol=tolerance * scale)
        # The same row right-padded: its real tokens first.
        right_targets = Targets.at_positions(
            positions,
            alone_targets.labels[..., 0],
            alone_targets.active,
            right["attention_mask"][row : row + 1],
            causal=True,
        )
        one_right = {key: value[row : row + 1] for key, value in right.items()}
        padded = explain_targets(lm, one_right, right_targets, method=method)
        torch.testing.assert_close(padded.scores[:, 0, :length], alone.scores[:, 0], rtol=0, atol=tolerance * scale)
        assert bool((padded.scores[:, 0, length:] == 0).all())


@pytest.mark.parametrize("method", ["grad_x_input", "attnlrp", "gae", "integrated_gradients"])
def test_chunks_of_rounds_give_the_same_scores(method: str) -> None:
    lm = _lm("qwen2")
    batch = text_batch(lm, LENGTHS, side="left")
    targets = _lm_targets(batch, rounds=5)
    whole = explain_targets(lm, batch, targets, method=method, **FAST.get(method, {}))
    one_by_one = explain_targets(lm, batch, targets, method=method, chunk_bytes=1, **FAST.get(method, {}))
    torch.testing.assert_close(whole.scores, one_by_one.scores, rtol=0, atol=1e-12)


def test_contrast_and_log_probabilities() -> None:
    lm = _lm("gpt2")
    batch = text_batch(lm, LENGTHS, side="left")
    plain = _lm_targets(batch, seed=1)
    foils = _lm_targets(batch, seed=2).labels[..., 0]
    positions, labels = plain.positions[..., 0], plain.labels[..., 0]
    contrast = Targets.at_positions(positions, labels, plain.active, batch["attention_mask"], causal=True, foils=foils)
    foil_only = Targets.at_positions(positions, foils, plain.active, batch["attention_mask"], causal=True)
    chosen = explain_targets(lm, batch, plain, method="grad_x_input")
    against = explain_targets(lm, batch, foil_only, method="grad_x_input")
    both = explain_targets(lm, batch, contrast, method="grad_x_input")
    # Gradient × input is linear in the objective: the contrast's scores are the difference of the two.
    torch.testing.assert_close(both.scores, chosen.scores - against.scores, rtol=0, atol=1e-10)
    torch.testing.assert_close(both.values, chosen.values - against.values, rtol=0, atol=1e-12)
    logged = Targets.at_positions(
        positions, labels, plain.active, batch["attention_mask"], causal=True, log_probabilities=True
    )
    result = explain_targets(lm, batch, logged, method="grad_x_input")
    with torch.no_grad():
        log_probs = lm(**batch, position_ids=(batch["attention_mask"].cumsum(-1) - 1).clamp(min=0)).logits
        log_probs = log_probs.log_softmax(-1)
    for k in range(plain.rounds):
        for row in range(len(LENGTHS)):
            if bool(plain.active[k, row]):
                expected = log_probs[row, positions[k, row], labels[k, row]]
                assert float(result.values[k, row]) == pytest.approx(float(expected), abs=1e-12)


def test_gemma2_soft_capped_logits_are_the_objective() -> None:
    lm = build_token_level("gemma2", "causal_lm")
    assert lm.config.final_logit_softcapping is not None
    batch = text_batch(lm, LENGTHS, side="right")
    real = batch["attention_mask"].bool()
    positions = (real.sum(dim=1) - 1).view(1, -1)
    targets = Targets.at_positions(
        positions, torch.full_like(positions, 5), real[:, :1].T, batch["attention_mask"], causal=True
    )
    result = explain_targets(lm, batch, targets, method="grad_x_input")
    for row, length in enumerate(LENGTHS):
        with torch.no_grad():  # each row alone: a plain float64 forward of a padded batch gives NaN (attention_capture)
            logits = lm(input_ids=batch["input_ids"][row : row + 1, :length]).logits[0]
        cap = lm.config.final_logit_softcapping
        torch.testing.assert_close(result.logits[row, :length], logits, rtol=0, atol=_tolerance("gemma2") * cap)
        assert float(logits.abs().max()) < cap
        assert float(result.values[0, row]) == pytest.approx(float(logits[length - 1, 5]), abs=1e-5 * cap)


def _spans(batch: dict[str, torch.Tensor]) -> list[list[tuple[int, int, int]]]:
    """Spans that touch, overlap one token and cover the whole row, per row (right padding)."""
    spans = []
    for length in batch["attention_mask"].sum(dim=1).tolist():
        row = [(1, 2, 1), (2, min(4, length), 2)]
        if length >= 6:
            row += [(3, 6, 0), (0, length, 1)]
        spans.append(row)
    return spans


@functools.cache
def _token_model(model_type: str) -> Any:
    return build_token_level(model_type, "token_classification")


@pytest.mark.parametrize("model_type", TOKEN_FAMILIES)
def test_token_spans_grad_x_input_equals_autograd(model_type: str) -> None:
    model = _token_model(model_type)
    batch = text_batch(model, LENGTHS)
    spans = _spans(batch)
    result = explain_targets(model, batch, Targets.over_spans(spans, batch["attention_mask"]), method="grad_x_input")
    embeddings = model.get_input_embeddings()
    for row, row_spans in enumerate(spans):
        length = LENGTHS[row]
        ids = batch["input_ids"][row : row + 1, :length]
        for k, (start, end, label) in enumerate(row_spans):
            leaf = embeddings(ids).detach().requires_grad_(True)
            handle = embeddings.register_forward_hook(lambda module, args, output, leaf=leaf: leaf)
            try:
                logits = model(input_ids=ids).logits
            finally:
                handle.remove()
            (gradient,) = torch.autograd.grad(logits[0, start:end, label].sum(), leaf)
            expected = (gradient * leaf.detach()).sum(-1)[0]
            tolerance = _tolerance(model_type)
            scale = _max_abs(expected)
            torch.testing.assert_close(result.scores[k, row, :length], expected, rtol=0, atol=tolerance * scale)
            assert bool((result.scores[k, row, length:] == 0).all())
            value = float(logits[0, start:end, label].detach().sum())
            assert float(result.values[k, row]) == pytest.approx(value, abs=10 * tolerance * max(1.0, abs(value)))
        assert bool((result.scores[len(row_spans) :, row] == 0).all())


@pytest.mark.parametrize("model_type", ["bert", "modernbert", "deberta-v2"])
@pytest.mark.parametrize("method", ["attention", "rollout"])
def test_token_span_map_rows_are_the_mean_of_the_span_rows(model_type: str, method: str) -> None:
    from explainers import capturing_attention
    from explainers.rules.maps import rollout_matrix

    model = _token_model(model_type)
    batch = text_batch(model, LENGTHS)
    spans = _spans(batch)
    result = explain_targets(model, batch, Targets.over_spans(spans, batch["attention_mask"]), method=method)
    with torch.no_grad(), capturing_attention(model, keep="mean") as recorded:
        model(**batch)
    maps = recorded.probabilities
    matrix = maps[-1] if method == "attention" else rollout_matrix(maps)
    mask = batch["attention_mask"]
    for row, row_spans in enumerate(spans):
        for k, (start, end, _) in enumerate(row_spans):
            expected = matrix[row, start:end].mean(dim=0) * mask[row]
            torch.testing.assert_close(result.scores[k, row], expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("method", ["attention", "gae", "attnlrp", "integrated_gradients"])
def test_token_each_span_alone_and_each_row_alone(method: str) -> None:
    model = _token_model("roberta")
    batch = text_batch(model, LENGTHS)
    spans = _spans(batch)
    options = FAST.get(method, {})
    together = explain_targets(
        model, batch, Targets.over_spans(spans, batch["attention_mask"]), method=method, **options
    )
    for row, row_spans in enumerate(spans):
        length = LENGTHS[row]
        alone_batch = {key: value[row : row + 1, :length] for key, value in batch.items()}
        for k, span in enumerate(row_spans):
            single = explain_targets(
                model,
                alone_batch,
                Targets.over_spans([[span]], alone_batch["attention_mask"]),
                method=method,
                **options,
            )
            torch.testing.assert_close(together.scores[k, row, :length], single.scores[0, 0], rtol=0, atol=1e-10)


def test_targets_from_the_predictions_of_the_same_forward() -> None:
    model = _token_model("bert")
    batch = text_batch(model, LENGTHS)
    seen: list[torch.Tensor] = []

    def predicted(logits: torch.Tensor) -> Targets:
        seen.append(logits)
        labels = logits.argmax(-1)
        spans = [[(1, 2, int(labels[row, 1]))] for row in range(logits.shape[0])]
        return Targets.over_spans(spans, batch["attention_mask"])

    result = explain_targets(model, batch, predicted, method="grad_x_input")
    assert len(seen) == 1
    torch.testing.assert_close(result.logits, seen[0], rtol=0, atol=0)
    assert result.targets.labels[0, :, 0].tolist() == seen[0].argmax(-1)[:, 1].tolist()


def test_model_left_as_found_and_sdpa_restored() -> None:
    model = build_token_level("llama", "causal_lm")
    model.config._attn_implementation = "sdpa"
    model.train()
    weights = {name: value.clone() for name, value in model.state_dict().items()}
    batch = text_batch(model, LENGTHS, side="left")
    for method in LM_METHODS:
        explain_targets(model, batch, _lm_targets(batch), method=method, **FAST.get(method, {}))
    assert model.config._attn_implementation == "sdpa"
    assert all(module.training for module in model.modules())
    assert all(parameter.grad is None for parameter in model.parameters())
    assert all(torch.equal(value, weights[name]) for name, value in model.state_dict().items())
    assert sum(len(module._forward_hooks) + len(module._forward_pre_hooks) for module in model.modules()) == 0


def test_refusals() -> None:
    lm = _lm("llama")
    batch = text_batch(lm, LENGTHS, side="left")
    targets = _lm_targets(batch)
    with pytest.raises(UnsupportedMethodError, match="relevance"):
        explain_targets(lm, batch, targets, method="relevance")
    token_model = _token_model("bert")
    token_batch = text_batch(token_model, LENGTHS)
    # relevance works on BERT-family token classifiers (tests/test_token_classification.py); DeBERTa's is refused.
    deberta = _token_model("deberta-v2")
    deberta_batch = text_batch(deberta, LENGTHS)
    with pytest.raises(UnsupportedMethodError, match="'deberta-v2' token classifiers"):
        explain_targets(
            deberta,
            deberta_batch,
            Targets.over_spans(_spans(deberta_batch), deberta_batch["attention_mask"]),
            method="relevance",
        )
    with pytest.raises(UnsupportedModelError, match="explain_generation"):
        explain(lm, batch, method="attention")
    with pytest.raises(UnsupportedModelError, match="explain_tokens"):
        explain_batch(token_model, token_batch, [])
    with pytest.raises(UnsupportedModelError, match="is a sequence classifier"):
        explain_targets(_lm_as_classifier("llama"), batch, targets, method="attention")
    bad = Targets.at_positions(
        targets.positions[..., 0],
        torch.full_like(targets.labels[..., 0], VOCAB),
        targets.active,
        batch["attention_mask"],
        causal=True,
    )
    with pytest.raises(InvalidTargetError, match="classes must be in"):
        explain_targets(lm, batch, bad, method="attention")
    padding = Targets.at_positions(
        torch.zeros_like(targets.positions[..., 0]),
        targets.labels[..., 0],
        targets.active,
        batch["attention_mask"],
        causal=True,
    )
    with pytest.raises(InvalidTargetError, match="padding"):
        explain_targets(lm, batch, padding, method="attention")
    with pytest.raises(InvalidTargetError, match="real tokens"):
        Targets.over_spans([[(0, 9, 0)]] * len(LENGTHS), token_batch["attention_mask"])


def test_describe_names_the_task() -> None:
    assert describe(_lm("gpt2")).task == "causal_lm"
    assert describe(_token_model("albert")).task == "token_classification"
    assert describe(_lm_as_classifier("gpt2")).task == "sequence_classification"
    assert describe(_lm("gpt2")).pooled == "each"
