"""The perturbation test: the removal maths, a synthetic model whose class is decided by one token (a faithful
ranking must remove the prediction fastest), and ``explain-eval`` end to end on the tiny archives."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from explain_eval.cli import main as eval_main
from explain_eval.faithfulness import (
    FRACTIONS,
    area_under_curve,
    delete_tokens,
    mask_tokens,
    perturbation_outcome,
    removal_counts,
    removal_masks,
    zero_patches,
)
from tests.serving_support import tiny_archives


def test_counts_are_floor_of_fraction_times_candidates() -> None:
    candidates = torch.zeros(3, 25, dtype=torch.bool)
    candidates[0, :10] = True
    candidates[1, :25] = True
    candidates[2, :3] = True
    counts = removal_counts(candidates)
    assert counts[:, 0].tolist() == list(range(10))
    assert counts[:, 1].tolist() == [0, 2, 5, 7, 10, 12, 15, 17, 20, 22]
    assert counts[:, 2].tolist() == [0, 0, 0, 0, 1, 1, 1, 2, 2, 2]
    with pytest.raises(ValueError):
        removal_counts(candidates, [1.5])


def test_masks_follow_the_ranking_and_never_touch_non_candidates() -> None:
    scores = torch.tensor([[9.0, 0.5, 0.1, 0.9, 0.3, 0.7, 0.2, 0.0]])
    candidates = torch.tensor([[False, True, True, True, True, True, True, False]])  # [CLS] ... [SEP]
    positive = removal_masks(scores, candidates, positive=True, fractions=[0.0, 0.5, 0.9])
    negative = removal_masks(scores, candidates, positive=False, fractions=[0.0, 0.5, 0.9])
    assert not positive[0].any() and not negative[0].any()
    assert positive[1, 0].nonzero().flatten().tolist() == [1, 3, 5]  # 0.5, 0.9, 0.7: the top 3 of 6
    assert negative[1, 0].nonzero().flatten().tolist() == [2, 4, 6]
    assert int(positive[2].sum()) == 5 and not positive[:, :, 0].any() and not positive[:, :, 7].any()
    growing = removal_masks(torch.rand(4, 30), torch.rand(4, 30) > 0.3, positive=True)
    assert all(bool((growing[step] <= growing[step + 1]).all()) for step in range(len(FRACTIONS) - 1))
    ties = removal_masks(torch.zeros(1, 6), torch.ones(1, 6, dtype=torch.bool), True, [0.5])
    assert ties[0, 0].nonzero().flatten().tolist() == [0, 1, 2]  # ties: earlier positions first


def test_mask_delete_and_zero() -> None:
    ids = torch.tensor([[101, 5, 6, 7, 102, 0], [101, 8, 102, 0, 0, 0]])
    attention = (ids != 0).long()
    remove = torch.tensor([[False, True, False, True, False, False], [False, True, False, False, False, False]])
    assert mask_tokens(ids, remove, 103).tolist() == [[101, 103, 6, 103, 102, 0], [101, 103, 102, 0, 0, 0]]
    packed, mask = delete_tokens(ids, attention, remove, 0)
    assert packed.tolist() == [[101, 6, 102, 0, 0, 0], [101, 102, 0, 0, 0, 0]]
    assert mask.tolist() == [[1, 1, 1, 0, 0, 0], [1, 1, 0, 0, 0, 0]]
    pixels = torch.ones(1, 3, 8, 8)
    patches = torch.zeros(1, 2, 2, dtype=torch.bool)
    patches[0, 0, 1] = True
    zeroed = zero_patches(pixels, patches)
    assert zeroed[0, :, :4, 4:].eq(0).all() and zeroed.sum() == 3 * 64 - 3 * 16
    with pytest.raises(ValueError):
        zero_patches(torch.ones(1, 3, 9, 9), patches)


def test_auc_is_the_mean_level() -> None:
    assert area_under_curve([1.0] * len(FRACTIONS)) == pytest.approx(1.0)
    assert area_under_curve([1.0, 0.0], [0.0, 1.0]) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        area_under_curve([1.0])


KEY_TOKEN = 7


def synthetic_predict(ids: torch.Tensor, mask_id: int):
    """The class is 1 when the key token is present (probability 0.95), else 0: one token decides."""

    def predict(remove: torch.Tensor) -> torch.Tensor:
        tiled = mask_tokens(ids.repeat(remove.shape[0] // ids.shape[0], 1), remove, mask_id)
        present = (tiled == KEY_TOKEN).any(dim=-1).float()
        return torch.stack([1 - (0.05 + 0.9 * present), 0.05 + 0.9 * present], dim=-1)

    return predict


def test_a_faithful_ranking_removes_the_prediction_fastest() -> None:
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(10, 50, (64, 20), generator=generator)
    key_position = torch.randint(1, 19, (64,), generator=generator)
    ids[torch.arange(64), key_position] = KEY_TOKEN
    candidates = torch.ones_like(ids, dtype=torch.bool)
    labels = torch.ones(64, dtype=torch.long)
    oracle = (ids == KEY_TOKEN).float() + 0.01 * torch.rand(ids.shape, generator=generator)
    rankings = {"oracle": oracle, "random": torch.rand(ids.shape, generator=generator), "inverse": -oracle}
    aucs = {}
    for name, scores in rankings.items():
        for positive in (True, False):
            outcome = perturbation_outcome(scores, candidates, synthetic_predict(ids, 0), labels, labels, positive)
            curve = outcome.correct.float().mean(dim=1).tolist()
            aucs[name, positive] = area_under_curve(curve)
            assert curve[0] == 1.0  # nothing removed: all correct
            if name == "oracle":
                assert curve[1:] == ([0.0] * 9 if positive else [1.0] * 9)
    assert aucs["oracle", True] < aucs["random", True] < aucs["inverse", True]
    assert aucs["oracle", False] > aucs["random", False] and aucs["inverse", False] < aucs["random", False]
    assert aucs["inverse", True] == pytest.approx(1.0) and aucs["oracle", True] == pytest.approx(0.5 * 0.1 / 0.9)


@pytest.mark.slow
def test_explain_eval_end_to_end_on_the_tiny_models(tmp_path: Path) -> None:
    tiny = tiny_archives()
    outputs = {}
    for name in ("sentiment", "digits"):
        out = tmp_path / name
        status = eval_main(
            ["--model", name, "--model-dir", str(tiny[name] / "model"), "--n", "24", "--methods",
             "attention,relevance", "--out", str(out), "--no-progress", "--batch-size", "8"]
        )  # fmt: skip
        assert status == 0
        outputs[name] = json.loads(out.with_suffix(".json").read_text())
        assert out.with_suffix(".png").stat().st_size > 10_000
        table = out.with_suffix(".md").read_text()
        assert "| attention |" in table and "| relevance |" in table and "| random |" in table
    for name, document in outputs.items():
        (result,) = document["results"]
        assert result["n"] == 24 and result["model"] == name
        for method in ("attention", "relevance", "random"):
            for direction in ("positive", "negative"):
                curve = result["curves"][method][direction]["accuracy"]
                assert len(curve) == len(FRACTIONS)
                assert curve[0] == pytest.approx(result["unperturbed_accuracy"])  # 0% removed = the model itself
                assert 0 <= result["auc_percent"][method][f"{direction}_accuracy"] <= 100
    assert "[MASK]" in outputs["sentiment"]["results"][0]["removal"]
    assert "patches set to 0" in outputs["digits"]["results"][0]["removal"]


def test_served_word_removal_retokenizes_to_masked_pieces() -> None:
    """The text sent by ``--served`` tokenizes back into the original pieces with every piece of each removed word
    masked (so served word removal = in-process [MASK] removal of those pieces)."""
    from transformers import AutoTokenizer

    from explain_client.render import merge_pieces
    from explain_eval.served_eval import words_to_text

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_archives()["sentiment"] / "model"))
    texts = [
        "@united flight UA1234 delayed... unbelievable!! #neveragain",
        "Thanks for the upgrade, the lounge was LOVELY :)",
        "what's the wifi password? it's 2015 ffs",
    ]
    split_words = 0
    for text in texts:
        ids = tokenizer(text)["input_ids"]
        pieces = tokenizer.convert_ids_to_tokens(ids)
        special = [token_id in tokenizer.all_special_ids for token_id in ids]
        words = merge_pieces(pieces, [0.0] * len(pieces), special)
        split_words += sum(len(word.pieces) > 1 for word in words)
        remove = [index % 2 == 0 for index in range(len(words))]
        sent = tokenizer(words_to_text(words, remove, tokenizer.mask_token))["input_ids"]
        expected = list(ids)
        position = 1  # after [CLS]
        for word, removed in zip(words, remove, strict=True):
            for offset in range(len(word.pieces)):
                if removed:
                    expected[position + offset] = tokenizer.mask_token_id
            position += len(word.pieces)
        assert sent == expected, (text, tokenizer.convert_ids_to_tokens(sent))
    assert split_words >= 2  # the texts do exercise words of several pieces


@pytest.mark.slow
def test_explain_eval_served_matches_in_process_start(server, tmp_path: Path) -> None:
    model_dir = tiny_archives()["sentiment"] / "model"
    common = ["--model", "sentiment", "--model-dir", str(model_dir), "--n", "10", "--methods", "attention",
              "--no-progress", "--batch-size", "5"]  # fmt: skip
    assert eval_main([*common, "--served", "--run-dir", str(server.run_dir), "--out", str(tmp_path / "served")]) == 0
    assert eval_main([*common, "--out", str(tmp_path / "local")]) == 0
    served = json.loads((tmp_path / "served.json").read_text())["results"][0]
    local = json.loads((tmp_path / "local.json").read_text())["results"][0]
    assert "served model" in served["removal"] and served["n"] == local["n"] == 10
    assert served["unperturbed_accuracy"] == local["unperturbed_accuracy"]
    for direction in ("positive", "negative"):
        curve = served["curves"]["attention"][direction]["probability"]
        assert curve[0] == pytest.approx(local["curves"]["attention"][direction]["probability"][0], abs=1e-4)
        assert len(curve) == len(FRACTIONS) and all(0.0 <= value <= 1.0 for value in curve)
