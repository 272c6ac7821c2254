"""The metrics of ``explain-eval --all`` (explain_eval/erasure.py, explain_eval/ranking.py) on hand-made curves and
rankings, where every value can be worked out on paper."""

from __future__ import annotations

import json
import math

import pytest
import torch

from explain_eval.erasure import (
    ERASER_BINS,
    abpc,
    comprehensiveness_masks,
    curve_areas,
    erasure_score,
    sufficiency_masks,
    top_counts,
    top_masks,
)
from explain_eval.faithfulness import FRACTIONS, area_under_curve
from explain_eval.ranking import METRICS, batch_metrics, distinct_removals
from explain_eval.ranking_report import comparison
from explain_eval.results import mean_and_stderr


def test_top_counts_round_up_and_keep_at_least_one() -> None:
    candidates = torch.tensor([[True] * 20, [True] * 3 + [False] * 17, [False] * 20])
    counts = top_counts(candidates, ERASER_BINS)
    # 20 candidates: 1% -> 1 (0.2 rounded up), 5% -> 1, 10% -> 2, 20% -> 4, 50% -> 10
    assert counts[:, 0].tolist() == [1, 1, 2, 4, 10]
    # 3 candidates: 1% -> 1, 5% -> 1, 10% -> 1, 20% -> 1, 50% -> 2 (1.5 up)
    assert counts[:, 1].tolist() == [1, 1, 1, 1, 2]
    assert counts[:, 2].tolist() == [0] * 5  # nothing to take
    with pytest.raises(ValueError, match="bins"):
        top_counts(candidates, (0.0, 0.5))


def test_top_masks_take_the_highest_candidates_and_spare_the_others() -> None:
    scores = torch.tensor([[9.0, 0.1, 0.5, 0.3, 0.2]])
    candidates = torch.tensor([[False, True, True, True, True]])  # position 0 is a special token
    masks = top_masks(scores, candidates, (0.25, 0.5, 1.0))
    assert masks[0, 0].tolist() == [False, False, True, False, False]
    assert masks[1, 0].tolist() == [False, False, True, True, False]
    assert masks[2, 0].tolist() == [False, True, True, True, True]
    kept = sufficiency_masks(scores, candidates, (0.25,))
    assert kept[0, 0].tolist() == [False, True, False, True, True]  # every candidate but the top one
    assert torch.equal(comprehensiveness_masks(scores, candidates, (0.25,)), masks[:1])


def test_erasure_score_is_the_mean_drop_over_bins() -> None:
    full = torch.tensor([0.9, 0.5])
    perturbed = torch.tensor([[0.8, 0.5], [0.4, 0.6], [0.0, 0.1]])
    assert erasure_score(full, perturbed).tolist() == pytest.approx([(0.1 + 0.5 + 0.9) / 3, (0.0 - 0.1 + 0.4) / 3])
    with pytest.raises(ValueError, match="must be"):
        erasure_score(full, perturbed[:, :1])


def test_curve_areas_match_the_single_curve_auc() -> None:
    curves = torch.tensor([[1.0 - 0.1 * i for i in range(10)], [0.5] * 10]).T
    areas = curve_areas(curves, FRACTIONS)
    assert areas[0].item() == pytest.approx(area_under_curve(curves[:, 0].tolist()))
    assert areas[1].item() == pytest.approx(0.5)
    # a straight line from 1 at 0% to 0.1 at 90% has mean level 0.55
    assert areas[0].item() == pytest.approx(0.55)
    with pytest.raises(ValueError, match="increase"):
        curve_areas(torch.zeros(2, 1), (0.5, 0.1))


def test_abpc_is_the_area_between_least_and_most_relevant_first() -> None:
    most = torch.tensor([[1.0, 0.0, 0.0]]).T  # falls at once
    least = torch.tensor([[1.0, 1.0, 1.0]]).T  # stays
    fractions = (0.0, 0.5, 1.0)
    # areas: most first = (0.5 * 0.5 + 0) / 1 = 0.25, least first = 1 -> 0.75
    assert abpc(most, least, fractions).item() == pytest.approx(0.75)
    assert abpc(least, most, fractions).item() == pytest.approx(-0.75)
    assert abpc(least, least, fractions).item() == 0.0


def test_mean_and_stderr() -> None:
    mean, stderr = mean_and_stderr([1.0, 2.0, 3.0])
    assert mean == 2.0 and stderr == pytest.approx(1.0 / math.sqrt(3))
    assert math.isnan(mean_and_stderr([4.0])[1]) and mean_and_stderr([4.0])[0] == 4.0


def test_comparison_reads_each_metric_in_its_direction_and_calls_ties() -> None:
    def summary(mean: float, stderr: float) -> dict[str, dict[str, float]]:
        return {metric: {"mean": mean, "stderr": stderr} for metric in METRICS}

    assert comparison(summary(0.30, 0.01), summary(0.20, 0.01), "abpc") == "holds (+10.0)"
    assert comparison(summary(0.30, 0.01), summary(0.20, 0.01), "positive_auc") == "reversed (-10.0)"  # lower wins
    assert comparison(summary(0.30, 0.05), summary(0.20, 0.05), "abpc") == "tie (+10.0)"  # within 2 s.e.
    assert comparison(summary(0.2, 0.0), summary(0.2 - 1e-9, 0.0), "abpc").startswith("tie")


def test_distinct_removals_ask_once_per_example_and_mask() -> None:
    masks = torch.tensor(
        [
            [[True, False], [True, False]],
            [[True, False], [False, False]],
            [[False, True], [True, False]],
        ]
    )  # (steps 3, batch 2, positions 2)
    full = torch.tensor([0.5, 0.7], dtype=torch.float64)
    asked: list[tuple[int, tuple[bool, ...]]] = []

    def removed(rows: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
        asked.extend((int(row), tuple(mask.tolist())) for row, mask in zip(rows, chosen, strict=True))
        return torch.tensor(
            [0.1 * (row + 1) + (0.01 if mask[1] else 0.0) for row, mask in zip(rows.tolist(), chosen, strict=True)]
        )

    values = distinct_removals(masks, full, removed)
    assert sorted(asked) == [(0, (False, True)), (0, (True, False)), (1, (True, False))]
    assert torch.allclose(values, torch.tensor([[0.1, 0.2], [0.1, 0.7], [0.11, 0.2]], dtype=torch.float64))


def _one_token_model(decisive: int) -> object:
    """A 'model' whose target probability is 0.9 while position ``decisive`` is present, else 0.1."""

    def removed(rows: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
        return torch.where(masks[:, decisive], 0.1, 0.9).double()

    return removed


def test_batch_metrics_rank_an_oracle_above_its_inverse() -> None:
    positions, decisive = 10, 3
    candidates = torch.ones(1, positions, dtype=torch.bool)
    oracle = torch.zeros(1, positions)
    oracle[0, decisive] = 1.0
    full = torch.tensor([0.9])
    good = batch_metrics(oracle, candidates, full, _one_token_model(decisive))  # type: ignore[arg-type]
    bad = batch_metrics(-oracle, candidates, full, _one_token_model(decisive))  # type: ignore[arg-type]
    assert set(good) == set(METRICS)
    # oracle: the decisive token goes first (from 10% on) under MoRF, last (never, up to 90%) under LeRF
    assert good["positive_auc"].item() == pytest.approx((0.05 * (0.9 + 0.1) + 0.8 * 0.1) / 0.9)
    assert good["negative_auc"].item() == pytest.approx(0.9)
    assert good["abpc"].item() == pytest.approx(good["negative_auc"].item() - good["positive_auc"].item())
    # comprehensiveness: every bin's top k holds the decisive token -> drop 0.8; sufficiency: it is kept -> 0
    assert good["comprehensiveness"].item() == pytest.approx(0.8)
    assert good["sufficiency"].item() == pytest.approx(0.0)
    # inverse ranking: never in the top k below 100%, removed last
    assert bad["comprehensiveness"].item() == pytest.approx(0.0)
    assert bad["sufficiency"].item() == pytest.approx(0.8)
    assert bad["abpc"].item() < 0 < good["abpc"].item()


@pytest.mark.slow
def test_explain_eval_all_on_the_tiny_models(tmp_path_factory: pytest.TempPathFactory) -> None:
    """``explain-eval --all`` end to end on the tiny sentiment, digits and entities builds and a tiny Llama writer."""
    from explain_eval.cli import main as eval_main
    from tests.generation_checkpoint import causal_lm
    from tests.serving_support import tiny_archives

    build_dir = tiny_archives()["sentiment"].parent.parent
    writer = causal_lm(tmp_path_factory.mktemp("writer") / "writer")
    out = tmp_path_factory.mktemp("all") / "all"
    status = eval_main(
        ["--all", "--build-dir", str(build_dir), "--writer-dir", str(writer), "--methods", "relevance,smoothgrad",
         "--n", "2", "--writer-n", "2", "--seeds", "0,1", "--batch-size", "4", "--no-progress", "--out", str(out)]
    )  # fmt: skip
    assert status == 0
    document = json.loads(out.with_suffix(".json").read_text())
    assert [model["model"] for model in document["models"]] == ["sentiment", "digits", "entities", "writer"]
    assert document["command"].startswith("explain-eval --all") and document["machine"] and document["date"]
    for model in document["models"]:
        assert model["seeds"] == [0, 1] and model["n"] == 2
        for name, summary in model["methods"].items():
            if model["model"] == "writer" and name == "relevance":
                assert "no rule" in summary["not_applicable"]  # the family's reason, from the registry
                continue
            for metric in METRICS:
                assert len(summary[metric]["per_seed"]) == 2 and math.isfinite(summary[metric]["stderr"])
            for pos, neg, between in zip(summary["positive_auc"]["per_seed"], summary["negative_auc"]["per_seed"],
                                         summary["abpc"]["per_seed"], strict=True):  # fmt: skip
                assert between == pytest.approx(neg - pos)
                assert 0.0 <= pos <= 1.0 and 0.0 <= neg <= 1.0
            assert summary["seconds_per_example"]["mean"] >= 0.0
    table = out.with_suffix(".md").read_text()
    assert "| relevance | n/a (" in table and "## Ranks by ABPC" in table
    for name in ("sentiment", "digits", "entities", "writer"):
        assert f"### {name}" in table
