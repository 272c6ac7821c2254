"""The client's request and result types without a server: sentence pairs in the request document and in the input
lines, the multi-label and regression heads and the pooled position / segment ids in results, and how the terminal
shows each head."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from explain_client import Explanation, Prediction, Request
from explain_client.client import load_requests
from explain_client.render import prediction_line, terminal_prediction


def test_a_sentence_pair_travels_in_the_request_document() -> None:
    request = Request(text="a man sleeps", text_pair="a person rests", method="relevance", target="entailment")
    assert request.to_json() == {
        "text": "a man sleeps",
        "text_pair": "a person rests",
        "explain": {"method": "relevance", "target": "entailment"},
    }
    assert "text_pair" not in Request(text="one text").to_json()
    with pytest.raises(ValueError, match="text_pair"):
        Request(image=b"png", text_pair="no")


def test_input_lines_may_hold_sentence_pairs(tmp_path: Path) -> None:
    lines = ["plain text", json.dumps({"text": "premise", "text_pair": "hypothesis"}), json.dumps({"text": "alone"})]
    assert load_requests(lines) == ["plain text", ("premise", "hypothesis"), "alone"]
    with pytest.raises(ValueError, match="line 1: 'text_pair'"):
        load_requests([json.dumps({"text": "premise", "text_pair": 3})])


def test_multi_label_and_regression_results_parse_and_show() -> None:
    multi = Prediction.from_dict(
        {
            "head_type": "multi_label",
            "label": "toxic",
            "label_id": 0,
            "probabilities": {"toxic": 0.9, "insult": 0.6, "threat": 0.1},
            "labels": ["toxic", "insult"],
            "threshold": 0.5,
        }
    )
    assert multi.labels == ("toxic", "insult") and multi.threshold == 0.5 and multi.value is None
    assert prediction_line(multi).startswith("labels: toxic, insult (p ≥ 0.5)   (toxic 0.900  insult 0.600")
    assert Prediction.from_dict(multi.to_dict()) == multi
    regression = Prediction.from_dict({"head_type": "regression", "value": 3.25, "truncated": False})
    assert regression.label is None and regression.label_id is None and regression.probabilities == {}
    assert regression.value == 3.25 and prediction_line(regression) == "value: 3.25"
    assert Prediction.from_dict(regression.to_dict()) == regression
    single = Prediction.from_dict({"label": "negative", "label_id": 0, "probabilities": {"negative": 1.0}})
    assert single.head_type == "single_label" and prediction_line(single).startswith("label: negative")


def test_pooled_position_and_segments_of_a_pair_explanation() -> None:
    document = {
        "method": "rollout",
        "target": 1,
        "target_label": "entailment",
        "options": {},
        "tokens": ["[CLS]", "a", "man", "[SEP]", "a", "person", "[SEP]"],
        "special_tokens": [True, False, False, True, False, False, True],
        "scores": [0.0, 0.1, 0.2, 0.0, 0.3, 0.4, 0.0],
        "segments": [-1, 0, 0, -1, 1, 1, -1],
        "pooled": "last",
    }
    explanation = Explanation.from_dict(document)
    assert explanation.segments == (-1, 0, 0, -1, 1, 1, -1) and explanation.pooled == "last"
    assert Explanation.from_dict(explanation.to_dict()) == explanation
    plain = Explanation.from_dict({**document, "segments": None, "pooled": None})
    assert plain.segments is None and plain.pooled == "first" and "pooled" not in plain.to_dict()
    with pytest.raises(ValueError, match="segment ids"):
        Explanation("rollout", 1, "x", {}, (0.1, 0.2), ("a", "b"), (False, False), segments=(0,))
    shown = terminal_prediction(Prediction("entailment", 1, {"entailment": 1.0}, False, explanation), color=False)
    assert "a[+0.25] man[+0.50] a[+0.75] person[+1.00]" in shown
