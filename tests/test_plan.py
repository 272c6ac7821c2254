"""Planning a served batch (explainers/plan.py), alone: which rows share which pass, from the rows' requests and their
methods' capabilities only (no model, no tensors). The grouping every head's batch goes through (group_rows: classifier
rows, a token classifier's rows, a causal LM's steps, sums and spans) is tested first; then the classifier's passes.

The execution of a plan is tested in tests/test_execution.py; the whole of explain_batch (batched == alone, one shared
forward) in tests/test_explainers.py, tests/test_fused_attention.py and tests/test_unsure.py.
"""

from __future__ import annotations

from explainers import Deadline, GroupKey, RowGroup, RowSkipped, get_method, group_rows
from explainers.capture import ACTIVATIONS, ATTENTION_GRADIENTS, ATTENTIONS, EMBEDDING_GRADIENTS
from explainers.plan import Ask, BatchPlan, Group, Pass, pass_kind, plan_batch

GAE = get_method("gae")
RELEVANCE = get_method("relevance")
ROLLOUT = get_method("rollout")
ATTENTION = get_method("attention")
GRAD_X_INPUT = get_method("grad_x_input")
ATTNLRP = get_method("attnlrp")
CP_LRP = get_method("cp_lrp")
IG = get_method("integrated_gradients")
SDPA = "sdpa"


def _ask(method: str, below: float | None = None, **options: int) -> Ask:
    chosen = get_method(method)
    defaults = {"start_layer": 0, "layer": -1, "n_steps": 50, "internal_batch_size": 64}
    resolved = {option.name: options.get(option.name, defaults[option.name]) for option in chosen.options}
    return Ask(chosen, resolved, below)


SOON = Deadline(100.0)
LATER = Deadline(200.0)


def test_rows_with_one_key_form_one_group_in_the_order_of_their_first_row() -> None:
    gae = GroupKey.of("gae", {"start_layer": 0})
    rollout = GroupKey.of("rollout", {"start_layer": 1})
    groups = group_rows({3: gae, 0: rollout, 1: gae, 4: rollout, 2: GroupKey.of("gae", {"start_layer": 1})})
    assert groups == (
        RowGroup(rollout, (0, 4)),
        RowGroup(gae, (1, 3)),
        RowGroup(GroupKey.of("gae", {"start_layer": 1}), (2,)),
    ), "rows ascending within a group; groups in the order of their first row; options are part of the key"
    assert group_rows({}) == ()


def test_a_key_sorts_its_options_so_their_order_does_not_split_a_group() -> None:
    assert GroupKey.of("integrated_gradients", {"n_steps": 3, "internal_batch_size": 8}) == GroupKey.of(
        "integrated_gradients", {"internal_batch_size": 8, "n_steps": 3}
    )
    assert GroupKey.of("gae", {"start_layer": 0}).options == (("start_layer", 0),)


def test_a_token_classifiers_rows_group_by_prediction_method_and_deadline() -> None:
    predict = GroupKey.of(None, {}, "entities")
    explain = GroupKey.of("attnlrp", {}, "entities")
    keys = {
        0: predict,
        1: explain,
        2: GroupKey.of(None, {}, "entities", deadline=SOON),
        3: predict,
        4: GroupKey.of("attnlrp", {}, "entities", deadline=SOON),
        5: explain,
        6: GroupKey.of("attnlrp", {}, "entities", deadline=LATER),
    }
    assert [(group.key.method, group.key.deadline, group.rows) for group in group_rows(keys)] == [
        (None, None, (0, 3)),  # the predictions: one forward, nothing explained
        ("attnlrp", None, (1, 5)),
        (None, SOON, (2,)),  # a deadline is abandoned with its group, so it never joins another's
        ("attnlrp", SOON, (4,)),
        ("attnlrp", LATER, (6,)),
    ]


def test_a_causal_lms_rows_group_by_target_kind_summed_steps_and_contrast() -> None:
    steps = GroupKey.of("attnlrp", {}, "steps")
    keys = {
        0: steps,
        1: GroupKey.of("attnlrp", {}, "steps", contrast=True),
        2: GroupKey.of("attnlrp", {}, "sum", summed=(0, None)),
        3: GroupKey.of("attnlrp", {}, "sum", summed=(1, 3)),
        4: GroupKey.of("attnlrp", {}, "spans"),
        5: steps,  # its own steps (which columns it wants) are its share of the group's targets, not its key
        6: GroupKey.of("attnlrp", {}, "sum", summed=(0, None)),
        7: GroupKey.of("attnlrp", {}, "spans"),
    }
    assert [(group.key.target, group.key.summed, group.key.contrast, group.rows) for group in group_rows(keys)] == [
        ("steps", None, False, (0, 5)),
        ("steps", None, True, (1,)),  # foils change every target: a backward of its own
        ("sum", (0, None), False, (2, 6)),
        ("sum", (1, 3), False, (3,)),  # another sum is another objective
        ("spans", None, False, (4, 7)),
    ]


def test_a_mixed_batch_never_groups_rows_that_differ_in_any_part_of_their_key() -> None:
    """Every head's keys through one planner: a group's rows have one key, and every row with that key is in it."""
    keys = {
        0: GroupKey.of("gae", {"start_layer": 0}),
        1: GroupKey.of("gae", {"start_layer": 0}, when_unsure=True),
        2: GroupKey.of("gae", {"start_layer": 0}, "entities"),
        3: GroupKey.of("gae", {"start_layer": 0}, "steps"),
        4: GroupKey.of("gae", {"start_layer": 0}, deadline=SOON),
        5: GroupKey.of("gae", {"start_layer": 1}),
        6: GroupKey.of("grad_x_input", {}, "steps", contrast=True),
        7: GroupKey.of(None, {}, "entities"),
        8: GroupKey.of("gae", {"start_layer": 0}),
        9: GroupKey.of("gae", {"start_layer": 0}, "steps"),
    }
    groups = group_rows(keys)
    assert [group.rows for group in groups] == [(0, 8), (1,), (2,), (3, 9), (4,), (5,), (6,), (7,)]
    assert sorted(row for group in groups for row in group.rows) == sorted(keys)
    assert all(keys[row] == group.key for group in groups for row in group.rows)


def test_the_classifiers_plan_groups_its_rows_through_the_one_planner() -> None:
    asks = {
        4: _ask("gae"),
        1: _ask("gae", below=0.5),
        2: _ask("gae"),
        0: _ask("rollout", start_layer=1),
        3: _ask("gae", start_layer=1),
    }
    keys = {
        row: GroupKey.of(ask.method.name, ask.options, when_unsure=ask.below is not None, deadline=ask.deadline)
        for row, ask in asks.items()
    }
    plan = plan_batch(asks, fused=None)
    assert [(group.method.name, dict(group.options), group.rows, group.when_unsure) for group in plan.groups] == [
        (group.key.method, dict(group.key.options), group.rows, group.key.when_unsure) for group in group_rows(keys)
    ]
    assert [group.rows for group in plan.groups] == [(0,), (1,), (2, 4), (3,)]


def test_rows_that_all_need_one_kind_of_gradient_share_the_forward_and_its_backward() -> None:
    plan = plan_batch({0: _ask("gae"), 1: _ask("gae"), 2: _ask("gae", start_layer=1)}, fused=None)
    assert plan.groups == (
        Group(GAE, {"start_layer": 0}, (0, 1)),
        Group(GAE, {"start_layer": 1}, (2,)),
    ), "grouped by method and options, in the order of their first row"
    assert plan.shared == Pass(frozenset({ATTENTIONS, ATTENTION_GRADIENTS}), None, None, (0, 1, 2))
    assert plan.own == () and plan.below == {}


def test_the_fused_kinds_share_the_forward_with_their_rules() -> None:
    plan = plan_batch({0: _ask("attnlrp"), 1: _ask("attnlrp")}, fused=SDPA)
    assert plan.shared == Pass(frozenset({EMBEDDING_GRADIENTS}), ATTNLRP.rules, SDPA, (0, 1))
    assert plan.own == ()


def test_a_prediction_only_row_keeps_the_shared_forward_free_of_gradients() -> None:
    plan = plan_batch({0: _ask("attnlrp"), 3: _ask("attnlrp")}, fused=SDPA, predictions=True)
    assert plan.shared == Pass(frozenset(), None, SDPA, ())
    assert plan.own == (Pass(frozenset({EMBEDDING_GRADIENTS}), ATTNLRP.rules, SDPA, (0, 3)),)


def test_a_refused_row_needs_only_its_logits() -> None:
    """A row whose request was refused is not in ``asks``: unlike a prediction-only row it does not keep the gradient
    rows from sharing the forward (it is simply not differentiated)."""
    plan = plan_batch({0: _ask("gae"), 2: _ask("gae")}, fused=None)
    assert plan.shared == Pass(frozenset({ATTENTIONS, ATTENTION_GRADIENTS}), None, None, (0, 2))


def test_a_mixed_batch_gets_one_shared_forward_and_one_pass_per_gradient_kind() -> None:
    asks = {
        0: _ask("gae"),
        2: _ask("attnlrp"),
        3: _ask("rollout", start_layer=1),
        4: _ask("grad_x_input"),
        5: _ask("cp_lrp"),
        6: _ask("integrated_gradients", n_steps=3),
        7: _ask("attention"),
        8: _ask("attnlrp"),
        9: _ask("relevance"),
    }
    plan = plan_batch(asks, fused=SDPA, predictions=True)
    assert [group.method for group in plan.groups] == [
        GAE,
        ATTNLRP,
        ROLLOUT,
        GRAD_X_INPUT,
        CP_LRP,
        IG,
        ATTENTION,
        RELEVANCE,
    ]
    assert plan.groups[1].rows == (2, 8)
    # The shared forward: every row's logits, the maps of the map rows (eager attention, as their needs ask), nothing
    # for integrated gradients (it runs forwards of its own when scored), no gradients.
    assert plan.shared == Pass(frozenset({ATTENTIONS}), None, SDPA, ())
    assert plan.own == (
        # true gradients on eager attention: gae and relevance read maps, so they share a kind
        Pass(frozenset({ATTENTIONS, ATTENTION_GRADIENTS, ACTIVATIONS}), None, None, (0, 9)),
        Pass(frozenset({EMBEDDING_GRADIENTS}), ATTNLRP.rules, SDPA, (2, 8)),
        Pass(frozenset({EMBEDDING_GRADIENTS}), None, SDPA, (4,)),
        Pass(frozenset({EMBEDDING_GRADIENTS}), CP_LRP.rules, SDPA, (5,)),
    )


def test_on_an_eager_model_true_gradient_rows_share_a_kind() -> None:
    """Without a fused attention, grad_x_input's true gradients come from the same eager pass as gae's: one kind, so
    one grad-enabled forward capturing what both need."""
    assert pass_kind(GRAD_X_INPUT, None) == pass_kind(GAE, None) != pass_kind(GRAD_X_INPUT, SDPA)
    plan = plan_batch({0: _ask("gae"), 1: _ask("grad_x_input")}, fused=None)
    assert plan.shared == Pass(frozenset({ATTENTIONS, ATTENTION_GRADIENTS, EMBEDDING_GRADIENTS}), None, None, (0, 1))
    assert plan.own == ()
    fused = plan_batch({0: _ask("gae"), 1: _ask("grad_x_input")}, fused=SDPA)
    assert fused.shared == Pass(frozenset(), None, SDPA, ())
    assert [own.rows for own in fused.own] == [(0,), (1,)]


def test_integrated_gradients_and_map_rows_need_no_gradient_pass() -> None:
    plan = plan_batch({0: _ask("integrated_gradients", n_steps=3), 1: _ask("rollout")}, fused=SDPA)
    assert plan.shared == Pass(frozenset({ATTENTIONS}), None, SDPA, ()) and plan.own == ()
    alone = plan_batch({0: _ask("integrated_gradients"), 1: _ask("integrated_gradients")}, fused=SDPA)
    assert alone.shared == Pass(frozenset(), None, SDPA, ()) and alone.own == ()


def test_a_batch_with_nothing_to_explain() -> None:
    assert plan_batch({}, fused=SDPA, predictions=True) == BatchPlan(
        (), Pass(frozenset(), None, SDPA, ()), (), SDPA, {}
    )


def _unsure_plan() -> BatchPlan:
    return plan_batch(
        {
            0: _ask("gae", below=0.8),
            1: _ask("gae"),
            2: _ask("rollout", below=0.8),
            3: _ask("attnlrp", below=0.6),
            4: _ask("integrated_gradients", below=0.9, n_steps=3),
            5: _ask("gae", below=0.8),
        },
        fused=SDPA,
    )


def test_rows_explained_only_when_unsure_wait_for_the_decision() -> None:
    plan = _unsure_plan()
    assert [(group.method, group.rows, group.when_unsure) for group in plan.groups] == [
        (GAE, (0, 5), True),
        (GAE, (1,), False),
        (ROLLOUT, (2,), True),
        (ATTNLRP, (3,), True),
        (IG, (4,), True),
    ]
    # The shared forward cannot be gae's pass (unsure rows are decided from it): it takes no gradients and captures
    # the rollout row's maps; the unconditional gae row has its pass, the unsure gradient rows have none yet.
    assert plan.shared == Pass(frozenset({ATTENTIONS}), None, SDPA, ())
    assert plan.own == (Pass(frozenset({ATTENTIONS, ATTENTION_GRADIENTS}), None, None, (1,)),)
    assert plan.below == {0: 0.8, 2: 0.8, 3: 0.6, 4: 0.9, 5: 0.8}


def test_the_decision_skips_confident_rows_and_gives_unsure_gradient_rows_their_kinds_pass() -> None:
    confidence = [0.5, 0.99, 0.95, 0.55, 0.3, 0.9]
    decided, skipped = _unsure_plan().decided(confidence)
    assert skipped == {
        2: RowSkipped("rollout", 0.95, 0.8),
        5: RowSkipped("gae", 0.9, 0.8),
    }
    assert [(group.method, group.rows) for group in decided.groups] == [
        (GAE, (0,)),
        (GAE, (1,)),
        (ATTNLRP, (3,)),
        (IG, (4,)),  # scored from the shared forward: it runs its own forwards then
    ]
    assert decided.own == (
        Pass(frozenset({ATTENTIONS, ATTENTION_GRADIENTS}), None, None, (0, 1)),
        Pass(frozenset({EMBEDDING_GRADIENTS}), ATTNLRP.rules, SDPA, (3,)),
    )
    assert decided.shared == _unsure_plan().shared and decided.below == {}


def test_when_every_conditional_row_is_confident_nothing_is_added() -> None:
    decided, skipped = _unsure_plan().decided([0.99] * 6)
    assert sorted(skipped) == [0, 2, 3, 4, 5]
    assert [group.rows for group in decided.groups] == [(1,)]
    assert decided.own == _unsure_plan().own
