"""The word and document views of ``explain-eval --generation`` on tiny chat models (:mod:`tests.chat_zoo`): a word
is removed with all its tokens and scored by their sum; a sentence loses the documents its citations rank first, and
its drop is the fall of its log-probability when the chat is rendered without them; both views from the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from explain_eval.cli import main as eval_main
from explain_eval.documents import ChatItem, evaluate_documents, prompt_without, read_items, span_log_probabilities
from explain_eval.generation import (
    RANDOM,
    evaluate_generation,
    markdown_table,
    prompt_words,
    top_k_word_removals,
    word_scores,
)
from explainers import explain_citations, token_units

from .chat_zoo import DOCUMENTS, QUESTION, chat_model, save_chat_model

ANSWER = "It was finished in 1889. It stands in Paris!"
PROMPTS = ("Which tower is the oldest of them all, and why?", "Big Ben is the bell")


def test_prompt_words_group_a_words_tokens_and_leave_out_padding_and_specials() -> None:
    _, tokenizer = chat_model("llama")
    encoded = tokenizer(list(PROMPTS), padding=True, return_tensors="pt")
    ids, mask = encoded["input_ids"], encoded["attention_mask"]
    special = torch.tensor(sorted(tokenizer.all_special_ids))
    candidates = mask.bool() & ~torch.isin(ids, special)
    candidates[0, -1] = False  # a token that may not be removed is in no word
    words = prompt_words(tokenizer, PROMPTS, ids, candidates)
    assert bool((words[~candidates] == -1).all()) and bool((words[candidates] >= 0).all())
    row = tokenizer(PROMPTS[0], return_offsets_mapping=True)
    offsets = [tuple(span) for span in row["offset_mapping"]]
    units = token_units(PROMPTS[0], offsets, "word")
    start = ids.shape[1] - len(offsets)
    assert any(len(unit.tokens) > 1 for unit in units)  # a word of several tokens: the grouping is tested
    for unit in units[:-1]:
        assert len({int(words[0, start + token]) for token in unit.tokens}) == 1
    assert int(words[0].max()) + 1 == len(units) - 1  # "?" is the last word and its token is not a candidate
    with pytest.raises(ValueError, match="not tokenized"):
        prompt_words(tokenizer, PROMPTS[::-1], ids, candidates)


def test_word_removals_take_every_token_of_the_best_words() -> None:
    words = torch.tensor([[-1, 0, 0, 1, 2, 2], [0, 1, 1, 1, -1, -1]])
    scores = torch.tensor([[[9.0, 0.2, 0.3, 0.4, 0.1, 0.1]], [[1.0, 0.1, 0.1, 0.1, 5.0, 5.0]]], dtype=torch.float64)
    summed = word_scores(scores, words)
    torch.testing.assert_close(summed, torch.tensor([[[0.5, 0.4, 0.2]], [[1.0, 0.3, 0.0]]], dtype=torch.float64))
    removed = top_k_word_removals(summed, words, 1)
    assert removed.tolist() == [[[False, True, True, False, False, False]], [[True, False, False, False, False, False]]]
    two = top_k_word_removals(summed, words, 2)
    assert two[0].tolist() == [[False, True, True, True, False, False]]
    assert not bool(two[1].any())  # two words: removing both would leave nothing
    with pytest.raises(ValueError, match="at least 1"):
        top_k_word_removals(summed, words, 0)


def test_the_word_view_runs_and_says_so() -> None:
    model, tokenizer = chat_model("qwen2")
    result = evaluate_generation(model, tokenizer, PROMPTS, ("grad_x_input", RANDOM), new_tokens=2, ks=(1, 2),
                                 progress=False, view="word")  # fmt: skip
    assert result.view == "word" and set(result.drops) == {"grad_x_input", RANDOM}
    assert result.drops["grad_x_input"]["2"]["prompts"] == 2 and result.steps == 4
    assert "word view" in markdown_table(result) and "words deleted" in result.removal


def test_a_sentence_loses_the_documents_its_citations_rank_first() -> None:
    model, tokenizer = chat_model("llama")
    item = ChatItem(({"role": "user", "content": QUESTION},), tuple(DOCUMENTS))
    ids = tokenizer(ANSWER, add_special_tokens=False)["input_ids"]
    result = evaluate_documents(model, tokenizer, [item], ("grad_x_input", RANDOM), ks=(1, 2), answers=[ids])
    assert result.view == "document" and result.steps == 2 and result.continuations == [ANSWER]
    # every sentence's drop recomputed independently: its citations' best k documents removed
    cited = explain_citations(model, tokenizer, item.messages, item.documents, answer=ids, method="grad_x_input")
    spans = [sentence.steps for sentence in cited.sentences]
    full = span_log_probabilities(model, [prompt_without(tokenizer, item.messages, item.documents)], ids, spans)[0]
    for k in (1, 2):
        drops = []
        for index, ranked in enumerate(cited.documents):
            removed = tuple(sorted(document for document, _ in ranked[:k]))
            prompt = prompt_without(tokenizer, item.messages, item.documents, removed)
            drops.append(float(full[index] - span_log_probabilities(model, [prompt], ids, spans)[0][index]))
        assert result.drops["grad_x_input"][str(k)]["mean"] == pytest.approx(sum(drops) / len(drops), abs=1e-9)
    assert "vs_random" in result.drops["grad_x_input"]["1"]


def test_both_views_from_the_command_line(tmp_path: Path) -> None:
    folder = save_chat_model("qwen2", tmp_path / "chat")
    items = tmp_path / "items.json"
    items.write_text(json.dumps([{"question": QUESTION, "documents": list(DOCUMENTS)}]), encoding="utf-8")
    assert read_items(items, 5)[0].messages == ({"role": "user", "content": QUESTION},)
    out = tmp_path / "documents"
    status = eval_main(["--generation", "--view", "document", "--model-dir", str(folder), "--documents", str(items),
                        "--new-tokens", "8", "--k", "1", "--methods", "grad_x_input", "--no-progress",
                        "--out", str(out)])  # fmt: skip
    assert status == 0
    document = json.loads(out.with_suffix(".json").read_text())
    assert document["result"]["view"] == "document" and set(document["result"]["drops"]) == {"grad_x_input", RANDOM}
    assert "document view" in out.with_suffix(".md").read_text()
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS), encoding="utf-8")
    status = eval_main(["--generation", "--view", "word", "--model-dir", str(folder), "--prompts", str(prompts),
                        "--new-tokens", "1", "--k", "1", "--methods", "attention", "--no-progress",
                        "--out", str(tmp_path / "words")])  # fmt: skip
    assert status == 0
    assert json.loads((tmp_path / "words.json").read_text())["result"]["view"] == "word"
