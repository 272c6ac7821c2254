"""``explain-eval --generation`` (explain_eval/generation.py) on a tiny float64 Llama causal LM: the removal rule, the
teacher-forced log-probabilities, an oracle ranking that must beat every other, and the command end to end."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from explain_eval.cli import main as eval_main
from explain_eval.generation import (
    RANDOM,
    evaluate_generation,
    markdown_table,
    perturbed_inputs,
    step_log_probabilities,
    top_k_removals,
)
from explainers.tasks.continuation import generate_continuation
from tests.generation_checkpoint import causal_lm

PROMPTS = ("a slow rude waiter and the food", "the service was good and the food", "the food was")


@pytest.fixture(scope="module")
def lm(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any, Any]:
    folder = causal_lm(tmp_path_factory.mktemp("lm") / "lm")
    model = AutoModelForCausalLM.from_pretrained(str(folder), attn_implementation="eager", dtype=torch.float64).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    tokenizer.padding_side = "left"
    return folder, model, tokenizer


def test_top_k_removes_the_highest_candidates_and_spares_short_prompts() -> None:
    scores = torch.tensor([[[0.1, 0.9, 0.5, 0.5], [3.0, -1.0, 2.0, 0.0]], [[9.0, 1.0, 2.0, 3.0], [0.0, 0.0, 0.0, 0.0]]])
    candidates = torch.tensor([[True, True, True, True], [False, False, True, True]])
    removed = top_k_removals(scores, candidates, 2)
    assert removed[0].tolist() == [[False, True, True, False], [True, False, True, False]]  # tie: the earlier
    assert not bool(removed[1].any())  # 2 candidates: k = 2 would leave nothing
    one = top_k_removals(scores, candidates, 1)
    assert one[1].tolist() == [[False, False, False, True], [False, False, True, False]]  # never a non-candidate
    with pytest.raises(ValueError, match="at least 1"):
        top_k_removals(scores, candidates, 0)


def test_deleted_tokens_are_packed_and_positions_restart() -> None:
    prompt_ids = torch.tensor([[3, 3, 10, 11, 12], [20, 21, 22, 23, 24]])
    prompt_mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    tokens = torch.tensor([[30, 31], [40, 41]])
    none = torch.zeros(5, dtype=torch.bool)
    queries = [(0, 1, torch.tensor([False, False, False, True, False])), (1, 0, none)]
    inputs, targets = perturbed_inputs(prompt_ids, prompt_mask, tokens, queries, pad_id=3)
    assert inputs["input_ids"].tolist() == [[3, 3, 10, 12, 30], [20, 21, 22, 23, 24]]
    assert inputs["attention_mask"].tolist() == [[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]]
    assert inputs["position_ids"].tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]]
    assert targets.tolist() == [31, 40]


def test_unperturbed_log_probabilities_are_the_generation_loops(lm: tuple[Path, Any, Any]) -> None:
    _, model, tokenizer = lm
    made = generate_continuation(model, dict(tokenizer(list(PROMPTS), padding=True, return_tensors="pt")), 3)
    assert made.probabilities is not None
    empty = torch.zeros(made.prompt_width, dtype=torch.bool)
    pairs = [(row, step) for row in range(3) for step in range(made.steps) if made.token_mask[row, step]]
    values = step_log_probabilities(model, made.prompt_ids, made.prompt_mask, made.tokens,
                                    [(row, step, empty) for row, step in pairs], pad_id=3, batch_size=2)  # fmt: skip
    expected = [float(made.probabilities[row, step].log()) for row, step in pairs]
    assert values == pytest.approx(expected, abs=1e-6)


def test_an_oracle_ranking_beats_every_method_and_random(lm: tuple[Path, Any, Any]) -> None:
    """Scores = each prompt token's own leave-one-out drop: at k = 1 no ranking can remove a more important token."""
    _, model, tokenizer = lm

    def oracle(model: Any, made: Any, **_: Any) -> SimpleNamespace:
        width = made.prompt_width
        scores = torch.zeros((made.tokens.shape[0], made.steps, width + made.steps), dtype=torch.float64)
        empty = torch.zeros(width, dtype=torch.bool)
        for row in range(made.tokens.shape[0]):
            for step in range(made.steps):
                base = step_log_probabilities(model, made.prompt_ids, made.prompt_mask, made.tokens,
                                              [(row, step, empty)], pad_id=3)[0]  # fmt: skip
                for position in range(width):
                    if made.prompt_mask[row, position]:
                        removed = torch.zeros(width, dtype=torch.bool)
                        removed[position] = True
                        after = step_log_probabilities(model, made.prompt_ids, made.prompt_mask, made.tokens,
                                                       [(row, step, removed)], pad_id=3)[0]  # fmt: skip
                        scores[row, step, position] = base - after
        return SimpleNamespace(scores=scores)

    methods = ("oracle", "grad_x_input", "attention", RANDOM)

    def explain(model: Any, made: Any, *, method: str, **options: Any) -> Any:
        from explainers.tasks.generation import explain_continuation

        if method == "oracle":
            return oracle(model, made)
        return explain_continuation(model, made, method=method, **options)

    result = evaluate_generation(model, tokenizer, PROMPTS, methods, new_tokens=3, ks=(1, 2), progress=False,
                                 explain=explain)  # fmt: skip
    best = result.drops["oracle"]["1"]["mean"]
    for method in methods[1:]:
        assert result.drops[method]["1"]["mean"] <= best + 1e-9
    assert result.drops["oracle"]["1"]["vs_random"] > 0
    assert result.drops["oracle"]["2"]["prompts"] == 3 and result.steps == 9
    table = markdown_table(result)
    assert table.splitlines()[4].startswith("| oracle |") and "deleted" in table


def test_explain_eval_generation_end_to_end(lm: tuple[Path, Any, Any], tmp_path: Path) -> None:
    folder, _, _ = lm
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n\n", encoding="utf-8")
    out = tmp_path / "faith"
    status = eval_main(["--generation", "--model-dir", str(folder), "--prompts", str(prompts), "--n", "2",
                        "--new-tokens", "2", "--k", "1,2", "--methods", "attention,grad_x_input", "--no-progress",
                        "--out", str(out)])  # fmt: skip
    assert status == 0
    document = json.loads(out.with_suffix(".json").read_text())
    result = document["result"]
    assert set(document["methods"]) == {"attention", "grad_x_input", RANDOM} and document["options"] == {}
    assert result["prompts"] == list(PROMPTS[:2]) and result["ks"] == [1, 2] and set(result["drops"]) == {
        "attention", "grad_x_input", RANDOM}  # fmt: skip
    assert "| grad_x_input |" in out.with_suffix(".md").read_text()


def test_explain_eval_generation_refuses_relevance_with_the_reason(
    lm: tuple[Path, Any, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder, _, _ = lm
    status = eval_main(["--generation", "--model-dir", str(folder), "--n", "1", "--new-tokens", "1", "--methods",
                        "relevance", "--no-progress", "--out", str(tmp_path / "faith")])  # fmt: skip
    assert status == 2 and "relevance" in capsys.readouterr().err
