"""Time budgets and deadlines at the library level (explainers/timing.py, explainers/deadline.py) and their serving
settings: the cost model, the refusal and what it says fits, a deadline passed on arrival or between chunks, and the
rows of a batch that are still answered, with the model left as it was found."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from explainers import (
    Deadline,
    DeadlineExceededError,
    ModelSpeed,
    RowExplanation,
    RowRequest,
    TimeBudgetError,
    available_methods,
    describe,
    estimate_seconds,
    explain,
    explain_batch,
    get_method,
)
from explainers.methods import Cost
from explainers.timing import SETUP_JOBS, check_time_budget
from serving_core.config import ConfigError, HandlerConfig
from serving_core.errors import from_explain_error
from serving_core.tasks.classify_schema import decode_row
from tests.conftest import build_bert

pytestmark = pytest.mark.usefixtures("one_torch_thread")


#: A model speed chosen for the arithmetic: 10 ms per call, 1 ms per token.
SPEED = ModelSpeed(call=0.01, token=0.001)


@dataclass(frozen=True)
class PassesAfter(Deadline):
    """A deadline that passes after ``checks`` checks (so the chunk where work stops does not depend on the clock)."""

    checks: int = 0
    seen: list[int] = field(default_factory=list, hash=False, compare=False)

    def remaining(self) -> float:
        self.seen.append(1)
        return 1.0 if len(self.seen) <= self.checks else -0.001


def _inputs(lengths: tuple[int, ...] = (12, 12)) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    width = max(lengths)
    ids = torch.randint(5, 60, (len(lengths), width), generator=generator)
    mask = torch.zeros_like(ids)
    for row, length in enumerate(lengths):
        mask[row, :length] = 1
    return {"input_ids": ids * mask, "attention_mask": mask}


def _state(model: Any) -> tuple[Any, ...]:
    parameters = [(name, p.detach().clone(), p.requires_grad) for name, p in model.named_parameters()]
    hooks = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks) for m in model.modules())
    return parameters, model.training, hooks, model.config._attn_implementation


def _same_state(first: tuple[Any, ...], second: tuple[Any, ...]) -> bool:
    names = [(name, grad) for name, _, grad in first[0]] == [(name, grad) for name, _, grad in second[0]]
    values = all(torch.equal(a, b) for (_, a, _), (_, b, _) in zip(first[0], second[0], strict=True))
    return names and values and first[1:] == second[1:]


def test_the_estimate_follows_the_declared_cost() -> None:
    # A gradient method: its share of the shared forward plus one grad-enabled forward and backward (3 forwards).
    length = 100
    forward = SPEED.call + SPEED.token * length
    assert estimate_seconds(SPEED, "grad_x_input", length, {}) == pytest.approx(4 * forward)
    # Integrated gradients: 4 forwards of work per path point, its copies batched internal_batch_size per call.
    ig = estimate_seconds(SPEED, "integrated_gradients", length, {"n_steps": 128, "internal_batch_size": 64})
    assert ig == pytest.approx((1 + 4 * 2) * SPEED.call + (1 + 4 * 128) * SPEED.token * length)
    # Occlusion erases each position in turn: its work grows with the square of the length.
    assert estimate_seconds(SPEED, "occlusion", 200, {}) > 3.5 * estimate_seconds(SPEED, "occlusion", 100, {})
    # Attention flow adds its solver's time to the setup's, in the machine's reference jobs, growing with the depth.
    instant = ModelSpeed(call=0.0, token=0.0, python=0.5, layers=4)
    solver = get_method("attention_flow").cost.solver(128, 4)
    assert estimate_seconds(instant, "attention_flow", 128, {}) == pytest.approx(0.5 * (SETUP_JOBS + solver))
    assert get_method("attention_flow").cost.solver(128, 8) > solver
    assert estimate_seconds(SPEED, "rollout", length, {}, rows=3) == pytest.approx(3 * 2 * forward)


def test_every_method_declares_a_cost_that_grows_with_its_options() -> None:
    for name in available_methods():
        cost = get_method(name).cost
        assert isinstance(cost, Cost) and cost.forwards({}, 16) > 0
    assert get_method("integrated_gradients").cost.forwards({"n_steps": 1024}, 16) > 1000
    assert get_method("smoothgrad").cost.forwards({"n_samples": 256}, 16) > 256


def test_a_row_over_budget_is_refused_with_the_largest_n_steps_that_fits() -> None:
    method = get_method("integrated_gradients")
    options = {"n_steps": 1024, "internal_batch_size": 64}
    with pytest.raises(TimeBudgetError) as caught:
        check_time_budget(SPEED, method, 100, options, 5.0, ["attnlrp", "rollout", "integrated_gradients"])
    message = str(caught.value)
    assert "time budget of 5.0 s" in message and "n_steps=1024" in message
    assert "methods that fit: attnlrp, rollout" in message
    fitting = int(message.split("n_steps <= ")[1].split(" ")[0])
    assert estimate_seconds(SPEED, method, 100, {**options, "n_steps": fitting}) <= 5.0
    assert estimate_seconds(SPEED, method, 100, {**options, "n_steps": fitting + 1}) > 5.0
    # A row that fits alone but not beside the rows already in its batch is told so.
    with pytest.raises(TimeBudgetError, match="alone it fits: retry"):
        check_time_budget(SPEED, get_method("attnlrp"), 100, {}, 5.0, admitted_s=4.9)
    assert check_time_budget(SPEED, get_method("attnlrp"), 100, {}, None) > 0


def test_explain_refuses_over_budget_before_any_work_and_leaves_the_model_as_found() -> None:
    model = build_bert()
    before = _state(model)
    rows: list[int] = []  # the rows of each forward: the speed's measurement runs 1 or 8, the request 3
    handle = model.register_forward_pre_hook(
        lambda module, args, kwargs: rows.append(int(kwargs["input_ids"].shape[0])), with_kwargs=True
    )
    try:
        with pytest.raises(TimeBudgetError, match=r"over the time budget of 0\.0 s"):
            explain(model, _inputs((12, 12, 12)), "integrated_gradients", n_steps=1024, time_budget_s=1e-6)
        assert rows and 3 not in rows
    finally:
        handle.remove()
    assert _same_state(before, _state(model))
    fits = explain(model, _inputs(), "grad_x_input", time_budget_s=1000.0)
    assert torch.equal(fits.scores, explain(model, _inputs(), "grad_x_input").scores)
    with pytest.raises(ValueError, match="time_budget_s must be a positive number"):
        explain(model, _inputs(), "grad_x_input", time_budget_s=0)


def test_explain_batch_refuses_the_row_over_budget_and_serves_the_others_as_alone() -> None:
    model = build_bert()
    inputs = _inputs((12, 9, 12))
    rows = [
        RowRequest("integrated_gradients", options={"n_steps": 1024}),
        RowRequest("attnlrp"),
        RowRequest(),
    ]
    result = explain_batch(model, inputs, rows, time_budget_s=2.0, speed=SPEED)
    assert isinstance(result.rows[0], TimeBudgetError)
    assert from_explain_error(result.rows[0]).code == "over_time_budget"
    assert result.rows[2] is None
    served = result.rows[1]
    alone = explain_batch(model, inputs, [RowRequest(), RowRequest("attnlrp"), RowRequest()])
    assert isinstance(served, RowExplanation) and isinstance(alone.rows[1], RowExplanation)
    torch.testing.assert_close(served.scores, alone.rows[1].scores)
    # Rows fitting alone are admitted in order until the batch's budget is spent.
    each = estimate_seconds(SPEED, "attnlrp", 12, {})
    crowded = explain_batch(model, inputs, [RowRequest("attnlrp")] * 3, time_budget_s=2.5 * each, speed=SPEED)
    assert [type(row).__name__ for row in crowded.rows] == ["RowExplanation", "RowExplanation", "TimeBudgetError"]
    assert "alone it fits" in str(crowded.rows[2])


def test_the_speed_is_measured_on_the_model_without_changing_it() -> None:
    model = build_bert()
    before = _state(model)
    speed = ModelSpeed.measure(model, describe(model), 48)
    assert speed.call > 0 and speed.token >= 0 and speed.python > 0 and speed.layers == 3
    assert _same_state(before, _state(model))
    # Without a speed given, a budget measures one: a cheap row is served.
    result = explain_batch(model, _inputs(), [RowRequest("rollout"), RowRequest()], time_budget_s=600.0)
    assert isinstance(result.rows[0], RowExplanation)


def test_a_deadline_passed_on_arrival_is_refused_without_work() -> None:
    model = build_bert()
    past = Deadline.within(-1.0)
    assert past.passed
    calls: list[int] = []
    handle = model.register_forward_pre_hook(lambda module, args: calls.append(1))
    try:
        with pytest.raises(DeadlineExceededError, match="before any work"):
            explain(model, _inputs(), "integrated_gradients", n_steps=1024, deadline=past)
        assert calls == []
    finally:
        handle.remove()
    rows = [RowRequest("integrated_gradients", options={"n_steps": 1024}, deadline=past), RowRequest("gae")]
    result = explain_batch(model, _inputs(), rows)
    assert isinstance(result.rows[0], DeadlineExceededError) and isinstance(result.rows[1], RowExplanation)
    assert from_explain_error(result.rows[0]).code == "deadline_exceeded"
    assert Deadline.at_unix(time.time() + 60).remaining() > 59


@pytest.mark.parametrize(
    ("method", "options", "stopped"),
    [
        ("integrated_gradients", {"n_steps": 8, "internal_batch_size": 1}, "before forward 3 of 8 "),
        ("smoothgrad", {"n_samples": 6, "internal_batch_size": 1}, "before forward 3 of 6 "),
        ("occlusion", {"internal_batch_size": 2}, "before the occluded copies 5-6 of 13 "),
    ],
)
def test_work_past_its_deadline_is_abandoned_between_chunks(method: str, options: dict[str, Any], stopped: str) -> None:
    model = build_bert()
    before = _state(model)
    inputs = _inputs((12,))
    # Checks: on arrival, then before each chunk; the deadline passes after two chunks ran.
    deadline = PassesAfter(expires=0.0, checks=3)
    with pytest.raises(DeadlineExceededError) as caught:
        explain(model, inputs, method, deadline=deadline, **options)
    assert stopped in str(caught.value) and len(deadline.seen) == 4
    assert _same_state(before, _state(model))
    # In a batch, the abandoned row answers the error and the other rows are served as they would be alone.
    batch = _inputs((12, 10))
    rows = [RowRequest(method, options=options, deadline=PassesAfter(expires=0.0, checks=4)), RowRequest("attnlrp")]
    result = explain_batch(model, batch, rows)
    assert isinstance(result.rows[0], DeadlineExceededError)
    alone = explain_batch(model, batch, [RowRequest(), RowRequest("attnlrp")])
    assert isinstance(result.rows[1], RowExplanation) and isinstance(alone.rows[1], RowExplanation)
    torch.testing.assert_close(result.rows[1].scores, alone.rows[1].scores)
    assert _same_state(before, _state(model))
    # A deadline far away changes nothing.
    later = explain(model, inputs, method, deadline=600.0, **options)
    torch.testing.assert_close(later.scores, explain(model, inputs, method, **options).scores)


def _yaml(**handler: Any) -> dict[str, Any]:
    return {"responseTimeout": 40, "handler": {"task": "text", "labels": ["a", "b"], **handler}}


def test_the_served_budget_defaults_to_half_the_response_timeout() -> None:
    assert HandlerConfig.from_model_yaml(_yaml()).time_budget_s == 20.0
    assert HandlerConfig.from_model_yaml({"handler": _yaml()["handler"]}).time_budget_s == 60.0  # TorchServe's 120 s
    assert HandlerConfig.from_model_yaml(_yaml(time_budget_s=2.5)).time_budget_s == 2.5
    with pytest.raises(ConfigError, match="time_budget_s must be a positive number"):
        HandlerConfig.from_model_yaml(_yaml(time_budget_s=0))
    for task in ("generation", "token_classification"):  # every task has its budget (tests/test_timing_tasks.py)
        labels = {"labels": ["O", "B-PER"]} if task == "token_classification" else {}
        assert HandlerConfig.from_model_yaml({"handler": {"task": task, **labels}}).time_budget_s == 60.0
        assert (
            HandlerConfig.from_model_yaml({"handler": {"task": task, **labels, "time_budget_s": 5}}).time_budget_s == 5
        )


def test_a_request_carries_its_deadline_in_unix_milliseconds() -> None:
    config = HandlerConfig.from_model_yaml(_yaml())
    due = int(time.time() * 1000) + 5000
    row = decode_row({"body": {"text": "hi", "explain": {"method": "attnlrp", "deadline_ms": due}}}, False, config)
    assert row.request.deadline is not None and 4 < row.request.deadline.remaining() <= 5.01
    assert decode_row({"body": {"text": "hi", "explain": {}}}, False, config).request.deadline is None
    for bad in ("soon", -1, 1.5, True):
        with pytest.raises(Exception, match="deadline_ms' must be the Unix time in milliseconds") as caught:
            decode_row({"body": {"text": "hi", "explain": {"deadline_ms": bad}}}, False, config)
        assert getattr(caught.value, "code", None) == "invalid_request"


def test_the_oip_door_gives_every_row_the_requests_deadline() -> None:
    from doors.kserve import oip

    config = HandlerConfig.from_model_yaml(_yaml())
    due = int(time.time() * 1000) + 5000
    texts = {"text": oip.Tensor("text", "BYTES", (2,), ["one", "two"])}
    rows = oip.decode_request(oip.OipRequest(texts, {"explain_method": "gae", "explain_deadline_ms": due}), config)
    deadlines = [row.request.deadline for row in rows if not isinstance(row, Exception)]
    assert len(deadlines) == 2 and all(d is not None and 4 < d.remaining() <= 5.01 for d in deadlines)
    with pytest.raises(Exception, match="explain_deadline_ms' must be the Unix time") as caught:
        oip.decode_request(oip.OipRequest(texts, {"explain_method": "gae", "explain_deadline_ms": "soon"}), config)
    assert getattr(caught.value, "code", None) == "invalid_request"
