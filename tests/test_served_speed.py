"""A model's speed kept up to date from the batches it serves (explainers/served_speed.py) and the admission that
rests on it: a probe measured at a bad moment is corrected by the first served batches (a classifier, a causal LM),
a row refused over the budget alone has the model probed again while no batch corrected it, and a written answer
whose explanation does not fit is served with its text and an explanation error."""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path
from typing import Any

import pytest
import torch

from explain_client.generation import Generation
from explain_client.protos import explain_messages
from explainers import (
    ModelSpeed,
    ServedSpeed,
    TimeBudgetError,
    describe,
    estimate_seconds,
    generation_seconds,
    get_method,
    work_kind,
)
from explainers.served_speed import ANY_KIND, HEADROOM, WINDOW, _quantile, scaled
from explainers.timing import check_time_budget
from serving_core.config import HandlerConfig
from serving_core.errors import RowError
from serving_core.tasks.classify_schema import DecodedRow, RowOutcome, decode_row
from serving_core.tasks.classify_service import ExplanationService
from serving_core.tasks.generation_service import GenerationService
from serving_core.wire import Encoding
from tests import checkpoints
from tests.generation_checkpoint import causal_lm, serve_rows

pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: A speed chosen for the arithmetic.
SPEED = ModelSpeed(call=0.01, token=0.001, python=0.001, layers=2, step=0.005)
#: A 17-token tweet (15 words and the classifier's two special tokens), as in the issue's concurrency run.
TWEET = " ".join((checkpoints.WORDS * 2)[:15])


def test_the_probe_is_scaled_by_the_recent_ratio_of_actual_to_estimated_seconds() -> None:
    served = ServedSpeed(SPEED)
    assert served.factor("attnlrp") == 1.0 and served.speed("attnlrp") is SPEED and served.batches == 0
    served.observe({"attnlrp": 10.0}, 0.5)  # the probe said 10 s, the batch took 0.5 s
    assert served.factor("attnlrp") == pytest.approx(HEADROOM * 0.05)
    assert served.factor("rollout") == 1.0  # a kind not served yet: the probe, which faster batches do not lower
    corrected, factor = served.speed("attnlrp"), HEADROOM * 0.05
    assert corrected.call == pytest.approx(SPEED.call * factor) and corrected.step == pytest.approx(SPEED.step * factor)
    assert estimate_seconds(corrected, "attnlrp", 20, {}) == pytest.approx(
        factor * estimate_seconds(SPEED, "attnlrp", 20, {})
    )
    # a mixed batch's ratio is kept for every kind, and for the kind that is at least half of it
    served.observe({"predict": 1.0, "rollout": 3.0}, 3.0)
    assert served.factor("rollout") == pytest.approx(HEADROOM * 0.75)
    assert served.factor("attnlrp") == pytest.approx(HEADROOM * 0.05)
    assert served.factor("predict") == served.factor(ANY_KIND) > 1.0  # slower batches raise it
    # the older batches are forgotten: a machine that became slow is followed
    for _ in range(WINDOW):
        served.observe({"attnlrp": 1.0}, 2.0)
    assert served.factor("attnlrp") == pytest.approx(HEADROOM * 2.0) and served.batches == WINDOW
    given = ServedSpeed(SPEED, learns=False)
    given.observe({"attnlrp": 10.0}, 0.5)
    assert given.factor("attnlrp") == 1.0 and given.batches == 0


def test_the_ratio_follows_batches_of_the_rows_length() -> None:
    served = ServedSpeed(SPEED)
    served.observe({"attnlrp": 1.0}, 0.1, {"attnlrp": 20})
    served.observe({"attnlrp": 1.0}, 0.04, {"attnlrp": 200})
    assert served.factor("attnlrp", 25) == pytest.approx(HEADROOM * 0.1)  # the batch of 20 tokens
    assert served.factor("attnlrp", 150) == pytest.approx(HEADROOM * 0.04)  # the batch of 200 tokens
    assert served.factor("attnlrp", 5) == pytest.approx(HEADROOM * (0.04 + 0.75 * 0.06))  # longer ones
    assert served.factor("attnlrp", 600) == pytest.approx(HEADROOM * 0.04 * 9)  # grown with the length beyond...
    assert served.factor("attnlrp", 4000) == pytest.approx(1.0)  # ... up to the probe's own estimate
    assert served.factor("attnlrp") == pytest.approx(HEADROOM * (0.04 + 0.75 * 0.06))  # any length: every batch


def test_the_quantile_is_the_percentile_cut_statistics_gives() -> None:
    generator = random.Random(7)
    for size in (1, 2, 3, 5, 16, 17):
        values = [generator.lognormvariate(0.0, 1.0) for _ in range(size)]
        for quantile in (0.0, 0.01, 0.25, 0.5, 0.75, 0.9, 0.999, 1.0):
            got = _quantile(values, quantile)
            if size == 1:
                assert got == values[0]
                continue
            cuts = statistics.quantiles(values, n=100, method="inclusive")
            assert got == cuts[min(max(round(quantile * 100) - 1, 0), 98)]  # the same float, not a close one
    with pytest.raises(statistics.StatisticsError):
        _quantile([], 0.75)


def test_a_ledger_records_the_batch_in_the_probes_terms() -> None:
    served = ServedSpeed(SPEED)
    served.observe({"attnlrp": 4.0}, 1.0)
    ledger = served.ledger()
    speed = ledger.speed("attnlrp")
    seconds = estimate_seconds(speed, "attnlrp", 20, {})
    ledger.add("attnlrp", seconds)
    assert ledger.estimated == pytest.approx(estimate_seconds(SPEED, "attnlrp", 20, {}))
    ledger.settle(ledger.estimated / 8)
    assert served.factor("attnlrp") == pytest.approx(
        HEADROOM * (0.125 + 0.75 * 0.125)
    )  # 0.125 and 0.25: the upper quartile


def test_a_ledger_admits_at_the_current_probe_once_it_is_measured_again() -> None:
    faster = scaled(SPEED, 0.5)
    served = ServedSpeed(SPEED, measure=lambda: faster, reprobe_s=0.0)
    served.observe({ANY_KIND: 4.0}, 8.0)  # every kind not served yet: raised by twice the probe's estimates
    ledger = served.ledger()
    first = ledger.speed("attnlrp", 20)
    assert ledger.speed("attnlrp", 20) is first and first.call == pytest.approx(SPEED.call * HEADROOM * 2.0)
    assert served.recheck("attnlrp")  # a row refused over the budget alone: the probe is measured again
    again = ledger.speed("attnlrp", 20)
    assert again.call == pytest.approx(faster.call * HEADROOM * 2.0)  # the new probe, at the factor as first read


def test_a_probe_no_batch_corrected_is_measured_again_and_the_faster_kept() -> None:
    fast = scaled(SPEED, 0.1)
    measured: list[ModelSpeed] = []

    def measure() -> ModelSpeed:
        measured.append(fast)
        return fast

    served = ServedSpeed(SPEED, measure=measure, reprobe_s=0.0)
    assert served.recheck() and served.probe is fast and len(measured) == 1
    assert not served.recheck()  # the new probe is not faster than itself: kept
    waiting = ServedSpeed(SPEED, measure=measure, reprobe_s=3600.0)
    assert not waiting.recheck() and waiting.probe is SPEED  # probed a moment ago
    corrected = ServedSpeed(SPEED, measure=measure, reprobe_s=0.0)
    corrected.observe({"attnlrp": 1.0}, 0.1)
    assert not corrected.recheck()  # served batches correct it: no probe needed
    assert not corrected.recheck("attnlrp")
    assert corrected.recheck("rollout") and corrected.probe is fast  # a kind no batch corrected: probed again
    assert corrected.factor("attnlrp") == pytest.approx(HEADROOM * 1.0)  # 0.1 of the old probe is 1.0 of the new


# ---- a classifier ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def classifier(tmp_path_factory: pytest.TempPathFactory) -> ExplanationService:
    folder = checkpoints.generic_labels(tmp_path_factory.mktemp("classifier") / "model")
    config = HandlerConfig(task="text", labels=("LABEL_0", "LABEL_1"), max_length=32, time_budget_s=30.0)
    service = ExplanationService(config, folder, torch.device("cpu"))
    assert service.served is not None and service.served.learns
    return service


def _classify(service: ExplanationService, bodies: list[dict[str, Any]]) -> list[RowOutcome]:
    rows: list[DecodedRow | RowError] = [
        decode_row({"body": json.dumps(body).encode()}, False, service.config) for body in bodies
    ]
    return service.run(rows, [Encoding.JSON] * len(rows))[0]


def test_a_slow_start_up_probe_is_corrected_by_the_batches_a_classifier_serves(classifier: ExplanationService) -> None:
    assert len(classifier.tokenizer(TWEET)["input_ids"]) == 17
    probe = classifier.speed
    assert probe is not None
    # as in the issue: each 17-token attnlrp row "needs about 6.3 s", a batch of eight really takes a fraction of it
    each = estimate_seconds(probe, "attnlrp", 17, {})
    slow = scaled(probe, 6.3 / each)
    classifier.served = ServedSpeed(slow)
    batch = [{"text": TWEET, "explain": {"method": "attnlrp"}}] * 8
    refused: list[int] = []
    for _ in range(6):
        outcomes = _classify(classifier, batch)
        codes = [outcome.error.code if outcome.error else None for outcome in outcomes]
        refused.append(codes.count("over_time_budget"))
        assert set(codes) <= {None, "over_time_budget"}
        if refused[-1]:
            messages = [outcome.error.message for outcome in outcomes if outcome.error]
            assert all("the batch it joined already needs" in message for message in messages)
    assert refused[0] == 4  # the probe's 6.3 s a row: four rows fill the 30 s budget
    assert refused[1:] == [0] * 5  # once a batch is served, its actual time corrects the estimate
    kind = work_kind("attnlrp", get_method("attnlrp").resolve_options({}, describe(classifier.model)))
    assert classifier.served.batches >= 5 and classifier.served.factor(kind) < 0.5


def test_a_row_over_the_budget_alone_has_a_stale_probe_measured_again(classifier: ExplanationService) -> None:
    probe = classifier.speed
    assert probe is not None
    slow = scaled(probe, 100.0 / estimate_seconds(probe, "attnlrp", 17, {}))  # "needs about 100 s" of 30
    classifier.served = ServedSpeed(slow, measure=classifier._probe, reprobe_s=3600.0)
    refused = _classify(classifier, [{"text": TWEET, "explain": {"method": "attnlrp"}}])[0]
    assert refused.error is not None and refused.error.code == "over_time_budget"
    assert "over the time budget of 30.0 s" in refused.error.message
    classifier.served = ServedSpeed(slow, measure=classifier._probe, reprobe_s=0.0)
    served = _classify(classifier, [{"text": TWEET, "explain": {"method": "attnlrp"}}])[0]
    assert served.error is None and served.method == "attnlrp"  # probed again, on a quieter moment
    assert classifier.served.probe.call < slow.call and classifier.served.batches == 1


# ---- a token classifier --------------------------------------------------------------------------------------------

ENTITIES_TEXT = "a slow rude waiter served cold food to john smith in london and paris"


def test_a_slow_start_up_probe_is_corrected_by_the_batches_a_token_classifier_serves(
    tmp_path: Path,
) -> None:
    from serving_core.tasks.token_service import TokenClassificationService

    folder = checkpoints.token_classifier(tmp_path / "ner")
    config = HandlerConfig(
        task="token_classification", labels=tuple(checkpoints.ENTITY_TAGS), max_length=32, time_budget_s=30.0
    )
    service = TokenClassificationService(config, folder, torch.device("cpu"))
    probe = service.speed
    assert probe is not None
    encoded = service._encode(ENTITIES_TEXT)
    bound = sum(not flag for flag in encoded.special)  # one entity per real token, at most
    each = estimate_seconds(probe, "attnlrp", len(encoded.offsets), {}, targets=bound)
    service.served = ServedSpeed(scaled(probe, 14.0 / each))  # each row "needs about 14 s" at its bound
    body = {"text": ENTITIES_TEXT, "explain": {"method": "attnlrp"}}
    refused = []
    for _ in range(4):
        rows: list[DecodedRow | RowError] = [
            decode_row({"body": json.dumps(body).encode()}, False, config) for _ in range(6)
        ]
        outcomes = service.run(rows, [Encoding.JSON] * 6)[0]
        codes = [outcome.error.code if outcome.error else None for outcome in outcomes]
        assert set(codes) <= {None, "over_time_budget"}
        refused.append(codes.count("over_time_budget"))
    assert refused[0] > 0 and refused[1:] == [0, 0, 0]


# ---- a causal LM ----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def writer(tmp_path_factory: pytest.TempPathFactory) -> GenerationService:
    folder = causal_lm(tmp_path_factory.mktemp("lm") / "model")
    config = HandlerConfig.from_model_yaml(
        {"handler": {"task": "generation", "max_length": 16, "max_new_tokens": 8, "default_new_tokens": 4,
                     "device": "cpu", "time_budget_s": 30.0}}
    )  # fmt: skip
    return GenerationService(config, Path(folder), torch.device("cpu"))


def test_a_slow_start_up_probe_is_corrected_by_the_batches_a_causal_lm_serves(writer: GenerationService) -> None:
    probe = writer.speed
    assert probe is not None
    request = {"prompt": "the service was", "max_new_tokens": 4, "explain": {"method": "attnlrp", "steps": [0]}}
    prompt = len(writer.tokenizer("the service was")["input_ids"])
    each = generation_seconds(probe, prompt, 4) + estimate_seconds(probe, "attnlrp", prompt + 4, {})
    writer.served = ServedSpeed(scaled(probe, 9.0 / each))  # each row "needs about 9 s": three fill 30 s
    refused = []
    for _ in range(5):
        answers = serve_rows(writer, writer.config, [request] * 6)
        codes = [answer.get("error", {}).get("code") for answer in answers]
        assert set(codes) <= {None, "over_time_budget"}
        refused.append(codes.count("over_time_budget"))
        assert all(answer["explanation"]["steps"] == [0] for answer in answers if "error" not in answer)
    assert refused[0] == 3 and refused[1:] == [0] * 4
    kind = work_kind("attnlrp", get_method("attnlrp").resolve_options({}, writer.arch))
    assert writer.served.factor("generate") < 0.5 and writer.served.factor(kind) < 0.5


def test_a_plain_answer_over_the_budget_alone_has_a_stale_probe_measured_again(writer: GenerationService) -> None:
    probe = writer.speed
    assert probe is not None
    prompt = len(writer.tokenizer("the service was")["input_ids"])
    slow = scaled(probe, 40.0 / generation_seconds(probe, prompt, 8))  # "needs about 40 s" of 30
    writer.served = ServedSpeed(slow, measure=writer._probe, reprobe_s=0.0)
    answer = serve_rows(writer, writer.config, [{"prompt": "the service was", "max_new_tokens": 8}])[0]
    assert "error" not in answer and len(answer["steps"]) == 8
    assert writer.served.probe.step < slow.step


#: A speed whose per-token time dominates: explaining every step of an answer costs far more than writing it.
HEAVY = ModelSpeed(call=0.001, token=0.01, python=0.0001, layers=2, step=0.001)


def test_a_written_answer_whose_explanation_is_over_the_budget_alone_has_a_stale_probe_measured_again(
    writer: GenerationService,
) -> None:
    """A probe that makes one explained step fit but not every step of the answer: the row is admitted before
    writing; once the answer is written, its explanation is over the budget at that probe, so the model is probed
    again and the explanation, which fits at the model's real speed, is served."""
    writer.config = HandlerConfig(**{**writer.config.__dict__, "time_budget_s": 30.0})
    prompt = len(writer.tokenizer("the service was")["input_ids"])
    method = get_method("attnlrp")
    every = estimate_seconds(HEAVY, method, prompt + 8, {}, targets=8)
    slow = scaled(HEAVY, 60.0 / every)  # every step "needs about 60 s" of 30 (HEAVY: the steps cost, not the writing)
    one = estimate_seconds(slow, method, prompt + 8, {}) + generation_seconds(slow, prompt, 8)
    assert one < 20.0  # one step fits: admitted before writing
    request = {"prompt": "the service was", "max_new_tokens": 8, "explain": {"method": "attnlrp"}}
    writer.served = ServedSpeed(slow, measure=writer._probe, reprobe_s=3600.0)  # probed a moment ago: not again
    kept = serve_rows(writer, writer.config, [request])[0]
    assert kept["explanation"]["error"]["code"] == "over_time_budget" and writer.served.probe is slow
    writer.served = ServedSpeed(slow, measure=writer._probe, reprobe_s=0.0)
    answer = serve_rows(writer, writer.config, [request])[0]
    assert "error" not in answer and "error" not in answer["explanation"], answer.get("explanation", {}).get("error")
    assert len(answer["steps"]) == 8 and all(step.get("scores") for step in answer["steps"])
    assert writer.served.probe.step < slow.step


def test_an_answer_whose_explanation_does_not_fit_is_served_with_its_text(writer: GenerationService) -> None:
    writer.speed = HEAVY  # as given: the arithmetic below does not follow this machine
    prompt = len(writer.tokenizer("the service was")["input_ids"])
    method = get_method("attnlrp")
    writing = generation_seconds(HEAVY, prompt, 8)
    one = estimate_seconds(HEAVY, method, prompt + 8, {})
    every = estimate_seconds(HEAVY, method, prompt + 8, {}, targets=8)
    assert 0.5 * (every - one) > writing
    budget = writing + one + 0.5 * (every - one)  # one explained step fits after writing; all eight do not
    writer.config = HandlerConfig(**{**writer.config.__dict__, "time_budget_s": budget})
    plain = {"prompt": "the service was", "max_new_tokens": 8}
    explained = {**plain, "explain": {"method": "attnlrp"}}  # every step: known once the answer is written
    answers = serve_rows(writer, writer.config, [explained, plain])
    answer = answers[0]
    assert "error" not in answer and answer["text"] == answers[1]["text"] and len(answer["steps"]) == 8
    error = answer["explanation"]["error"]
    assert answer["explanation"]["method"] == "attnlrp" and error["code"] == "over_time_budget"
    assert error["http_status"] == 413 and "the answer is written, but explaining its 8 steps" in error["message"]
    assert "explaining at most " in error["message"] and "of them fits" in error["message"]
    assert not any(step.get("scores") for step in answer["steps"])
    parsed = Generation.from_dict(answer)  # the client reads the answer and why it has no explanation
    assert parsed.text == answer["text"] and parsed.method == "attnlrp" and parsed.explanation_error is not None
    assert parsed.explanation_error.code == "over_time_budget" and parsed.to_dict()["explanation"]["error"] == error
    # the steps asked for that do fit are explained as they would be alone
    fitting = {**plain, "explain": {"method": "attnlrp", "steps": [0, 1]}}
    served = serve_rows(writer, writer.config, [fitting])[0]
    assert "error" not in served["explanation"] and served["explanation"]["steps"] == [0, 1]
    # over gRPC's protobuf: the answer and its explanation error
    message = explain_messages().ExplainRequest()
    message.generation.prompt = "the service was"
    message.generation.max_new_tokens = 8
    message.generation.explain.method = "attnlrp"
    proto = serve_rows(writer, writer.config, [message.SerializeToString()])[0]["protobuf"]
    assert not proto.error.code and proto.generation.text == answers[1]["text"]
    assert proto.generation.explanation_error.code == "over_time_budget" and proto.generation.method == "attnlrp"
    from_proto = Generation.from_protobuf(proto)
    assert from_proto.explanation_error is not None and from_proto.explanation_error.http_status == 413
    # over the budget even for one target: refused at once, before anything is written
    writer.config = HandlerConfig(**{**writer.config.__dict__, "time_budget_s": writing + one * 0.5})
    refused = serve_rows(writer, writer.config, [explained])[0]
    assert refused["error"]["code"] == "over_time_budget" and "8 targets" in refused["error"]["message"]


def test_a_refusal_beside_the_batch_says_alone_it_fits() -> None:
    with pytest.raises(TimeBudgetError, match="alone it fits: retry") as caught:
        check_time_budget(SPEED, get_method("attnlrp"), 100, {}, 5.0, admitted_s=4.9)
    assert caught.value.beside
    with pytest.raises(TimeBudgetError, match="over the time budget") as caught:
        check_time_budget(SPEED, get_method("attnlrp"), 100, {}, 0.01)
    assert not caught.value.beside
