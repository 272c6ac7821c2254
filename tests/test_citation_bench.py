"""The maths of ``bench/citations.py`` and of the documents it removes (:mod:`explain_eval.documents`), on a tiny chat
model (:mod:`tests.chat_zoo`): a sentence's teacher-forced log-probability equals the value its citation explains,
batched equals alone, leave-one-out equals the difference of two independent forwards, and the agreement measures
(ranks, Spearman, top-1) give the textbook numbers."""

from __future__ import annotations

import math

import pytest
import torch

from bench.citations import (
    Answer,
    agreement,
    answer_of,
    average_ranks,
    document_matrix,
    leave_one_out,
    load_items,
    spearman,
    top_document,
)
from explain_eval.documents import prompt_without, span_log_probabilities
from explainers import explain_citations, render_chat

from .chat_zoo import DOCUMENTS, QUESTION, chat_model

ANSWER = "It was finished in 1889. It stands in Paris! Big Ben is in London."
MESSAGES = [{"role": "user", "content": QUESTION}]


def _answer(tokenizer: object) -> Answer:
    return answer_of(tokenizer, tokenizer(ANSWER, add_special_tokens=False)["input_ids"])  # type: ignore[operator]


def _alone(model: torch.nn.Module, prompt: tuple[int, ...], answer: Answer) -> list[float]:
    """Each sentence's summed log-probability from one unpadded forward of prompt + answer."""
    ids = torch.tensor([[*prompt, *answer.ids]])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].double().log_softmax(dim=-1)
    width = len(prompt)
    values = []
    for start, stop in answer.spans:
        values.append(sum(float(logits[width + step - 1, answer.ids[step]]) for step in range(start, stop)))
    return values


def test_a_sentence_log_probability_is_the_value_its_citation_explains() -> None:
    model, tokenizer = chat_model("llama")
    answer = _answer(tokenizer)
    assert len(answer.sentences) == 3
    cited = explain_citations(model, tokenizer, MESSAGES, DOCUMENTS, answer=list(answer.ids), method="grad_x_input")
    assert cited.explanation is not None
    prompt = render_chat(tokenizer, MESSAGES, DOCUMENTS).input_ids
    values = span_log_probabilities(model, [prompt], answer.ids, answer.spans)
    torch.testing.assert_close(values[0], cited.explanation.values[0].double(), rtol=0, atol=1e-9)


def test_padded_prompts_read_what_each_reads_alone() -> None:
    model, tokenizer = chat_model("qwen2")
    answer = _answer(tokenizer)
    prompts = [prompt_without(tokenizer, MESSAGES, DOCUMENTS, removed) for removed in [(), (0,), (1, 2), (2,)]]
    assert len({len(prompt) for prompt in prompts}) == 4
    batched = span_log_probabilities(model, prompts, answer.ids, answer.spans, batch_size=3)
    for row, prompt in enumerate(prompts):
        torch.testing.assert_close(
            batched[row], torch.tensor(_alone(model, prompt, answer), dtype=torch.float64), rtol=0, atol=1e-9
        )


def test_leave_one_out_is_the_fall_when_one_document_is_removed() -> None:
    model, tokenizer = chat_model("gemma2")
    answer = _answer(tokenizer)
    drops = leave_one_out(model, tokenizer, MESSAGES, DOCUMENTS, answer.ids, answer.spans)
    assert drops.shape == (3, len(DOCUMENTS))
    full = _alone(model, render_chat(tokenizer, MESSAGES, DOCUMENTS).input_ids, answer)
    for document in range(len(DOCUMENTS)):
        kept = [doc for index, doc in enumerate(DOCUMENTS) if index != document]
        without = _alone(model, render_chat(tokenizer, MESSAGES, kept).input_ids, answer)
        expected = torch.tensor([a - b for a, b in zip(full, without, strict=True)], dtype=torch.float64)
        torch.testing.assert_close(drops[:, document], expected, rtol=0, atol=1e-9)
    assert drops.abs().max() > 1e-3  # the documents matter to a random model: the test could fail


def test_a_removed_document_is_gone_and_the_others_renumbered() -> None:
    _, tokenizer = chat_model("llama")
    text = tokenizer.decode(list(prompt_without(tokenizer, MESSAGES, DOCUMENTS, (0,))))
    assert "Eiffel Tower\n" not in text and "[1] Big Ben" in text and "[3]" not in text
    with pytest.raises(ValueError, match="do not exist"):
        prompt_without(tokenizer, MESSAGES, DOCUMENTS, (3,))


def test_ranks_and_spearman_give_the_textbook_numbers() -> None:
    assert average_ranks([3.0, 1.0, 2.0]) == [3.0, 1.0, 2.0]
    assert average_ranks([5.0, 1.0, 5.0, 0.0]) == [3.5, 2.0, 3.5, 1.0]
    assert spearman([1.0, 2.0, 3.0, 4.0], [10.0, 20.0, 30.0, 40.0]) == pytest.approx(1.0)
    assert spearman([1.0, 2.0, 3.0, 4.0], [4.0, 3.0, 2.0, 1.0]) == pytest.approx(-1.0)
    # with ties: 1 - 6 Σd² / (n(n² - 1)) does not hold, the Pearson correlation of average ranks does
    a, b = [1.0, 2.0, 2.0, 4.0, 5.0], [2.0, 1.0, 4.0, 3.0, 5.0]
    ranks_a, ranks_b = [1.0, 2.5, 2.5, 4.0, 5.0], [2.0, 1.0, 4.0, 3.0, 5.0]
    mean = 3.0
    covariance = sum((x - mean) * (y - mean) for x, y in zip(ranks_a, ranks_b, strict=True))
    expected = covariance / math.sqrt(sum((x - mean) ** 2 for x in ranks_a) * sum((y - mean) ** 2 for y in ranks_b))
    assert spearman(a, b) == pytest.approx(expected)
    assert expected == pytest.approx(0.6668859288553503)
    assert math.isnan(spearman([0.0, 0.0, 0.0], [1.0, 2.0, 3.0]))
    with pytest.raises(ValueError):
        spearman([1.0], [1.0, 2.0])


def test_top_document_and_agreement() -> None:
    assert top_document([0.1, 0.5, 0.5]) == 1
    assert top_document([0.0, 0.0]) == 0
    reference = torch.tensor([[0.1, 2.0, -1.0], [3.0, 0.0, 1.0]], dtype=torch.float64)
    scores = torch.tensor([[0.0, 5.0, 1.0], [0.0, 1.0, 2.0]], dtype=torch.float64)
    result = agreement(scores, reference)
    assert result.top1 == [True, False]
    assert result.spearman[0] == pytest.approx(0.5)
    assert result.spearman[1] == pytest.approx(-0.5)
    with pytest.raises(ValueError):
        agreement(scores[:, :2], reference)


def test_document_matrix_places_ranked_citations() -> None:
    matrix = document_matrix([[(2, 0.5), (0, 0.25), (1, -1.0)], [(1, 3.0), (0, 0.0), (2, -2.0)]], 3)
    assert matrix.tolist() == [[0.25, -1.0, 0.5], [0.0, 3.0, -2.0]]


def test_an_answer_is_cut_after_its_third_sentence() -> None:
    _, tokenizer = chat_model("llama")
    ids = tokenizer(ANSWER + " It is old.", add_special_tokens=False)["input_ids"]
    whole = answer_of(tokenizer, ids)
    cut = answer_of(tokenizer, ids, 3)
    assert len(whole.sentences) == 4 and len(cut.sentences) == 3
    assert cut.text == ANSWER and cut.ids == tuple(ids[: whole.sentences[2].steps[1]])


def test_the_items_have_one_answer_passage_and_three_to_eight_passages() -> None:
    items = load_items()
    assert sorted({len(item.documents) for item in items}) == [3, 4, 5, 6, 7, 8]
    assert sorted(len(item.documents) for item in items[:6]) == [3, 4, 5, 6, 7, 8]
    assert len({item.answer_document for item in items}) >= 6
    for item in items:
        assert item.reference_answer.count(".") == 3
