"""What a method needs is declared at its registration (explainers/methods/), and nothing else reads its name.

- No production code outside the registry compares a registered method's name (an ``ast`` scan).
- Every registration's declarations hold together, and the registry refuses one that does not.
- A new method is one registration: a perturbation method that runs forwards of its own without a backward, registered
  here, is explained by :func:`explain`, :func:`explain_batch` and :func:`explain_tokens` and estimated by the memory
  budget without any other change.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Iterator, Mapping
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor, nn

import explainers.methods.registry as methods_module
from explainers import (
    RowExplanation,
    RowRequest,
    available_methods,
    describe,
    estimate_bytes,
    explain,
    explain_batch,
    explain_tokens,
    get_method,
)
from explainers.capture import MAP_NEEDS, forward_pass
from explainers.inputs import batch_size
from explainers.memory import ModelSize
from explainers.methods import Cost, Footprint, ForwardInputs, ForwardScores, Memory, register, register_forwards
from explainers.tasks.token_classification import span_targets

from .arch_zoo import VARIANTS, build_token_level, row_alone, text_batch

ROOT = Path(__file__).resolve().parents[1]
#: The production packages scanned; the registry itself may name its methods.
SCANNED = ("explainers", "serving_core", "handlers", "servers", "explain_eval")
REGISTRY = ROOT / "explainers" / "methods" / "registry.py"


def _literal_strings(node: ast.expr) -> set[str]:
    """The string literals ``node`` is or holds (a tuple, list, set or dict display of them)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return set().union(*(_literal_strings(element) for element in node.elts))
    if isinstance(node, ast.Dict):
        return set().union(*(_literal_strings(key) for key in node.keys if key is not None))
    return set()


def name_comparisons(source: str, names: set[str]) -> list[tuple[int, str]]:
    """Every ``==``, ``!=``, ``in``, ``not in``, ``is`` or ``is not`` in ``source`` with a side that is (or holds) a
    string literal among ``names``: ``(line, name)``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        for operator, sides in zip(node.ops, pairwise([node.left, *node.comparators]), strict=True):
            if not isinstance(operator, ast.Eq | ast.NotEq | ast.In | ast.NotIn | ast.Is | ast.IsNot):
                continue
            for name in sorted(set().union(*(_literal_strings(side) for side in sides)) & names):
                found.append((node.lineno, name))
    return found


def _scanned_files() -> list[Path]:
    files = [path for package in SCANNED for path in sorted((ROOT / package).rglob("*.py"))]
    return [path for path in files if path != REGISTRY and "_generated" not in path.parts]


def test_no_code_outside_the_registry_compares_a_method_name() -> None:
    """A capability is read from the method's registration; a comparison with a method's name would break the
    registry's promise for the next method that has the same need."""
    files = _scanned_files()
    assert ROOT / "explainers" / "tasks" / "targets.py" in files and len(files) > 40, "the scan reads the packages"
    names = set(available_methods())
    found = [
        f"{path.relative_to(ROOT)}:{line} compares {name!r}"
        for path in files
        for line, name in name_comparisons(path.read_text(encoding="utf-8"), names)
    ]
    assert found == []


@pytest.mark.parametrize(
    "source, expected",
    [
        # the comparisons issue 25 removed, as they were written
        ('path = chosen.name == "integrated_gradients"', ["integrated_gradients"]),
        ('needs = bool(x) or self.name == "integrated_gradients"', ["integrated_gradients"]),
        ('maps = 1.0 if method in ("attention", "rollout") else 0.0', ["attention", "rollout"]),
        ('lrp = "relevance" not in known.refused and task == "token_classification"', ["relevance"]),
        ('if variant == "attnlrp":\n    pass', ["attnlrp"]),
        # other shapes
        ('if method != "gae" or name in {"cp_lrp", "lime"}:\n    pass', ["cp_lrp", "gae"]),
        ('found = method is "rollout"', ["rollout"]),
        # not comparisons with a registered name
        ('if method == "lime":\n    pass', []),
        ('DEFAULT_METHOD = "attnlrp"', []),
        ("same = method == DEFAULT_METHOD", []),
        ('options = {"integrated_gradients": {"n_steps": 4}}', []),
    ],
)
def test_the_scan_finds_comparisons_with_method_names(source: str, expected: list[str]) -> None:
    assert sorted(name for _, name in name_comparisons(source, set(available_methods()))) == sorted(expected)


# ---- the declarations ----------------------------------------------------------------------------------------


def test_every_registration_declares_a_consistent_shape() -> None:
    for name in available_methods():
        method = get_method(name)
        assert method.reads_maps == bool(method.needs & MAP_NEEDS)
        assert (method.memory.fused is None) == method.reads_maps, name
        if method.forwards is not None:
            assert method.needs == frozenset() and method.rules is None, name
            assert method.forwards.rows_per_pass(1, {}) >= 1
    assert get_method("integrated_gradients").needs_gradients and get_method("gae").needs_gradients
    assert not get_method("rollout").needs_gradients


def test_the_registry_refuses_a_duplicate_or_a_shape_that_does_not_fit_the_needs() -> None:
    def compute(ctx: Any) -> Tensor:
        raise AssertionError("never called")

    with pytest.raises(ValueError, match="already registered"):
        register("gae", summary="", class_specific=True, needs=frozenset(), memory=Memory(Footprint(0, 0, 0)))(compute)
    with pytest.raises(ValueError, match="fused footprint"):
        map_method = get_method("rollout")
        register("test_maps_on_fused", summary="", class_specific=False, needs=map_method.needs,
                 memory=Memory(Footprint(0, 0, 0), fused=Footprint(0, 0, 0)))(compute)  # fmt: skip
    assert "test_maps_on_fused" not in available_methods()


# ---- a new method is one registration ------------------------------------------------------------------------

OCCLUSION = "test_occlusion"
COPIES_PER_ROW = 8


def _occlusion(run: ForwardInputs) -> ForwardScores:
    """Each input embedding's effect on the objective: its value minus its value with that embedding zeroed, from one
    forward (without gradients) of the batch repeated once per position, plus the batch itself."""
    batch = batch_size(run.arch, run.inputs)
    length = int(run.inputs["input_ids"].shape[1])
    copies = length + 1
    repeated = {key: value.repeat(copies, *([1] * (value.dim() - 1))) for key, value in run.inputs.items()}

    def zero_one_position_per_copy(embeddings: Tensor) -> Tensor:
        embeddings = embeddings.clone()
        for position in range(length):
            embeddings[(position + 1) * batch : (position + 2) * batch, position] = 0
        return embeddings

    occluded = forward_pass(
        run.model, run.arch, repeated, frozenset(), embeddings=zero_one_position_per_copy, fused=run.fused
    )
    values = run.objective.values(occluded.logits).view(run.objective.rounds, copies, batch)
    return ForwardScores((values[:, :1] - values[:, 1:]).permute(0, 2, 1).to(run.dtype))


@pytest.fixture
def occlusion() -> Iterator[str]:
    """The perturbation method above, registered for the test (and only for it)."""
    register_forwards(
        OCCLUSION,
        summary="occlusion of each input embedding (a test's method)",
        class_specific=True,
        memory=Memory(eager=Footprint(0.0, 2.0, 0.0), fused=Footprint(0.0, 0.0, 0.0)),
        gradients=False,
        rows_per_pass=lambda rows, options: rows * COPIES_PER_ROW,
        cost=Cost(lambda options, length: float(length + 1)),
    )(_occlusion)
    try:
        yield OCCLUSION
    finally:
        methods_module._REGISTRY.pop(OCCLUSION)


def _zeroed_outputs(model: Any, inputs: Mapping[str, Tensor], position: int) -> Tensor:
    """The logits with every row's input embedding at ``position`` zeroed (written apart from the method)."""

    def zero(module: nn.Module, args: Any, output: Tensor) -> Tensor:
        output = output.clone()
        output[:, position] = 0
        return output

    handle = model.get_input_embeddings().register_forward_hook(zero)
    try:
        with torch.no_grad():
            return model(**inputs).logits
    finally:
        handle.remove()


def test_a_new_method_of_its_own_forwards_explains_a_classifier(occlusion: str) -> None:
    model = next(variant for variant in VARIANTS if variant.name == "bert").build()
    batch = text_batch(model)
    result = explain(model, batch, method=occlusion)
    assert not get_method(occlusion).needs_gradients
    with torch.no_grad():
        full = model(**batch).logits.gather(1, result.target[:, None])[:, 0]
    mask = batch["attention_mask"]
    expected = torch.stack(
        [full - _zeroed_outputs(model, batch, position).gather(1, result.target[:, None])[:, 0]
         for position in range(mask.shape[1])],
        dim=1,
    ) * mask  # fmt: skip
    torch.testing.assert_close(result.scores, expected, rtol=0, atol=1e-10)
    rows = [RowRequest(occlusion), RowRequest("gae"), RowRequest(None), RowRequest(occlusion, target=1)]
    served = explain_batch(model, batch, rows)
    for index, request in enumerate(rows):
        if request.method is None:
            assert served.rows[index] is None
            continue
        got = served.rows[index]
        assert isinstance(got, RowExplanation) and got.method == request.method
        alone = explain(model, row_alone(batch, index), method=request.method, target=request.target)
        torch.testing.assert_close(got.scores, alone.scores[0], rtol=0, atol=1e-10)


def test_a_new_method_of_its_own_forwards_explains_every_entity(occlusion: str) -> None:
    model = build_token_level("bert", "token_classification")
    batch = text_batch(model)
    spans = [[(1, 3, 0), (4, 5, 2)], [(0, 2, 1)], [(2, 6, 2)], [(1, 2, 0), (3, 4, 1)]]
    result = explain_tokens(model, batch, method=occlusion, positions=spans)
    targets = span_targets(spans, _scheme(model), batch["attention_mask"])
    with torch.no_grad():
        full = targets.objective(model(**batch).logits)  # (K, B)
    mask = batch["attention_mask"]
    for position in range(mask.shape[1]):
        expected = (full - targets.objective(_zeroed_outputs(model, batch, position))).T  # (B, K)
        expected = expected * targets.active.T * mask[:, position : position + 1]
        torch.testing.assert_close(result.scores[:, :, position], expected, rtol=0, atol=1e-10)


def _scheme(model: Any) -> Any:
    from explainers import label_scheme

    return label_scheme(model.config.id2label)


def test_a_new_method_of_its_own_forwards_is_estimated_for_its_passes(occlusion: str) -> None:
    model = next(variant for variant in VARIANTS if variant.name == "bert").build()
    eager = ModelSize.of(model, describe(model))
    assert not eager.fused
    length, rows = 100, 2 * COPIES_PER_ROW  # two rows, eight copies each in a pass
    width = length * (eager.hidden + eager.intermediate)
    transient = 2.0 * eager.heads * length * length  # its eager footprint: two maps at once in the layer computed
    assert estimate_bytes(eager, occlusion, 2, length, {}) == eager.element_bytes * rows * (transient + 6 * width)
    fused = dataclasses.replace(eager, fused=True)
    assert estimate_bytes(fused, occlusion, 2, length, {}) == fused.element_bytes * rows * 6 * width
