"""The token_classification task below TorchServe: config, decoding, a batch through the service with a tiny BERT
NER checkpoint (entities with character offsets, per-row methods, the error table's codes) and the encoding that the
client reads back identically over JSON and protobuf. The real TorchServe path is in tests/integration."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

from explain_client import Prediction
from explain_client.protos import explain_messages
from explain_client.wire import prediction_from_protobuf
from explainers import explain_tokens
from serving_core.config import HandlerConfig
from serving_core.errors import RowError
from serving_core.tasks.classify_schema import DecodedRow, decode_row
from serving_core.tasks.token_schema import TokenOutcome, encode_token_outcome
from serving_core.tasks.token_service import TokenClassificationService
from serving_core.wire import Encoding
from tests import checkpoints

CONFIG = HandlerConfig(task="token_classification", labels=tuple(checkpoints.ENTITY_TAGS), max_length=24)
TEXTS = (
    "the staff in paris were lovely and quick",
    "a slow rude waiter served cold food to john smith in london",
    "good",
)


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> TokenClassificationService:
    folder = checkpoints.token_classifier(tmp_path_factory.mktemp("ner") / "model")
    return TokenClassificationService(CONFIG, folder, torch.device("cpu"))


def _rows(bodies: list[Any], encoding: Encoding = Encoding.JSON) -> list[DecodedRow | RowError]:
    rows: list[DecodedRow | RowError] = []
    for body in bodies:
        try:
            if encoding is Encoding.JSON:
                rows.append(decode_row({"body": body}, False, CONFIG))
            else:
                rows.append(decode_row({"request": body}, False, CONFIG))
        except RowError as error:
            rows.append(error)
    return rows


def _run(service: TokenClassificationService, bodies: list[Any], encoding: Encoding = Encoding.JSON) -> list[Any]:
    outcomes, _ = service.run(_rows(bodies, encoding), [encoding] * len(bodies))
    return outcomes


def test_config_accepts_the_task() -> None:
    section = {"task": "token_classification", "labels": checkpoints.ENTITY_TAGS, "max_length": 32}
    config = HandlerConfig.from_model_yaml({"handler": section})
    assert config.task == "token_classification" and config.input_kind == "text"


def test_entities_have_character_offsets_into_the_text(service: TokenClassificationService) -> None:
    outcomes = _run(service, [{"text": text} for text in TEXTS])
    assert all(isinstance(outcome, TokenOutcome) and outcome.error is None for outcome in outcomes)
    assert any(outcome.entities for outcome in outcomes), "the tiny model finds no entity: nothing would be checked"
    for text, outcome in zip(TEXTS, outcomes, strict=True):
        assert outcome.scheme == "BIO" and outcome.method is None
        assert outcome.tokens is not None and outcome.offsets is not None
        for entity in outcome.entities:
            assert text[entity.start : entity.end] == entity.text and entity.scores is None
            first, last = outcome.offsets[entity.token_start], outcome.offsets[entity.token_end - 1]
            assert (entity.start, entity.end) == (first[0], last[1])
            assert entity.tag == CONFIG.labels[entity.label_id] and entity.tag.endswith(entity.label)
            assert not any(outcome.special_tokens[entity.token_start : entity.token_end])
            assert 0.0 < entity.score <= 1.0


def _batch_alone(service: TokenClassificationService, text: str) -> dict[str, torch.Tensor]:
    encoded = service.tokenizer(text, truncation=True, max_length=CONFIG.max_length, return_tensors="pt")
    encoded["special_tokens_mask"] = torch.tensor([service.tokenizer.get_special_tokens_mask(
        encoded["input_ids"][0].tolist(), already_has_special_tokens=True)])  # fmt: skip
    return dict(encoded)


def test_per_row_methods_in_one_batch_equal_each_row_explained_alone(service: TokenClassificationService) -> None:
    bodies: list[dict[str, Any]] = [
        {"text": TEXTS[1], "explain": {"method": "attnlrp"}},
        {"text": TEXTS[0], "explain": {"method": "rollout", "start_layer": 1}},
        {"text": TEXTS[1]},
        {"text": TEXTS[0], "explain": {"method": "lime"}},
        {"text": TEXTS[1], "explain": {"method": "rollout", "start_layer": 7}},
        {"text": TEXTS[1], "explain": {"method": "relevance"}},
        {"text": TEXTS[0], "explain": {"method": "attnlrp"}},
    ]
    outcomes = _run(service, list(bodies))
    assert [outcome.method for outcome in outcomes] == [
        "attnlrp",
        "rollout",
        None,
        "lime",
        "rollout",
        "relevance",
        "attnlrp",
    ]
    assert outcomes[3].error.code == "unknown_method" and outcomes[4].error.code == "invalid_option"
    for index in (0, 1, 5, 6):
        outcome, body = outcomes[index], bodies[index]
        assert outcome.error is None
        options = {key: value for key, value in body["explain"].items() if key != "method"}
        alone = explain_tokens(service.model, _batch_alone(service, body["text"]), method=outcome.method, **options)
        assert [(e.token_start, e.token_end, e.label_id) for e in outcome.entities] == alone.spans[0]
        for number, entity in enumerate(outcome.entities):
            expected = alone.scores[0, number].float()
            assert entity.scores is not None
            torch.testing.assert_close(
                torch.tensor(entity.scores), expected, atol=1e-5 * float(expected.abs().max()), rtol=0
            )
        assert outcome.options == dict(alone.options)
    plain = outcomes[2]
    assert plain.error is None and [e.text for e in plain.entities] == [e.text for e in outcomes[0].entities]


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"text": "a b", "text_pair": "c"}, "invalid_request"),
        ({"text": "a b", "explain": {"method": "attention", "target": "B-PER"}}, "invalid_target"),
        ({"text": ""}, "missing_text"),
        ({"image": "aGk="}, "unsupported_input"),
        ({"text": "x" * 30_000}, "text_too_long"),
        ({"text": "a b", "explain": {"method": "attention", "colour": 1}}, "invalid_option"),
        ({"text": "a b", "explain": {"method": "attention", "below": 0.5}}, "invalid_request"),
    ],
)
def test_bad_rows_get_the_error_tables_codes(service: TokenClassificationService, body: Any, code: str) -> None:
    outcomes = _run(service, [body, {"text": TEXTS[0], "explain": {"method": "attention"}}])
    assert outcomes[0].error is not None and outcomes[0].error.code == code, outcomes[0].error
    assert outcomes[1].error is None and outcomes[1].method == "attention"


def _request(text: str, method: str | None) -> bytes:
    message = explain_messages().ExplainRequest(text=text)
    if method is not None:
        message.explain.method = method
    return bytes(message.SerializeToString())


def test_json_and_protobuf_answers_read_back_the_same(service: TokenClassificationService) -> None:
    as_json = _run(service, [{"text": TEXTS[1], "explain": {"method": "gae"}}, {"text": TEXTS[0]}])
    as_proto = _run(service, [_request(TEXTS[1], "gae"), _request(TEXTS[0], None)], Encoding.PROTOBUF)
    for json_outcome, proto_outcome in zip(as_json, as_proto, strict=True):
        from_json = Prediction.from_dict(json.loads(encode_token_outcome(json_outcome, CONFIG.labels)))
        reply = explain_messages().ExplainResponse.FromString(encode_token_outcome(proto_outcome, CONFIG.labels))
        from_proto = prediction_from_protobuf(reply)
        assert from_json.head_type == from_proto.head_type == "token_classification"
        assert [entity.text for entity in from_json.entities] == [entity.text for entity in from_proto.entities]
        for left, right in zip(from_json.entities, from_proto.entities, strict=True):
            assert (left.start, left.end, left.tag) == (right.start, right.end, right.tag)
            assert (left.scores is None) == (right.scores is None)
            if left.scores is not None and right.scores is not None:
                torch.testing.assert_close(torch.tensor(left.scores), torch.tensor(right.scores), atol=1e-5, rtol=1e-5)
        assert from_json.token_classification is not None and from_proto.token_classification is not None
        assert from_json.token_classification.offsets == from_proto.token_classification.offsets
    error = _run(service, [{"text": "a", "text_pair": "b"}])[0]
    document = json.loads(encode_token_outcome(error, CONFIG.labels))
    assert document["error"]["code"] == "invalid_request" and document["error"]["http_status"] == 400
