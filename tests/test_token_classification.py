"""explain_tokens on tiny token classifiers of every encoder family: spans grouped from the predictions by the label
scheme, batched == each row alone == each span alone, grad_x_input equal to plain autograd on the span's summed
logit, attention/rollout rows equal to the rows of the maps, Chefer et al.'s relevance seeded at the span's tokens
against an independent oracle and conserved, the model left as found, and the refusals."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor

from explainers import (
    InvalidInputError,
    InvalidTargetError,
    UnsupportedMethodError,
    UnsupportedModelError,
    available_methods,
    describe,
    explain_tokens,
    predict_tokens,
)
from explainers.architectures.support import refusal
from explainers.capture import ACTIVATIONS, ATTENTION_GRADIENTS, ATTENTIONS, forward_pass, prepared_model
from explainers.methods.lrp_pass import block_weights as _block_weights
from explainers.rules.lrp import block_relprop, token_head_relprop
from explainers.tasks.tagging import group_spans, label_scheme, span_tags

from .arch_zoo import TOKEN_LEVEL_FAMILIES, alone_tolerance, build_token_level, text_batch
from .test_relevance import _PATHS, _layer_names, _linear, _oracle_blocks, _oracle_rollout, _Tape

BIO = ("O", "B-PER", "I-PER", "B-LOC", "I-LOC")
IO = ("O", "I-PER", "I-LOC")
FAMILIES = TOKEN_LEVEL_FAMILIES["token_classification"]
LRP_FAMILIES = tuple(family for family in FAMILIES if refusal(family, "relevance", "token_classification") is None)
METHODS = tuple(available_methods())
#: batched == alone: every family with a map method, a gradient-of-maps method, a modified gradient and LRP; BERT with
#: every method (the other families' methods share the same code, checked by tests/test_targets.py).
ALONE_CASES = [(family, method) for family in FAMILIES for method in ("rollout", "gae", "attnlrp", "relevance")] + [
    ("bert", method) for method in METHODS if method not in ("rollout", "gae", "attnlrp", "relevance")
]
#: Token spans of each row of the batch (real lengths 7, 3, 9, 5): touching pairs, a span at the last real token.
SPANS = [
    [(1, 3, 1), (3, 4, 3), (5, 6, 2)],
    [(1, 2, 3)],
    [(0, 1, 1), (1, 2, 1), (2, 5, 3), (8, 9, 4)],
    [(2, 4, 1), (4, 5, 3)],
]


def token_model(model_type: str, labels: tuple[str, ...] = BIO, seed: int = 0) -> Any:
    """A tiny float64 token classifier of ``model_type`` with ``labels`` as its id2label; the ``O`` logit's bias is
    lowered by 1 so that the random model predicts entities (and ``O`` too)."""
    model = build_token_level(model_type, "token_classification", seed=seed, num_labels=len(labels))
    model.config.id2label = dict(enumerate(labels))
    model.config.label2id = {label: index for index, label in enumerate(labels)}
    if "O" in labels:
        with torch.no_grad():
            model.classifier.bias[labels.index("O")] -= 1.0
    return model


def batch_of(model: Any) -> dict[str, Tensor]:
    """The padded batch with its special tokens marked (each row's first and last real token)."""
    batch = text_batch(model)
    special = torch.zeros_like(batch["input_ids"])
    lengths = batch["attention_mask"].sum(dim=1)
    for row, length in enumerate(lengths.tolist()):
        special[row, 0] = special[row, length - 1] = 1
    special[batch["attention_mask"] == 0] = 1
    return {**batch, "special_tokens_mask": special}


def row_alone(batch: dict[str, Tensor], row: int) -> dict[str, Tensor]:
    keep = batch["attention_mask"][row].bool()
    return {key: value[row : row + 1][:, keep] for key, value in batch.items()}


def options_of(method: str) -> dict[str, Any]:
    return {"n_steps": 6} if method == "integrated_gradients" else {}


def applies(model_type: str, method: str) -> bool:
    return refusal(model_type, method, "token_classification") is None


@pytest.mark.parametrize("labels", [BIO, IO], ids=["BIO", "IO"])
@pytest.mark.parametrize("model_type", FAMILIES)
def test_spans_are_the_predictions_grouped_by_the_scheme(model_type: str, labels: tuple[str, ...]) -> None:
    model = token_model(model_type, labels)
    batch = batch_of(model)
    result = predict_tokens(model, batch)
    scheme = label_scheme(labels)
    assert result.scheme == scheme.name and result.entities and result.labels == labels
    eligible = (batch["attention_mask"] == 1) & (batch["special_tokens_mask"] == 0)
    for row in range(eligible.shape[0]):
        # The plain model alone on the row (transformers' eager ModernBERT gives NaN to padded rows of a plain
        # forward, which the explainers' capture attention avoids), compared with the row's real tokens.
        alone = {key: value for key, value in row_alone(batch, row).items() if key != "special_tokens_mask"}
        with torch.inference_mode():
            plain = model(**alone).logits[0]
        length = plain.shape[0]
        tolerance = alone_tolerance(model_type) * float(plain.abs().max())
        torch.testing.assert_close(result.logits[row, :length], plain, atol=tolerance, rtol=0)
        expected = group_spans(plain.argmax(-1).tolist(), scheme, eligible[row, :length].tolist())
        assert result.spans[row] == expected
        probabilities = plain.softmax(-1)
        for span, score in zip(expected, result.span_scores[row], strict=True):
            tags = span_tags(span, scheme)
            mean = probabilities[torch.arange(span[0], span[1]), torch.tensor(tags)].mean()
            assert score == pytest.approx(float(mean), rel=1e-6)
    assert any(result.spans), "the tiny model predicts no entity at all: the test would check nothing"


def test_no_scheme_is_token_by_token_and_entities_false_explains_every_token() -> None:
    tags = ("NOUN", "VERB", "DET")
    model = token_model("bert", tags)
    batch = batch_of(model)
    result = explain_tokens(model, batch, method="grad_x_input")
    assert result.scheme == "none"
    eligible = ((batch["attention_mask"] == 1) & (batch["special_tokens_mask"] == 0)).sum(dim=1).tolist()
    assert [len(row) for row in result.spans] == eligible
    assert all(end == start + 1 for row in result.spans for start, end, _ in row)
    bio = token_model("bert", BIO)
    every = explain_tokens(bio, batch_of(bio), method="attention", entities=False)
    assert [len(row) for row in every.spans] == eligible and not every.entities
    predicted = every.logits.argmax(-1)
    assert all(
        label == int(predicted[row, start]) for row, spans in enumerate(every.spans) for start, _, label in spans
    )


@pytest.mark.parametrize(("model_type", "method"), ALONE_CASES)
def test_batched_equals_each_row_alone_and_each_span_alone(model_type: str, method: str) -> None:
    if not applies(model_type, method):
        pytest.skip(f"{method} is refused on {model_type} (test_refusals checks the refusal)")
    model = token_model(model_type)
    batch = batch_of(model)
    options = options_of(method)
    batched = explain_tokens(model, batch, method=method, positions=SPANS, **options)
    assert batched.spans == SPANS and not batched.entities
    scale = float(batched.scores.abs().max())
    tolerance = alone_tolerance(model_type, gradients=method not in ("attention", "rollout")) * scale
    padding = batch["attention_mask"] == 0
    assert (batched.scores.transpose(0, 1)[:, padding] == 0).all()
    for row, spans in enumerate(SPANS):
        assert (batched.scores[row, len(spans) :] == 0).all() and (batched.values[row, len(spans) :] == 0).all()
        alone = explain_tokens(model, row_alone(batch, row), method=method, positions=[spans], **options)
        length = int(batch["attention_mask"][row].sum())
        torch.testing.assert_close(alone.scores[0], batched.scores[row, : len(spans), :length], atol=tolerance, rtol=0)
        if row == 2:
            for number, span in enumerate(spans):
                single = explain_tokens(model, batch, method=method, positions=[[], [], [span], []], **options)
                torch.testing.assert_close(single.scores[2, 0], batched.scores[2, number], atol=tolerance, rtol=0)


def _embedding_leaf(model: Any) -> tuple[list[Tensor], Any]:
    kept: list[Tensor] = []

    def hook(module: Any, args: Any, output: Tensor) -> Tensor:
        leaf = output.detach().requires_grad_(True)
        kept.append(leaf)
        return leaf

    return kept, model.get_input_embeddings().register_forward_hook(hook)


@pytest.mark.parametrize("model_type", FAMILIES)
def test_grad_x_input_is_plain_autograd_on_the_spans_summed_logit(model_type: str) -> None:
    model = token_model(model_type)
    batch = batch_of(model)
    result = explain_tokens(model, batch, method="grad_x_input", positions=SPANS)
    scheme = label_scheme(BIO)
    for row, spans in enumerate(SPANS):
        # Each row alone through the plain model (transformers' eager ModernBERT gives NaN to padded rows).
        inputs = {key: value for key, value in row_alone(batch, row).items() if key != "special_tokens_mask"}
        length = inputs["input_ids"].shape[1]
        for number, span in enumerate(spans):
            kept, handle = _embedding_leaf(model)
            try:
                logits = model(**inputs).logits
            finally:
                handle.remove()
            positions = range(span[0], span[1])
            objective = sum(logits[0, p, tag] for p, tag in zip(positions, span_tags(span, scheme), strict=True))
            assert isinstance(objective, Tensor)
            (gradient,) = torch.autograd.grad(objective, kept)
            expected = (gradient * kept[0]).sum(-1)[0].detach()
            tolerance = alone_tolerance(model_type, gradients=True) * float(expected.abs().max())
            torch.testing.assert_close(result.scores[row, number, :length], expected, atol=tolerance, rtol=0)
            assert (result.scores[row, number, length:] == 0).all()
            scale = float(logits.detach().abs().max()) * (span[1] - span[0])
            value = pytest.approx(float(objective.detach()), abs=alone_tolerance(model_type) * scale)
            assert float(result.values[row, number]) == value


@pytest.mark.parametrize("model_type", FAMILIES)
def test_attention_and_rollout_rows_are_the_rows_of_the_maps(model_type: str) -> None:
    model = token_model(model_type)
    batch = batch_of(model)
    attention = explain_tokens(model, batch, method="attention", positions=SPANS)
    rolled = explain_tokens(model, batch, method="rollout", positions=SPANS)
    for row, spans in enumerate(SPANS):
        # The maps of the plain model on the row alone (transformers' eager ModernBERT gives NaN to padded rows).
        inputs = {key: value for key, value in row_alone(batch, row).items() if key != "special_tokens_mask"}
        length = inputs["input_ids"].shape[1]
        with torch.inference_mode():
            attentions = model(**inputs, output_attentions=True).attentions
        means = [map_[0].mean(dim=0) for map_ in attentions]
        eye = torch.eye(length, dtype=torch.float64)
        rollout = eye
        for mean in means:
            augmented = 0.5 * (mean + eye)
            rollout = (augmented / augmented.sum(-1, keepdim=True)) @ rollout
        tolerance = alone_tolerance(model_type)
        for number, (start, end, _) in enumerate(spans):
            torch.testing.assert_close(
                attention.scores[row, number, :length], means[-1][start:end].mean(0), atol=tolerance, rtol=0
            )
            torch.testing.assert_close(
                rolled.scores[row, number, :length], rollout[start:end].mean(0), atol=tolerance, rtol=0
            )
            assert (attention.scores[row, number, length:] == 0).all() and (
                rolled.scores[row, number, length:] == 0
            ).all()


def _state(model: Any) -> tuple[Any, ...]:
    parameters = [
        (name, parameter.detach().clone(), parameter.requires_grad) for name, parameter in model.named_parameters()
    ]
    hooks = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks) for m in model.modules())
    return parameters, [module.training for module in model.modules()], hooks, model.config._attn_implementation


@pytest.mark.parametrize("method", METHODS)
def test_model_left_as_found(method: str) -> None:
    model = token_model("bert")
    model.train()
    model.bert.embeddings.requires_grad_(False)
    model.config._attn_implementation = "sdpa"
    before = _state(model)
    explain_tokens(model, batch_of(model), method=method, **options_of(method))
    after = _state(model)
    assert all(
        name == other and torch.equal(value, other_value) and flag == other_flag
        for (name, value, flag), (other, other_value, other_flag) in zip(before[0], after[0], strict=True)
    )
    assert before[1:] == after[1:]
    assert all(parameter.grad is None for parameter in model.parameters())


def test_refusals_and_bad_positions() -> None:
    model = token_model("bert")
    batch = batch_of(model)
    for model_type in FAMILIES:
        if not applies(model_type, "relevance"):
            with pytest.raises(UnsupportedMethodError, match=model_type):
                explain_tokens(token_model(model_type), batch_of(token_model(model_type)), method="relevance")
    from .arch_zoo import VARIANTS

    classifier = next(variant for variant in VARIANTS if variant.name == "bert").build()
    with pytest.raises(UnsupportedModelError, match=r"explainers\.explain"):
        explain_tokens(classifier, text_batch(classifier), method="attention")
    bad = {
        "one list of": [[(1, 2, 1)]],
        "non-empty range": [[(3, 3, 1)], [], [], []],
        "real tokens": [[], [(2, 4, 1)], [], []],  # row 1 has 3 real tokens
        "label 9": [[(1, 2, 9)], [], [], []],
        "of ints": [[(1, 2)], [], [], []],
    }
    for message, positions in bad.items():
        with pytest.raises(InvalidTargetError, match=message):
            explain_tokens(model, batch, method="attention", positions=positions)
    with pytest.raises(InvalidInputError, match="special_tokens_mask"):
        explain_tokens(model, {**batch, "special_tokens_mask": batch["special_tokens_mask"][:, :3]}, method="attention")


# ------------------------------------------------------------------------------------------------------ relevance


def _token_layers(model: Any) -> list[Any]:
    """The encoder layers in call order, found independently of explainers/architectures/blocks.py."""
    model_type = model.config.model_type
    if model_type == "albert":
        groups = model.albert.encoder.albert_layer_groups
        count, group_count = model.config.num_hidden_layers, model.config.num_hidden_groups
        return [layer for i in range(count) for layer in groups[i * group_count // count].albert_layers]
    if model_type == "distilbert":
        return list(model.distilbert.transformer.layer)
    return list(getattr(model, {"xlm-roberta": "roberta"}.get(model_type, model_type)).encoder.layer)


def _token_oracle(model: Any, inputs: dict[str, Tensor], span: tuple[int, int, int], start_layer: int = 0) -> Tensor:
    """Chefer et al.'s relevance of one span of one example (batch 1, no padding), from scratch: LRP from the one-hot
    of each of the span's (token, tag) logits through the per-token head, the blocks, then the rollout read at the
    span's rows."""
    layers = _token_layers(model)
    names = _layer_names(layers, _PATHS[model.config.model_type])
    names["head"] = (model.classifier, 0)
    modules = {name: module for name, (module, _) in names.items()}
    tape = _Tape(names)
    try:
        output = model(**inputs)
    finally:
        tape.close()
    v = tape.values
    probabilities = [v[f"{i}.attn"][1][1] for i in range(len(layers))]
    terms = list(zip(range(span[0], span[1]), span_tags(span, label_scheme(BIO)), strict=True))
    objective = sum(output.logits[0, position, tag] for position, tag in terms)
    assert isinstance(objective, Tensor)
    gradients = torch.autograd.grad(objective, probabilities)
    seed = torch.zeros_like(output.logits.detach())
    for position, tag in terms:
        seed[0, position, tag] = 1.0
    token_relevance = _linear(v["head"][0], model.classifier.weight.detach(), seed)
    cams = _oracle_blocks(model, v, modules, len(layers), probabilities, token_relevance, start_layer)
    return _oracle_rollout(gradients, cams, start_layer, list(range(span[0], span[1])))


@pytest.mark.parametrize("start_layer", [0, 1])
@pytest.mark.parametrize("model_type", LRP_FAMILIES)
def test_relevance_matches_an_independent_oracle(model_type: str, start_layer: int) -> None:
    model = token_model(model_type)
    batch = batch_of(model)
    result = explain_tokens(model, batch, method="relevance", positions=SPANS, start_layer=start_layer)
    for row, spans in enumerate(SPANS):
        alone = {key: value for key, value in row_alone(batch, row).items() if key != "special_tokens_mask"}
        for number, span in enumerate(spans):
            expected = _token_oracle(model, alone, span, start_layer)
            got = result.scores[row, number, : expected.shape[0]]
            assert torch.allclose(got, expected, atol=1e-6 * float(expected.abs().max()), rtol=0), (row, span)


@pytest.mark.parametrize("model_type", LRP_FAMILIES)
def test_relevance_from_a_token_head_is_conserved_through_every_block(model_type: str) -> None:
    """Chefer et al., Eq. 7-10: the relevance seeded at a span's (token, tag) logits (1 per token) is the same at the
    last hidden states and at every block's input; padding gets none."""
    model = token_model(model_type)
    batch = {key: value for key, value in batch_of(model).items() if key != "special_tokens_mask"}
    arch = describe(model)
    with prepared_model(model):
        forward = forward_pass(model, arch, batch, frozenset({ATTENTIONS, ATTENTION_GRADIENTS, ACTIVATIONS}))
        capture = forward.capture(arch, torch.zeros(4, dtype=torch.long))
    assert capture.activations is not None and capture.head_inputs is not None
    scheme = label_scheme(BIO)
    seed = torch.zeros_like(capture.logits)
    for row, spans in enumerate(SPANS):
        start, end, _ = spans[0]
        seed[row, torch.arange(start, end), torch.tensor(span_tags(spans[0], scheme))] = 1.0
    relevance = token_head_relprop(capture.head_inputs[0], model.classifier.weight.detach(), seed)
    lengths = torch.tensor([float(spans[0][1] - spans[0][0]) for spans in SPANS], dtype=torch.float64)
    torch.testing.assert_close(relevance.sum(dim=(1, 2)), lengths, atol=1e-8, rtol=0)  # the +1e-9 stabilisers
    weights = _block_weights(arch, torch.float64)
    for index in reversed(range(arch.num_layers)):
        below, cam = block_relprop(
            capture.activations[index], weights[index], relevance, arch.num_heads, norm_first=False, masked=True
        )
        assert below is not None
        torch.testing.assert_close(below.sum(dim=(1, 2)), lengths, atol=5e-8, rtol=0)
        padding = batch["attention_mask"] == 0
        assert (below[padding] == 0).all() and (cam.sum(1)[padding] == 0).all()
        relevance = below
