"""Time budgets and deadlines for the token-level tasks: a token classifier's entities and a causal LM's generated
steps (explainers/timing.py's targets and generation estimates, serving_core's token and generation services, the
handler's deadline header and the protobuf field). A row over the budget is refused before any work with what fits,
a row past its deadline is answered ``deadline_exceeded``, and the batch's other rows are served as if alone."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from explain_client.protos import explain_messages
from explainers import Deadline, DeadlineExceededError, ModelSpeed, estimate_seconds, explain_tokens, get_method
from explainers.timing import check_generation_budget, generation_seconds
from serving_core.config import HandlerConfig
from serving_core.errors import RowError
from serving_core.tasks.classify_schema import DecodedRow, decode_row
from serving_core.tasks.generation_schema import decode_generation_row
from serving_core.tasks.generation_service import GenerationService
from serving_core.tasks.generation_stopping import stopper
from serving_core.tasks.token_schema import TokenOutcome
from serving_core.tasks.token_service import TokenClassificationService
from serving_core.wire import Encoding
from tests import checkpoints
from tests.generation_checkpoint import causal_lm, serve_rows

#: A model speed chosen for the arithmetic: 10 ms per call, 1 ms per token, 1 ms per Python job, 5 ms per step.
SPEED = ModelSpeed(call=0.01, token=0.001, python=0.001, layers=2, step=0.005)
TEXT = "a slow rude waiter served cold food to john smith in london and paris"


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_each_further_target_adds_its_backward_and_occlusion_shares_its_copies() -> None:
    for method, options in (("attnlrp", {}), ("integrated_gradients", {"n_steps": 16, "internal_batch_size": 8})):
        one = estimate_seconds(SPEED, method, 20, options)
        five = estimate_seconds(SPEED, method, 20, options, targets=5)
        added = get_method(method).cost.target_forwards(options, 20)
        assert added > 0 and five == pytest.approx(one + 4 * added * SPEED.token * 20)
    occlusion = {"baseline_token_id": -1, "internal_batch_size": 8}
    assert estimate_seconds(SPEED, "occlusion", 20, occlusion, targets=9) == estimate_seconds(
        SPEED, "occlusion", 20, occlusion
    )  # every occluded copy's forward gives every target's drop
    assert estimate_seconds(SPEED, "attention", 20, {}, targets=9) == estimate_seconds(SPEED, "attention", 20, {})


def test_writing_costs_a_step_per_token_and_the_refusal_names_what_fits() -> None:
    assert generation_seconds(SPEED, 10, 0) == 0.0
    assert generation_seconds(SPEED, 10, 40) > generation_seconds(SPEED, 10, 20) > SPEED.forward_seconds(10)
    budget = generation_seconds(SPEED, 10, 20)
    assert check_generation_budget(SPEED, 10, 20, budget) == budget
    with pytest.raises(Exception, match=r"writing 40 tokens .* over the time budget .*max_new_tokens <= 20 fits"):
        check_generation_budget(SPEED, 10, 40, budget)
    with pytest.raises(Exception, match="alone it fits: retry"):
        check_generation_budget(SPEED, 10, 20, budget, admitted_s=budget / 2)


# ---- token classification ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tagger(tmp_path_factory: pytest.TempPathFactory) -> TokenClassificationService:
    folder = checkpoints.token_classifier(tmp_path_factory.mktemp("ner") / "model")
    config = HandlerConfig(
        task="token_classification", labels=tuple(checkpoints.ENTITY_TAGS), max_length=32, time_budget_s=1.0
    )
    service = TokenClassificationService(config, folder, torch.device("cpu"))
    assert service.speed is not None  # measured at load
    service.speed = SPEED  # the arithmetic below does not depend on this machine's speed
    return service


def _token_rows(config: HandlerConfig, bodies: list[Any]) -> list[DecodedRow | RowError]:
    rows: list[DecodedRow | RowError] = []
    for body in bodies:
        try:
            rows.append(decode_row({"body": json.dumps(body).encode()}, False, config))
        except RowError as error:
            rows.append(error)
    return rows


def _serve_tokens(service: TokenClassificationService, bodies: list[Any]) -> list[TokenOutcome]:
    return service.run(_token_rows(service.config, bodies), [Encoding.JSON] * len(bodies))[0]


def _entities(outcome: TokenOutcome) -> list[tuple[str, list[float] | None]]:
    return [(entity.text, entity.scores) for entity in outcome.entities]


def _with_budget(service: TokenClassificationService, budget: float) -> TokenClassificationService:
    service.config = HandlerConfig(**{**service.config.__dict__, "time_budget_s": budget})
    return service


def test_a_row_over_the_budget_is_refused_and_the_others_are_served_as_alone(
    tagger: TokenClassificationService,
) -> None:
    service = _with_budget(tagger, 1.0)
    expensive = {"text": TEXT, "explain": {"method": "integrated_gradients", "n_steps": 1024}}
    cheap = {"text": TEXT, "explain": {"method": "attnlrp"}}
    both = _serve_tokens(service, [{"text": TEXT}, expensive, cheap])
    assert both[1].error is not None and both[1].error.code == "over_time_budget"
    assert both[1].error.http_status == 413 and both[1].method == "integrated_gradients"
    message = both[1].error.message
    assert "over the time budget of 1.0 s" in message and "n_steps <= " in message and "targets" in message
    assert both[0].error is None and both[2].error is None and both[2].method == "attnlrp"
    alone = _serve_tokens(service, [cheap])[0]
    assert _entities(both[2]) == _entities(alone) and both[0].entities[0].scores is None


def test_a_row_counted_for_its_entities_fits_where_one_per_token_would_not(
    tagger: TokenClassificationService,
) -> None:
    request = {"text": TEXT, "explain": {"method": "integrated_gradients", "n_steps": 8, "internal_batch_size": 8}}
    row = _token_rows(tagger.config, [request])[0]
    assert isinstance(row, DecodedRow)
    encoded = tagger._encode(TEXT)
    length = len(encoded.offsets)
    entities = len(tagger.predicted_spans([encoded])[0])
    real = sum(not flag for flag in encoded.special)
    options = get_method("integrated_gradients").resolve_options(row.request.options, tagger.arch)
    counted = estimate_seconds(SPEED, "integrated_gradients", length, options, targets=entities)
    bound = estimate_seconds(SPEED, "integrated_gradients", length, options, targets=real)
    assert 0 < entities < real and counted < bound
    service = _with_budget(tagger, (counted + bound) / 2)
    served = _serve_tokens(service, [request])[0]
    assert served.error is None and len(served.entities) == entities
    inputs = tagger.tokenizer([TEXT], return_tensors="pt", return_special_tokens_mask=True, truncation=True,
                              max_length=32)  # fmt: skip
    local = explain_tokens(tagger.model, dict(inputs), method="integrated_gradients", n_steps=8)
    for number, entity in enumerate(served.entities):
        expected = local.scores[0, number, :length].tolist()
        assert entity.scores == pytest.approx(expected, abs=1e-5)  # the counted spans are the ones explained
    refused = _serve_tokens(_with_budget(tagger, counted * 0.9), [request])[0]
    assert refused.error is not None and refused.error.code == "over_time_budget"
    assert f"and {entities} targets" in refused.error.message


def test_a_deadline_passed_on_arrival_or_during_the_work_answers_deadline_exceeded(
    tagger: TokenClassificationService,
) -> None:
    service = _with_budget(tagger, 10_000.0)
    past = int(time.time() * 1000) - 1000
    soon = int(time.time() * 1000) + 300
    bodies = [
        {"text": TEXT, "explain": {"method": "attnlrp", "deadline_ms": past}},
        {"text": TEXT, "explain": {"method": "integrated_gradients", "n_steps": 1024, "internal_batch_size": 1,
                                   "deadline_ms": soon}},
        {"text": TEXT, "explain": {"method": "attnlrp"}},
    ]  # fmt: skip
    started = time.perf_counter()
    outcomes = _serve_tokens(service, bodies)
    assert time.perf_counter() - started < 60
    assert [outcome.error.code if outcome.error else None for outcome in outcomes] == [
        "deadline_exceeded", "deadline_exceeded", None,
    ]  # fmt: skip
    assert outcomes[1].error is not None and "abandoned before" in outcomes[1].error.message
    assert outcomes[1].error.http_status == 504 and outcomes[2].method == "attnlrp"


def test_explain_tokens_takes_a_deadline(tagger: TokenClassificationService) -> None:
    inputs = dict(tagger.tokenizer([TEXT], return_tensors="pt", return_special_tokens_mask=True))
    with pytest.raises(DeadlineExceededError, match="abandoned before any work"):
        explain_tokens(tagger.model, inputs, method="attnlrp", deadline=Deadline.within(-1.0))
    assert explain_tokens(tagger.model, inputs, method="attnlrp", deadline=30.0).scores.shape[0] == 1


# ---- generation ----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def writer(tmp_path_factory: pytest.TempPathFactory) -> GenerationService:
    folder = causal_lm(tmp_path_factory.mktemp("lm") / "model")
    config = HandlerConfig.from_model_yaml(
        {"responseTimeout": 2, "handler": {"task": "generation", "max_length": 16, "max_new_tokens": 8,
                                            "default_new_tokens": 4, "device": "cpu"}}
    )  # fmt: skip
    assert config.time_budget_s == 1.0  # half the response timeout, as for every task
    service = GenerationService(config, Path(folder), torch.device("cpu"))
    assert service.speed is not None and service.speed.step > 0  # a cached step, measured at load
    service.speed = SPEED
    return service


def _gen_budget(service: GenerationService, budget: float) -> GenerationService:
    service.config = HandlerConfig(**{**service.config.__dict__, "time_budget_s": budget})
    return service


def _code(answer: dict[str, Any]) -> str | None:
    return answer.get("error", {}).get("code")


def test_a_generation_row_is_estimated_for_its_tokens_and_steps(writer: GenerationService) -> None:
    service = _gen_budget(writer, 0.5)
    expensive = {"prompt": "the cat", "max_new_tokens": 8,
                 "explain": {"method": "integrated_gradients", "n_steps": 1024}}  # fmt: skip
    plain = {"prompt": "the cat", "max_new_tokens": 8}
    cheap = {"prompt": "the dog", "max_new_tokens": 4, "explain": {"method": "attnlrp", "steps": [0]}}
    answers = serve_rows(service, service.config, [plain, expensive, cheap])
    assert [_code(answer) for answer in answers] == [None, "over_time_budget", None]
    message = answers[1]["error"]["message"]
    assert "8 targets" in message and "generating them" in message and "over the time budget of 0.5 s" in message
    alone = serve_rows(service, service.config, [cheap])[0]
    assert answers[2]["steps"][0]["scores"] == alone["steps"][0]["scores"]
    assert answers[0]["text"] == serve_rows(service, service.config, [plain])[0]["text"]
    # writing alone can be over the budget: the refusal names the most new tokens that fit
    tight = _gen_budget(writer, generation_seconds(SPEED, 3, 2) * 1.01)
    refused = serve_rows(tight, tight.config, [{"prompt": "the cat", "max_new_tokens": 8}])[0]
    assert _code(refused) == "over_time_budget" and "max_new_tokens <= " in refused["error"]["message"]


def test_a_generation_row_past_its_deadline_is_answered_deadline_exceeded(writer: GenerationService) -> None:
    service = _gen_budget(writer, 10_000.0)
    past = int(time.time() * 1000) - 1000
    soon = int(time.time() * 1000) + 300
    requests = [
        {"prompt": "the cat", "deadline_ms": past},
        {"prompt": "the cat", "max_new_tokens": 2,
         "explain": {"method": "integrated_gradients", "n_steps": 1024, "internal_batch_size": 1,
                     "deadline_ms": soon}},
        {"prompt": "the dog", "explain": {"method": "attnlrp"}},
    ]  # fmt: skip
    answers = serve_rows(service, service.config, requests)
    assert [_code(answer) for answer in answers] == ["deadline_exceeded", "deadline_exceeded", None]
    assert "abandoned before" in answers[1]["error"]["message"]
    message = explain_messages()
    request = message.ExplainRequest(deadline_ms=past)
    request.generation.prompt = "the cat"
    assert _code(serve_rows(service, service.config, [{"prompt": "the cat"}])[0]) is None
    proto = serve_rows(service, service.config, [request.SerializeToString()])[0]["protobuf"]
    assert proto.error.code == "deadline_exceeded"


def test_a_row_whose_deadline_passes_while_it_is_written_stops_there(writer: GenerationService) -> None:
    late: list[int] = []
    eos = next(iter(writer.eos))
    stopped = stopper(
        writer.tokenizer,
        writer.eos,
        [(), (), ()],
        [Deadline.within(-1.0), Deadline.within(-1.0), None],
        [8, 8, 8],
        late.append,
    )
    assert stopped is not None
    tokens = torch.tensor([[5, 6], [5, eos], [5, 6]])  # row 1 has just written its EOS: it is answered
    assert stopped(tokens).tolist() == [True, False, False] and late == [0]
    assert stopped(torch.tensor([[5, 6, 7], [5, eos, eos], [5, 6, 7]])).tolist() == [False, False, False]
    assert late == [0]  # told once
    assert stopper(writer.tokenizer, writer.eos, [(), ()], [None, None], [8, 8], late.append) is None


def test_the_deadline_header_and_the_body_field_the_earlier_wins(writer: GenerationService) -> None:
    from doors.torchserve.handler import _decoded
    from serving_core.tasks.generation import GENERATION

    class _Context:
        def __init__(self, headers: dict[str, str]) -> None:
            self.headers = headers

        def get_request_header(self, index: int, name: str) -> str | None:
            return self.headers.get(name)

        def get_all_request_header(self, index: int) -> dict[str, str]:
            return self.headers

    config = writer.config
    now = int(time.time() * 1000)
    body = {"body": json.dumps({"prompt": "hi", "deadline_ms": now + 60_000}).encode()}
    row = _decoded(GENERATION, body, _Context({"Explain-Deadline-Ms": str(now + 5000)}), 0, config)
    assert row.deadline is not None and 4 < row.deadline.remaining() <= 5.01
    row = _decoded(GENERATION, body, _Context({}), 0, config)
    assert row.deadline is not None and row.deadline.remaining() > 50
    with pytest.raises(RowError, match="explain-deadline-ms header"):
        _decoded(GENERATION, body, _Context({"explain-deadline-ms": "soon"}), 0, config)
    decoded = decode_generation_row({"body": json.dumps({"prompt": "hi"}).encode()}, False, config)
    assert decoded.deadline is None
