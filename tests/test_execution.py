"""Running a plan (explainers/execution.py), alone: the forwards it runs are exactly the plan's passes, and each
group's scores are its method's on its rows, whichever pass the plan puts them in.

Planning is tested in tests/test_plan.py; the whole of explain_batch in tests/test_explainers.py,
tests/test_fused_attention.py and tests/test_unsure.py.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor

from explainers import RowSkipped, describe, explain, get_method, prediction_confidence
from explainers.api import _real_tokens
from explainers.architectures.attention import fused_implementation
from explainers.capture import EMBEDDING_GRADIENTS
from explainers.execution import Execution, execute
from explainers.inputs import token_mask, validate_inputs
from explainers.plan import Ask, BatchPlan, Group, Pass, plan_batch

from .arch_zoo import VARIANTS, row_alone, text_batch

SDPA = "sdpa"
GAE = get_method("gae")
ATTNLRP = get_method("attnlrp")
ROLLOUT = get_method("rollout")
IG = get_method("integrated_gradients")


def _model() -> Any:
    """The tiny float64 BERT of the zoo, loaded with sdpa (so the plan has a fused attention to put rows on)."""
    model = next(variant for variant in VARIANTS if variant.name == "bert").build()
    model.config._attn_implementation_internal = SDPA
    return model


class _Forwards:
    """Records every forward of a model: its batch size and whether gradients were enabled."""

    def __init__(self, model: Any) -> None:
        self.calls: list[tuple[int, bool]] = []
        self.handle = model.register_forward_pre_hook(self._record, with_kwargs=True)

    def _record(self, module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        self.calls.append((int(kwargs["input_ids"].shape[0]), torch.is_grad_enabled()))

    def __enter__(self) -> _Forwards:
        return self

    def __exit__(self, *exc: object) -> None:
        self.handle.remove()


def _run(model: Any, batch: dict[str, Tensor], plan: BatchPlan, targets: Tensor | None = None) -> Execution:
    arch = describe(model)
    validated = validate_inputs(arch, model, batch)
    mask = token_mask(arch, validated, model)

    def resolve(logits: Tensor) -> Tensor:
        return logits.argmax(dim=-1) if targets is None else targets

    return execute(model, arch, validated, mask, plan, resolve)


def _assert_rows_as_alone(model: Any, batch: dict[str, Tensor], done: Execution, targets: Tensor | None = None) -> None:
    """Every scored row equals its method explained on that row alone (padding removed)."""
    mask = batch["attention_mask"].bool()
    for scored in done.groups:
        for position, row in enumerate(scored.group.rows):
            target = None if targets is None else int(targets[row])
            options: dict[str, Any] = dict(scored.group.options)
            alone = explain(model, row_alone(batch, row), method=scored.group.method.name, target=target, **options)
            expected = alone.scores[0]
            got = scored.scores[position][mask[row]]
            assert torch.allclose(got, expected, atol=1e-9 * float(expected.abs().max()), rtol=0), (scored.group, row)
            assert int(done.targets[row]) == int(alone.target[0])


def test_the_forwards_are_the_plans_passes() -> None:
    """A hand-made plan (gae and attnlrp rows each in a pass of their own after a shared forward without gradients):
    execution runs exactly those three forwards, and each row gets its method's scores."""
    model = _model()
    assert fused_implementation(model) == SDPA
    batch = text_batch(model)
    plan = BatchPlan(
        groups=(Group(GAE, {"start_layer": 0}, (0, 1)), Group(ATTNLRP, {}, (2, 3))),
        shared=Pass(frozenset(), None, SDPA, ()),
        own=(Pass(GAE.needs, None, None, (0, 1)), Pass(ATTNLRP.needs, ATTNLRP.rules, SDPA, (2, 3))),
        fused=SDPA,
        below={},
    )
    with _Forwards(model) as forwards:
        done = _run(model, batch, plan)
    assert forwards.calls == [(4, False), (2, True), (2, True)]
    assert set(done.seconds) == {"forward", "backward"} and done.skipped == {}
    with torch.no_grad():
        torch.testing.assert_close(done.logits, model(**batch).logits, rtol=0, atol=1e-10)
    _assert_rows_as_alone(model, batch, done)


def test_a_shared_gradient_pass_is_one_forward_with_its_backward() -> None:
    model = _model()
    batch = text_batch(model)
    plan = plan_batch({row: Ask(ATTNLRP, {}) for row in range(4)}, fused=SDPA)
    with _Forwards(model) as forwards:
        done = _run(model, batch, plan)
    assert forwards.calls == [(4, True)]
    _assert_rows_as_alone(model, batch, done)


def test_the_same_rows_give_the_same_scores_in_any_pass() -> None:
    """gae rows differentiated in the shared forward, or in a pass of their own after it: the same scores."""
    model = _model()
    batch = text_batch(model)
    groups = (Group(GAE, {"start_layer": 0}, (0, 1, 2, 3)),)
    shared = BatchPlan(groups, Pass(GAE.needs, None, None, (0, 1, 2, 3)), (), SDPA, {})
    own = BatchPlan(groups, Pass(frozenset(), None, SDPA, ()), (Pass(GAE.needs, None, None, (0, 1, 2, 3)),), SDPA, {})
    first, second = _run(model, batch, shared), _run(model, batch, own)
    torch.testing.assert_close(first.groups[0].scores, second.groups[0].scores, rtol=0, atol=1e-12)


def test_the_rows_explained_only_when_unsure_are_decided_from_the_shared_forward() -> None:
    model = _model()
    batch = text_batch(model)
    with torch.no_grad():
        confidence = prediction_confidence(model(**batch).logits, "single_label").tolist()
    below = sorted(confidence)[2]  # two rows below it, two not
    unsure = [row for row in range(4) if confidence[row] < below]
    asks = {row: Ask(GAE, {"start_layer": 0}, below) for row in range(3)} | {3: Ask(ROLLOUT, {"start_layer": 0}, below)}
    with _Forwards(model) as forwards:
        done = _run(model, batch, plan_batch(asks, fused=SDPA))
    gae_unsure = [row for row in unsure if row < 3]
    assert forwards.calls == [(4, False)] + ([(len(gae_unsure), True)] if gae_unsure else [])
    assert done.skipped == {
        row: RowSkipped("gae" if row < 3 else "rollout", pytest.approx(confidence[row], abs=1e-9), below)  # type: ignore[arg-type]
        for row in range(4)
        if row not in unsure
    }
    assert sorted(row for scored in done.groups for row in scored.group.rows) == unsure
    _assert_rows_as_alone(model, batch, done)


def test_the_targets_are_the_resolvers_and_forwards_of_their_own_run_when_scored() -> None:
    """Explicit targets reach every group; integrated gradients' rows run their path forwards (grad-enabled, on the
    copies of their rows) after the shared forward, without a gradient pass in the plan."""
    model = _model()
    batch = text_batch(model)
    targets = torch.tensor([2, 0, 1, 2])
    options = {"n_steps": 3, "internal_batch_size": 64}
    plan = plan_batch({0: Ask(IG, options), 2: Ask(IG, options), 3: Ask(ROLLOUT, {"start_layer": 1})}, fused=SDPA)
    assert plan.own == () and EMBEDDING_GRADIENTS not in plan.shared.needs
    with _Forwards(model) as forwards:
        done = _run(model, batch, plan, targets)
    assert forwards.calls == [(4, False), (2 * 3, True)], "the shared forward, then the path points of rows 0 and 2"
    assert done.targets.tolist() == targets.tolist()
    _assert_rows_as_alone(model, batch, done, targets)


def test_each_rows_real_tokens_index_the_elements_its_mask_picks() -> None:
    mask = torch.tensor(
        [
            [1, 1, 1, 0, 0],  # right padding
            [0, 0, 1, 1, 1],  # left padding
            [1, 1, 1, 1, 1],  # none
            [0, 1, 0, 1, 0],  # real tokens apart: indexed by the mask itself
            [0, 0, 0, 0, 0],  # no real token
        ]
    )
    scores = torch.arange(25.0).reshape(5, 5)
    real = _real_tokens(mask)
    assert real[:3] == [slice(0, 3), slice(2, 5), slice(0, 5)]
    assert isinstance(real[3], Tensor)
    for row, index in enumerate(real):
        assert torch.equal(scores[row][index], scores[row][mask[row].bool()])
