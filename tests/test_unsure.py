"""Explain when unsure, in the explainers (explainers/confidence.py, explain_batch): a row with ``below`` is explained
only when its prediction's confidence is below it; a confident row gets a RowSkipped and costs no backward; an unsure
row gets exactly the explanation it would get without ``below``."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification

from explainers import (
    ExplainError,
    RowExplanation,
    RowRequest,
    RowSkipped,
    explain,
    explain_batch,
    prediction_confidence,
)
from explainers.confidence import check_below

from .conftest import _eager, build_bert, row_inputs, text_batch
from .weights import perturb

GRADIENT_METHODS = ("attnlrp", "gae", "grad_x_input", "relevance", "cp_lrp")
MAP_METHODS = ("attention", "rollout")


def _confidences(model: Any, batch: dict[str, torch.Tensor]) -> list[float]:
    with torch.no_grad():
        return model(**batch).logits.softmax(-1).max(-1).values.tolist()


def _between(confidences: list[float]) -> float:
    """A threshold with about half of the rows below it (and none exactly at it)."""
    ordered = sorted(confidences)
    middle = len(ordered) // 2
    return (ordered[middle - 1] + ordered[middle]) / 2


class _Forwards:
    """Records every forward of a model: its batch size and whether gradients were enabled."""

    def __init__(self, model: Any) -> None:
        self.calls: list[tuple[int, bool]] = []
        self.handle = model.register_forward_pre_hook(self._record, with_kwargs=True)

    def _record(self, module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        ids = kwargs["input_ids"] if "input_ids" in kwargs else args[0]
        self.calls.append((int(ids.shape[0]), torch.is_grad_enabled()))

    def __enter__(self) -> _Forwards:
        return self

    def __exit__(self, *exc: object) -> None:
        self.handle.remove()


def test_confidence_of_each_head_type() -> None:
    logits = torch.tensor([[2.0, 0.0, -1.0], [0.1, 0.0, 0.2]])
    single = prediction_confidence(logits, "single_label")
    assert torch.allclose(single, logits.softmax(-1).max(-1).values)
    multi = prediction_confidence(torch.tensor([[4.0, -4.0, 0.0], [3.0, -3.0, -2.0]]), "multi_label")
    assert multi[0] == pytest.approx(0.5), "a label at p = 0.5 makes the row as unsure as it gets"
    assert multi[1] == pytest.approx(float(torch.tensor(2.0).sigmoid())), "the least sure label decides"
    with pytest.raises(ExplainError, match="regression head has none"):
        prediction_confidence(torch.zeros(2, 1), "regression")


@pytest.mark.parametrize("below", [0, -0.1, 1.5, True, "0.8", float("nan")])
def test_below_must_be_a_probability(below: Any) -> None:
    with pytest.raises(ExplainError, match=r"probability in \(0, 1\]"):
        check_below(below)
    assert check_below(None) is None and check_below(1) == 1.0 and check_below(0.25) == 0.25


@pytest.mark.parametrize("method", GRADIENT_METHODS + MAP_METHODS)
def test_confident_rows_are_skipped_and_unsure_rows_explained_as_without_below(method: str) -> None:
    model = build_bert().double()
    batch = text_batch(model)
    confidences = _confidences(model, batch)
    below = _between(confidences)
    result = explain_batch(model, batch, [RowRequest(method, below=below)] * len(confidences))
    with torch.no_grad():
        torch.testing.assert_close(result.logits, model(**batch).logits, rtol=0, atol=1e-10)
    unsure = [row for row, confidence in enumerate(confidences) if confidence < below]
    assert 0 < len(unsure) < len(confidences)
    for row, confidence in enumerate(confidences):
        got = result.rows[row]
        if row in unsure:
            assert isinstance(got, RowExplanation) and got.method == method
            alone = explain(model, row_inputs(batch, row), method=method)
            torch.testing.assert_close(got.scores, alone.scores[0], rtol=1e-7, atol=1e-10)
            assert got.target == int(alone.target[0])
        else:
            assert got == RowSkipped(method, pytest.approx(confidence, abs=1e-6), below)  # type: ignore[arg-type]
            assert got.reason == "confident" and f"not below {below:g}" in got.message


def test_confident_rows_cost_no_backward() -> None:
    model = build_bert()
    batch = text_batch(model)
    confidences = _confidences(model, batch)
    with _Forwards(model) as forwards:
        result = explain_batch(model, batch, [RowRequest("attnlrp", below=min(confidences) / 2)] * len(confidences))
    assert all(isinstance(row, RowSkipped) for row in result.rows)
    assert forwards.calls == [(len(confidences), False)], "one forward, without gradients"
    assert set(result.seconds) == {"forward"}, "no backward"
    below = _between(confidences)
    unsure = sum(confidence < below for confidence in confidences)
    with _Forwards(model) as forwards:
        explain_batch(model, batch, [RowRequest("gae", below=below)] * len(confidences))
    assert forwards.calls == [(len(confidences), False), (unsure, True)], "a gradient pass over the unsure rows only"


def test_a_mixed_batch_serves_every_row_as_it_asks() -> None:
    """Unconditional rows of a gradient method share the batch's gradient pass; conditional rows of the same and of
    other kinds beside them are decided, and every served row equals the row explained alone."""
    model = build_bert().double()
    batch = text_batch(model, lengths=(7, 3, 9, 5, 6, 4))
    confidences = _confidences(model, batch)
    always = max(confidences) + 1e-3  # every row is less sure than this
    rows = [
        RowRequest("gae"),
        RowRequest("gae", below=always),
        RowRequest("attnlrp", below=always),
        RowRequest("attnlrp", below=min(confidences) / 2),  # confident
        RowRequest("rollout", below=always),
        RowRequest(None, below=0.5),  # prediction only: below means nothing
    ]
    result = explain_batch(model, batch, rows)
    for row, request in enumerate(rows[:5]):
        got = result.rows[row]
        if row == 3:
            assert isinstance(got, RowSkipped)
            continue
        assert isinstance(got, RowExplanation), (row, got)
        assert request.method is not None
        alone = explain(model, row_inputs(batch, row), method=request.method)
        torch.testing.assert_close(got.scores, alone.scores[0], rtol=1e-7, atol=1e-10)
    assert result.rows[5] is None


def test_below_is_refused_for_a_regression_head_and_out_of_range() -> None:
    config = BertConfig(
        vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        problem_type="regression",
    )  # fmt: skip
    config.num_labels = 1
    model = _eager(perturb(BertForSequenceClassification(config), 3, unit_embeddings="embeddings"))
    batch = text_batch(model, lengths=(5, 4))
    result = explain_batch(model, batch, [RowRequest("gae", below=0.8), RowRequest("gae")])
    assert isinstance(result.rows[0], ExplainError) and "regression head has none" in str(result.rows[0])
    assert isinstance(result.rows[1], RowExplanation)
    model = build_bert()
    result = explain_batch(model, text_batch(model, lengths=(5, 4)), [RowRequest("gae", below=2.0), RowRequest("gae")])
    assert isinstance(result.rows[0], ExplainError) and "(0, 1]" in str(result.rows[0])
    assert isinstance(result.rows[1], RowExplanation)
