"""Rows answered in sentences join the drift window over words: the outcome keeps, in memory only, the attribution over
the tokens its sentences were summed from, and the monitor groups it into the words (and shares) that the same row
asked in ``word`` granularity gives — classifiers (a text, a sentence pair), token classifiers per entity, generation
rows (steps, a sum, the answer's sentences, a chat with documents). The kept scores never reach an answer, and an
outcome pickled to another process leaves them behind."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest

from monitoring.config import MonitorConfig
from monitoring.inprocess import InProcessModel
from monitoring.monitor import Monitor
from monitoring.readers import Observation
from serving_core.wire import Encoding
from tests import checkpoints

TEXTS = [
    "The service was quick. The staff were lovely! Would the food be warm?",
    "A slow rude waiter, never again. Food cold; not warm.",
    "good",
]
PAIRS = [
    ("The staff were lovely. The food was good.", "The food was cold. The waiter was rude!"),
    ("quick service", "Slow service? Never."),
]


def _serve(model: InProcessModel, body: dict[str, Any]) -> tuple[Any, Any]:
    row = model.task.decode_row({"body": body}, False, model.config)
    outcomes, _ = model.service.run([row], [Encoding.JSON])
    assert outcomes[0].error is None, outcomes[0].error
    return row, outcomes[0]


def _same(sentences: Observation, words: Observation) -> None:
    """Both observations join the drift window with the same words and the same shares (to 1e-6)."""
    assert sentences.drift and words.drift
    assert (sentences.method, sentences.label) == (words.method, words.label)
    assert sentences.shares.shares.keys() == words.shares.shares.keys()
    for key, share in words.shares.shares.items():
        assert sentences.shares.shares[key] == pytest.approx(share, abs=1e-6), key
    assert sentences.shares.special_share == pytest.approx(words.shares.special_share, abs=1e-6)
    assert sentences.shares.negative_share == pytest.approx(words.shares.negative_share, abs=1e-6)
    assert sentences.shares.entropy == pytest.approx(words.shares.entropy, abs=1e-6)


def _readings(model: InProcessModel, body: dict[str, Any], explain: dict[str, Any]) -> dict[str, Any]:
    """The reading of ``body`` asked in words and in sentences, and the sentence row's outcome."""
    readings: dict[str, Any] = {}
    for granularity in ("word", "sentence"):
        row, outcome = _serve(model, {**body, "explain": {**explain, "granularity": granularity}})
        assert outcome.granularity == granularity
        readings[granularity] = model.reader(row, outcome)
        readings[f"{granularity}_outcome"] = outcome
    return readings


def _answer_without_kept_scores(model: InProcessModel, outcome: Any) -> None:
    """The kept scores are not in the answer, and an outcome pickled leaves them behind."""
    answer = model.task.to_dict(outcome, model.config)
    assert model.task.to_dict(pickle.loads(pickle.dumps(outcome)), model.config) == answer


@pytest.mark.parametrize("kind", ["text", "pair"])
def test_classifier_rows_in_sentences_are_monitored_over_the_same_words(kind: str, tmp_path: Path) -> None:
    build = checkpoints.generic_labels if kind == "text" else checkpoints.pair_encoder
    model = InProcessModel("reviews", build(tmp_path / kind))
    bodies = [{"text": text} for text in TEXTS] if kind == "text" else [{"text": a, "text_pair": b} for a, b in PAIRS]
    coarser = 0
    for body in bodies:
        for method in ("attnlrp", "grad_x_input"):
            readings = _readings(model, body, {"method": method})
            outcome = readings["sentence_outcome"]
            assert outcome.token_scores is not None and len(outcome.token_scores.value) == len(outcome.tokens)
            assert readings["word_outcome"].token_scores is None  # only sentences keep them
            (sentences,), (words,) = readings["sentence"].explained, readings["word"].explained
            _same(sentences, words)
            coarser += len(outcome.context) < len(readings["word_outcome"].context)
            if kind == "pair":
                assert any(str(key).startswith("2:") for key in sentences.shares.shares)
            _answer_without_kept_scores(model, outcome)
            assert pickle.loads(pickle.dumps(outcome)).token_scores is None
    assert coarser  # sentences of several words


def test_entities_explained_in_sentences_are_monitored_over_the_same_words(tmp_path: Path) -> None:
    model = InProcessModel("entities", checkpoints.token_classifier(tmp_path / "entities"))
    observed = 0
    for text in ("Alice met Bob in Paris. Then Carol flew to Rome!", "Carol flew to Rome and London."):
        readings = _readings(model, {"text": text}, {"method": "attnlrp"})
        sentence_entities = readings["sentence_outcome"].entities
        assert all(entity.token_scores is not None for entity in sentence_entities)
        assert all(
            len(entity.token_scores.value) == len(readings["sentence_outcome"].tokens) for entity in sentence_entities
        )
        in_sentences, in_words = readings["sentence"].explained, readings["word"].explained
        assert len(in_sentences) == len(in_words)
        for sentences, words in zip(in_sentences, in_words, strict=True):
            _same(sentences, words)
            observed += 1
        sent = pickle.loads(pickle.dumps(readings["sentence_outcome"]))
        assert all(entity.token_scores is None for entity in sent.entities)
        _answer_without_kept_scores(model, readings["sentence_outcome"])
    assert observed  # the tiny model finds entities


@pytest.fixture(scope="module")
def writer(tmp_path_factory: pytest.TempPathFactory) -> InProcessModel:
    from tests.generation_checkpoint import causal_lm

    return InProcessModel("writer", causal_lm(tmp_path_factory.mktemp("writer") / "writer"))


@pytest.mark.parametrize(
    "explain",
    [{"method": "attnlrp"}, {"method": "grad_x_input", "steps": [0, 2]}, {"method": "attnlrp", "steps": "sum"},
     {"method": "attnlrp", "steps": "sentences"}],
    ids=["every-step", "two-steps", "sum", "answer-sentences"],
)  # fmt: skip
def test_generation_rows_in_sentences_are_monitored_over_the_prompts_words(
    writer: InProcessModel, explain: dict[str, Any]
) -> None:
    body = {"prompt": "The service was quick. The staff were lovely! Food cold, not warm", "max_new_tokens": 4}
    readings = _readings(writer, body, explain)
    outcome = readings["sentence_outcome"]
    assert outcome.token_scores is not None and outcome.token_scores.value.scores
    assert readings["word_outcome"].token_scores is None
    (sentences,), (words,) = readings["sentence"].explained, readings["word"].explained
    assert set(words.shares.shares) == {"the", "service", "was", "quick", "staff", "were", "lovely", "food", "cold",
                                        "not", "warm", ".", "!", ","}  # fmt: skip
    _same(sentences, words)
    prompt_units = [unit for unit in outcome.context if not unit.generated]
    assert len(prompt_units) == 3  # the prompt's three sentences
    _answer_without_kept_scores(writer, outcome)


@pytest.mark.parametrize("family", ["qwen3", "mistral"])
def test_a_chat_row_in_sentences_is_monitored_over_the_same_words(family: str, tmp_path: Path) -> None:
    """Messages, documents and a chat template: the template's tokens apart, the words of the messages and
    documents as a row asked in words gives them."""
    from tests.chat_zoo import save_chat_model

    model = InProcessModel("chat", save_chat_model(family, tmp_path / family))
    body: dict[str, object] = {
        "messages": [{"role": "user", "content": "Isn't the staff's service quick, e.g. 3.5 minutes? Lovely!"}],
        "max_new_tokens": 3,
    }
    if family == "qwen3":
        body["documents"] = [{"title": "Review", "text": "The well-known waiter was slow. The food was cold."}]
    readings = _readings(model, body, {"method": "attnlrp", "steps": [0, 2]})
    (sentences,), (words,) = readings["sentence"].explained, readings["word"].explained
    assert {"staff's", "3.5", "lovely"} <= set(words.shares.shares)
    assert words.shares.special_share > 0  # the template's tokens, kept apart
    _same(sentences, words)


def test_rows_in_sentences_fill_the_drift_window(writer: InProcessModel, tmp_path: Path) -> None:
    """Every explained row in sentences joins the window; a sentence row pickled to another process (its kept scores
    left behind) joins the health numbers only."""
    from monitoring.readers import ClassificationReader, GenerationReader

    monitor = Monitor("sentences-window", MonitorConfig(window=8), GenerationReader(), start=False)
    body = {"prompt": TEXTS[0], "max_new_tokens": 2, "explain": {"method": "attnlrp", "granularity": "sentence"}}
    for expected in (1, 2):
        row, outcome = _serve(writer, body)
        monitor.process(row, outcome)
        assert monitor.trackers[("attnlrp", "all")].window.rows == expected
    row, outcome = _serve(writer, body)
    assert not GenerationReader()(row, pickle.loads(pickle.dumps(outcome))).explained[0].drift

    model = InProcessModel("reviews", checkpoints.generic_labels(tmp_path / "reviews"))
    row, outcome = _serve(model, {"text": TEXTS[0], "explain": {"method": "attnlrp", "granularity": "sentence"}})
    assert model.reader(row, outcome).explained[0].drift
    assert not model.reader(row, pickle.loads(pickle.dumps(outcome))).explained[0].drift
    assert not ClassificationReader(model.config.labels)(row, outcome).explained[0].drift  # no tokenizer: no words
