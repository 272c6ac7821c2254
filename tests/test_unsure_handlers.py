"""Explain when unsure, in the handlers: ``below`` on REST (JSON) and gRPC (protobuf), the model's ``explain_below``
default and its overrides, the answer (``explained``, ``below``, ``confidence``, ``skipped``) in both encodings, and
the metric of explained and skipped rows."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from explain_client import protos
from model_store.package import PackageError, Settings, package
from serving_core import metrics
from serving_core.config import ConfigError, HandlerConfig
from serving_core.errors import RowError
from serving_core.tasks.classify_schema import decode_row, encode_outcome
from serving_core.tasks.classify_service import ExplanationService
from serving_core.wire import Encoding
from tests import checkpoints
from tests.serving_support import tiny_archives

CONFIG = HandlerConfig(task="text", labels=("negative", "neutral", "positive"), max_length=16)
UNSURE_CONFIG = dataclasses.replace(CONFIG, explain_below=0.7)
TEXTS = ("the food was cold and the staff rude", "good", "a slow rude waiter", "lovely quick service")


def _messages() -> Any:
    return protos.explain_messages()


def _grpc_row(**explain: Any) -> dict[str, bytes]:
    messages = _messages()
    options = messages.ExplainOptions(**explain)
    return {"request": messages.ExplainRequest(text="hi", explain=options).SerializeToString()}


def test_below_on_rest_and_grpc_and_the_model_default() -> None:
    def below(row: dict[str, Any], config: HandlerConfig = CONFIG, header: bool = False) -> float | None:
        return decode_row(row, header, config).request.below

    assert below({"body": {"text": "hi", "explain": {"method": "gae", "below": 0.8}}}) == 0.8
    assert below({"body": {"text": "hi", "explain": {"below": 1}}}) == 1
    assert below({"body": {"text": "hi", "explain": {"method": "gae"}}}) is None, "no model default: always"
    for body in ({"text": "hi", "explain": {}}, {"text": "hi", "explain": True}):
        assert below({"body": body}, UNSURE_CONFIG) == 0.7, "the model's explain_below applies"
    assert below({"body": {"text": "hi"}}, UNSURE_CONFIG, header=True) == 0.7, "the explanations route too"
    assert below({"body": {"text": "hi", "explain": {"below": None}}}, UNSURE_CONFIG) is None, "null: always"
    assert below({"body": {"text": "hi", "explain": {"below": 0.9}}}, UNSURE_CONFIG) == 0.9, "the request wins"
    assert below({"body": {"text": "hi"}}, UNSURE_CONFIG) is None, "a prediction only has no condition"
    assert below(_grpc_row(method="gae", below=0.8)) == 0.8, "float32 on the wire, read back as 0.8"
    assert below(_grpc_row(method="gae"), UNSURE_CONFIG) == 0.7
    assert below(_grpc_row(method="gae", always=True), UNSURE_CONFIG) is None
    decoded = decode_row({"body": {"text": "hi", "explain": {"method": "gae", "below": 0.8}}}, False, CONFIG)
    assert dict(decoded.request.options) == {}, "below is not a method option"
    with pytest.raises(RowError, match=r"'explain.below' must be a probability in \(0, 1\] or null") as raised:
        decode_row({"body": {"text": "hi", "explain": {"below": "high"}}}, False, CONFIG)
    assert raised.value.code == "invalid_request"


def test_the_model_setting_is_checked_where_it_is_written(tmp_path: Path) -> None:
    section = {"task": "text", "labels": ["a", "b"], "explain_below": 0.75}
    assert HandlerConfig.from_model_yaml({"handler": section}).explain_below == 0.75
    for wrong in (0, 1.5, True, "0.8"):
        with pytest.raises(ConfigError, match=r"explain_below must be a probability in \(0, 1\]"):
            HandlerConfig.from_model_yaml({"handler": {**section, "explain_below": wrong}})
    with pytest.raises(PackageError, match="explain_below must be a probability"):
        Settings(explain_below=2.0).check()
    folder = checkpoints.pair_encoder(tmp_path / "pairs")
    result = package(folder, "pairs", tmp_path / "store", Settings(explain_below=0.8))
    written = yaml.safe_load((result.archive / "model-config.yaml").read_text())
    assert written["handler"]["explain_below"] == 0.8


@pytest.fixture(scope="module")
def service() -> ExplanationService:
    archive = tiny_archives()["sentiment"]
    config = HandlerConfig.from_model_yaml(yaml.safe_load((archive / "model-config.yaml").read_text()))
    return ExplanationService(config, archive / "model", torch.device("cpu"))


def _confidences(service: ExplanationService) -> list[float]:
    inputs, _, _ = service._text_inputs(TEXTS, [None] * len(TEXTS))
    with torch.no_grad():
        return service.model(**inputs).logits.softmax(-1).max(-1).values.tolist()


def _halfway(confidences: list[float]) -> float:
    """A threshold with two of the four rows below it (the tiny model's confidences differ by ~1e-5)."""
    ordered = sorted(confidences)
    assert ordered[2] - ordered[1] > 1e-6, ordered
    return (ordered[1] + ordered[2]) / 2


def test_the_answer_says_whether_it_was_explained_and_why_not(service: ExplanationService) -> None:
    confidences = _confidences(service)
    below = _halfway(confidences)
    assert sum(confidence < below for confidence in confidences) == 2
    bodies: list[dict[str, Any]] = [{"text": text, "explain": {"method": "gae", "below": below}} for text in TEXTS]
    rows = [decode_row({"body": body}, False, service.config) for body in bodies]
    passes: list[tuple[int, bool]] = []  # (rows, grad-enabled) of each forward
    embeddings: torch.nn.Module = service.model.get_input_embeddings()  # type: ignore[operator]
    handle = embeddings.register_forward_hook(lambda m, a, out: passes.append((out.shape[0], torch.is_grad_enabled())))
    try:
        outcomes, timings = service.run(rows, [Encoding.JSON] * len(rows))
    finally:
        handle.remove()
    messages = _messages()
    for outcome, confidence in zip(outcomes, confidences, strict=True):
        document = json.loads(encode_outcome(outcome, service.config.labels))
        reply = messages.ExplainResponse.FromString(
            encode_outcome(dataclasses.replace(outcome, encoding=Encoding.PROTOBUF), service.config.labels)
        )
        assert document["below"] == below and document["confidence"] == pytest.approx(confidence, abs=1e-6)
        assert reply.below == pytest.approx(below, 1e-6) and reply.confidence == pytest.approx(confidence, 1e-6)
        assert document["label"] in service.config.labels and reply.label == document["label"], "always predicted"
        if confidence < below:
            assert document["explained"] is True and document["explanation"]["method"] == "gae"
            assert "skipped" not in document
            assert reply.explained and reply.explanation.method == "gae" and not reply.HasField("skipped")
        else:
            assert document["explained"] is False and "explanation" not in document
            assert document["skipped"]["reason"] == "confident" and document["skipped"]["method"] == "gae"
            assert "is not below" in document["skipped"]["message"]
            assert reply.HasField("explained") and not reply.explained and not reply.HasField("explanation")
            assert reply.skipped.reason == "confident" and reply.skipped.method == "gae"
    # the shared forward takes no gradients; the unsure rows' gradients come from their own pass (the batch's backward)
    assert passes == [(len(rows), False), (2, True)] and timings.backward > 0
    plain = json.loads(encode_outcome(service.run([rows[0]], [Encoding.JSON])[0][0], service.config.labels))
    unconditional = decode_row({"body": {"text": TEXTS[0], "explain": {"method": "gae"}}}, False, service.config)
    explained = json.loads(encode_outcome(service.run([unconditional], [Encoding.JSON])[0][0], service.config.labels))
    assert explained["explained"] is True and "below" not in explained and "confidence" not in explained
    if plain["explained"]:
        assert plain["explanation"]["scores"] == pytest.approx(explained["explanation"]["scores"], abs=1e-5)
    prediction = json.loads(
        encode_outcome(service.run([decode_row({"body": {"text": "x"}}, False, service.config)], [Encoding.JSON])[0][0],
                       service.config.labels)
    )  # fmt: skip
    assert "explained" not in prediction, "a prediction-only request was not asked to explain"


def test_explained_and_skipped_rows_are_counted(service: ExplanationService) -> None:
    from doors.torchserve.handler import ExplanationHandler

    class _Context:
        def get_request_header(self, index: int, name: str) -> None:
            return None

        def get_all_request_header(self, index: int) -> dict[str, str]:
            return {}

        def set_response_content_type(self, index: int, value: str) -> None:
            pass

        def set_response_status(self, code: int, phrase: str, index: int) -> None:
            pass

        def set_response_header(self, index: int, name: str, value: str) -> None:
            pass

    handler = ExplanationHandler()
    handler.service, handler.config, handler.model_name = service, service.config, "unsure-test"
    confidences = _confidences(service)
    below = _halfway(confidences)

    def count(outcome: str) -> float:
        value = metrics.UNSURE_ROWS.labels("unsure-test", "rollout", outcome)._value.get()
        return float(value)

    before = count("explained"), count("skipped")
    data = [{"body": {"text": text, "explain": {"method": "rollout", "below": below}}} for text in TEXTS]
    handler.handle(data, _Context())
    assert (count("explained") - before[0], count("skipped") - before[1]) == (2, 2)
