"""``explain.granularity`` on classifiers and token classifiers: a row asked in words or sentences gets its text's
units (decoded text, offsets into its own text, special tokens marked, a pair's segment) and each unit's score is the
sum of its tokens' scores in the same row asked in tokens; JSON and protobuf agree; images and unknown
granularities are refused with ``invalid_option``."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
import yaml

from explain_client.protos import explain_messages
from explainers import token_units
from serving_core.config import HandlerConfig
from serving_core.errors import RowError
from serving_core.tasks.classify_schema import decode_row, encode_outcome
from serving_core.tasks.classify_service import ExplanationService
from serving_core.tasks.token_schema import token_outcome_to_dict
from serving_core.tasks.token_service import TokenClassificationService
from serving_core.wire import Encoding
from tests import checkpoints

PREMISE = "The staff were unbelievably lovely. The service was quick!"
HYPOTHESIS = "the waiter was rude"


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> ExplanationService:
    from model_store.package import package

    folder = tmp_path_factory.mktemp("pairs")
    result = package(checkpoints.pair_encoder(folder / "pairs"), "pairs", folder / "store")
    config = HandlerConfig.from_model_yaml(yaml.safe_load((result.archive / "model-config.yaml").read_text()))
    return ExplanationService(config, result.archive / "model", torch.device("cpu"))


def _serve(service: Any, bodies: list[Any], encoding: Encoding = Encoding.JSON) -> list[Any]:
    key = "body" if encoding is Encoding.JSON else "request"
    rows: list[Any] = []
    for body in bodies:
        try:
            rows.append(decode_row({key: body}, False, service.config))
        except RowError as error:
            rows.append(error)
    outcomes, _ = service.run(rows, [encoding] * len(rows))
    return outcomes


def test_words_and_sentences_of_a_pair_sum_their_tokens(pairs: ExplanationService) -> None:
    explain: dict[str, Any] = {"method": "attnlrp"}
    body = {"text": PREMISE, "text_pair": HYPOTHESIS}
    tokens, words, sentences = _serve(
        pairs,
        [
            {**body, "explain": explain},
            {**body, "explain": {**explain, "granularity": "word"}},
            {**body, "explain": {**explain, "granularity": "sentence"}},
        ],
    )
    assert tokens.context is None and any(token.startswith("##") for token in tokens.tokens)
    for grouped in (words, sentences):
        document = json.loads(encode_outcome(grouped, pairs.config.labels))["explanation"]
        context = document["context"]
        assert document["tokens"] == [unit["text"] for unit in context] and len(document["scores"]) == len(context)
        assert not any("##" in unit["text"] for unit in context)
        assert sum(document["scores"]) == pytest.approx(sum(tokens.scores), rel=1e-4, abs=1e-6)
        for unit in context:
            if unit["special"]:
                assert unit["start"] is None and unit["text"] in ("[CLS]", "[SEP]")
            else:
                own = PREMISE if unit["segment"] == 0 else HYPOTHESIS
                assert own[unit["start"] : unit["end"]].lower() == unit["text"].lower()
    word_texts = [unit.text for unit in words.context]
    assert word_texts[:7] == ["[CLS]", "The", "staff", "were", "unbelievably", "lovely", "."]
    assert [unit.text for unit in sentences.context if not unit.special] == [
        "The staff were unbelievably lovely.", "The service was quick!", HYPOTHESIS
    ]  # fmt: skip
    # each word's score is the sum of its tokens' (grouped by the library's rule over the same offsets)
    encoded = pairs.tokenizer(PREMISE, HYPOTHESIS, return_offsets_mapping=True, return_special_tokens_mask=True)
    shift = len(PREMISE) + 2
    joined = PREMISE + "\n\n" + HYPOTHESIS
    offsets = [
        None if flag else (start + (shift if sequence == 1 else 0), end + (shift if sequence == 1 else 0))
        for (start, end), flag, sequence in zip(
            encoded["offset_mapping"], encoded["special_tokens_mask"], encoded.sequence_ids(0), strict=True
        )
    ]
    units = token_units(joined, offsets, "word")
    assert len(units) == len(words.scores)
    for unit, score in zip(units, words.scores, strict=True):
        assert score == pytest.approx(sum(tokens.scores[unit.first : unit.stop]), rel=1e-4, abs=1e-6)
    proto = explain_messages().ExplainRequest(text=PREMISE, text_pair=HYPOTHESIS)
    proto.explain.method, proto.explain.granularity = "attnlrp", "word"
    from_proto = _serve(pairs, [proto.SerializeToString()], Encoding.PROTOBUF)[0]
    response = explain_messages().ExplainResponse.FromString(encode_outcome(from_proto, pairs.config.labels))
    assert response.explanation.granularity == "word"
    assert [unit.text for unit in response.explanation.context] == word_texts
    assert list(response.explanation.scores) == pytest.approx(words.scores, rel=1e-4, abs=1e-6)


def test_a_token_classifier_answers_each_entity_in_words(tmp_path_factory: pytest.TempPathFactory) -> None:
    folder = checkpoints.token_classifier(tmp_path_factory.mktemp("ner") / "model")
    config = HandlerConfig(task="token_classification", labels=tuple(checkpoints.ENTITY_TAGS), max_length=32)
    service = TokenClassificationService(config, folder, torch.device("cpu"))
    text = "a slow rude waiter served cold food to john smith in london"
    method = {"method": "grad_x_input"}
    tokens, words = _serve(
        service, [{"text": text, "explain": method}, {"text": text, "explain": {**method, "granularity": "word"}}]
    )
    assert tokens.entities and words.context is not None
    offsets = [None if flag else offset for offset, flag in zip(tokens.offsets, tokens.special_tokens, strict=True)]
    units = token_units(text, offsets, "word")
    assert len(units) == len(words.context)
    for by_token, by_word in zip(tokens.entities, words.entities, strict=True):
        assert len(by_word.scores) == len(words.context)
        for unit, score in zip(units, by_word.scores, strict=True):
            assert score == pytest.approx(sum(by_token.scores[unit.first : unit.stop]), rel=1e-4, abs=1e-6)
    document = token_outcome_to_dict(words)
    assert document["explanation"]["granularity"] == "word"
    assert [unit["text"] for unit in document["explanation"]["context"] if not unit["special"]] == text.split()


def test_refusals() -> None:
    text_config = HandlerConfig(task="text", labels=("a", "b"))
    image_config = HandlerConfig(task="image", labels=("a", "b"), image_size=(16, 16))
    for body, config in (
        ({"text": "hi", "explain": {"granularity": "paragraph"}}, text_config),
        ({"image": "aGk=", "explain": {"granularity": "word"}}, image_config),
    ):
        with pytest.raises(RowError) as raised:
            decode_row({"body": body}, False, config)
        assert raised.value.code == "invalid_option"
