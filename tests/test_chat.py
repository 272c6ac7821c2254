"""Chats, units and citations in the library, on tiny chat models of every decoder family with a chat template
(:mod:`tests.chat_zoo`): the rendered prompt is the template's own (the same ids as ``apply_chat_template``), every
message and document is found and its tokens say so, template tokens are marked; a unit's score is the sum of its
tokens'; the sentences of an answer explained together equal each explained alone (``StepSum``), batched equals
alone, and a document's citation score is the sum of its units' scores."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from explainers import (
    ChatTemplateError,
    NoChatTemplateError,
    StepSum,
    UnknownRoleError,
    answer_sentences,
    cite,
    decoded_offsets,
    explain_citations,
    explain_spans,
    explain_units,
    render_chat,
    render_prompt,
    span_steps,
    token_units,
    unit_scores,
)
from explainers.tasks.continuation import given_continuation
from explainers.tasks.generation import explain_continuation

from .chat_zoo import CHAT_FAMILIES, DOCUMENTS, QUESTION, STYLES, SYSTEM, chat_model, tokenizer

ANSWER = "It was finished in 1889. It stands in Paris!\nBig Ben is in London."
#: Where documents go for each family's conversation (see tests/chat_zoo.py): the template's own support (Qwen 3's),
#: the system message the conversation opens with, else the first user message (Mistral's and Gemma's refuse a system
#: message).
PLACEMENT = {"llama": "system", "qwen2": "system", "qwen3": "template", "mistral": "user", "gemma2": "user"}


def _conversation(family: str) -> list[dict[str, str]]:
    """Several turns; a system message where the template takes one."""
    turns = [
        {"role": "user", "content": "  Which tower is in Paris? "},
        {"role": "assistant", "content": "The Eiffel Tower."},
        {"role": "user", "content": QUESTION},
    ]
    takes_system = family not in ("mistral", "gemma2")
    return ([{"role": "system", "content": SYSTEM}] if takes_system else []) + turns


def _document_text(index: int) -> str:
    document = DOCUMENTS[index]
    return document if isinstance(document, str) else document["text"]


@pytest.mark.parametrize("family", CHAT_FAMILIES)
def test_messages_and_documents_are_found_and_template_tokens_marked(family: str) -> None:
    _, made = chat_model(family)
    messages = _conversation(family)
    plain = render_chat(made, messages)
    expected = made.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert list(plain.input_ids) == list(expected)
    assert plain.placement is None
    rendered = render_chat(made, messages, DOCUMENTS)
    assert rendered.placement == PLACEMENT[family]
    if family == "qwen3":  # the template's own documents: the same ids as apply_chat_template(documents=...)
        documents = [d if isinstance(d, dict) else {"text": d} for d in DOCUMENTS]
        with_documents = made.apply_chat_template(
            messages, documents=documents, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        assert list(rendered.input_ids) == list(with_documents)
    for result in (plain, rendered):
        for index, message in enumerate(messages):
            span = result.span("message", index)
            assert span is not None, (family, index)
            assert result.text[span[0] : span[1]] in (message["content"], message["content"].strip())
        labels = result.token_labels()
        pieces = made.convert_ids_to_tokens(list(result.input_ids))
        assert len(labels) == len(result.input_ids)
        for piece, label in zip(pieces, labels, strict=True):
            if piece in (STYLES[family].bos, *STYLES[family].controls):
                assert label is None, (family, piece)  # control tokens are the template's
        for index in range(len(messages)):
            start, end = result.span("message", index) or (0, 0)
            inside = [
                label
                for label, offset in zip(labels, result.offsets, strict=True)
                if offset is not None and start <= offset[0] and offset[1] <= end and result.text[offset[0]].strip()
            ]
            assert inside and all(label == ("message", index) for label in inside), (family, index)
    for index in range(len(DOCUMENTS)):
        span = rendered.span("document", index)
        assert span is not None and rendered.text[span[0] : span[1]] == _document_text(index)
        assert ("document", index) in rendered.token_labels()
    assert rendered.span("document", 0, "title") is not None


def test_a_model_without_template_refusals_and_a_configured_template() -> None:
    _, gpt2 = chat_model("gpt2")
    with pytest.raises(NoChatTemplateError, match="no chat template"):
        render_chat(gpt2, [{"role": "user", "content": QUESTION}])
    configured = render_chat(gpt2, [{"role": "user", "content": QUESTION}], chat_template=STYLES["qwen2"].template)
    assert configured.text.startswith("<|im_start|>system\nYou are a helpful assistant.")
    default_system = configured.span("message", 0)
    assert default_system is not None and configured.text[default_system[0] : default_system[1]] == QUESTION
    assert all(label is None for label in configured.token_labels()[:5])  # the template's default system prompt
    _, gemma = chat_model("gemma2")
    with pytest.raises(ChatTemplateError, match="System role not supported"):
        render_chat(gemma, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}])
    with pytest.raises(UnknownRoleError, match="roles: system, user, assistant"):
        render_chat(gemma, [{"role": "robot", "content": QUESTION}])
    prompt = render_prompt(gpt2, QUESTION, DOCUMENTS)
    assert prompt.placement == "prompt" and prompt.text.endswith("\n\n" + QUESTION)
    assert prompt.span("document", 2) is not None and prompt.span("prompt", 0) == (len(prompt.text) - len(QUESTION),
                                                                                   len(prompt.text))  # fmt: skip


def test_contents_a_template_rewrites_are_found_between_its_own_text_or_not_at_all() -> None:
    made = tokenizer("qwen2")
    upper = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content | upper }}<|im_end|>\n{% endfor %}"
    rendered = render_chat(made, [{"role": "user", "content": "where is it?"}], chat_template=upper)
    field = rendered.fields[0]
    assert field.found == "between" and rendered.text[field.start : field.end] == "WHERE IS IT?"
    dropped = "{% for m in messages %}<|im_start|>{{ m.role }}\nhidden<|im_end|>\n{% endfor %}"
    hidden = render_chat(made, [{"role": "user", "content": "where is it?"}], chat_template=dropped)
    assert hidden.fields[0].start is None and all(label is None for label in hidden.token_labels())


def test_units_sum_their_tokens_and_read_as_words() -> None:
    _, made = chat_model("llama")
    rendered = render_chat(made, _conversation("llama"), DOCUMENTS)
    scores = torch.randn(3, len(rendered.input_ids), dtype=torch.float64)
    for granularity in ("token", "word", "sentence"):
        grouped = explain_units(rendered.text, rendered.offsets, scores, granularity, segments=rendered.segments())
        covered = [index for unit in grouped.units for index in unit.tokens]
        assert covered == list(range(len(rendered.input_ids)))  # every token in exactly one unit, in order
        assert torch.allclose(grouped.scores.sum(-1), scores.sum(-1))
        for unit, column in zip(grouped.units, grouped.scores.T, strict=True):
            assert torch.allclose(column, scores[:, unit.first : unit.stop].sum(-1))
            assert "Ġ" not in unit.text and "▁" not in unit.text
            if unit.start is not None and unit.end is not None:
                assert unit.text == rendered.text[unit.start : unit.end]
    words = [unit.text for unit in token_units(rendered.text, rendered.offsets, "word", segments=rendered.segments())]
    assert "1889" in words and "Eiffel" in words and "<|start_header_id|>" in words
    sentences = token_units(rendered.text, rendered.offsets, "sentence", segments=rendered.segments())
    texts = [unit.text for unit in sentences]
    assert "The Eiffel Tower was finished in 1889." in texts and QUESTION in texts
    prefix = unit_scores(scores[0, :10], sentences)  # a step sees a prefix: the units it starts, partly
    assert prefix.shape[0] == len([unit for unit in sentences if unit.first < 10])
    assert torch.allclose(prefix.sum(), scores[0, :10].sum())


def _given(model: Any, prompts: list[list[int]], answers: list[list[int]]) -> Any:
    width = max(len(p) for p in prompts)
    pad = int(model.config.pad_token_id)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    steps = max(len(a) for a in answers)
    continuation = torch.tensor([a + [pad] * (steps - len(a)) for a in answers])
    answer_mask = torch.tensor([[1] * len(a) + [0] * (steps - len(a)) for a in answers])
    return given_continuation(
        model, {"input_ids": ids, "attention_mask": mask}, {"input_ids": continuation, "attention_mask": answer_mask}
    )


@pytest.mark.parametrize("family", CHAT_FAMILIES)
def test_sentences_batched_equal_each_alone_and_cite_the_documents_units(family: str) -> None:
    model, made = chat_model(family)
    messages = _conversation(family)
    first = render_chat(made, messages, DOCUMENTS)
    second = render_chat(made, messages[-1:], DOCUMENTS[:2])
    answers = [made(text, add_special_tokens=False)["input_ids"] for text in (ANSWER, "Big Ben.")]
    text, offsets = decoded_offsets(made, answers[0])
    assert text == made.decode(answers[0], skip_special_tokens=True)
    sentences = answer_sentences(text, offsets)
    assert [text[s.start : s.end] for s in sentences] == [
        "It was finished in 1889.", "It stands in Paris!", "Big Ben is in London."
    ]  # fmt: skip
    spans = [[s.steps for s in sentences], [(0, len(answers[1]))]]
    batch = _given(model, [list(first.input_ids), list(second.input_ids)], answers)
    together = explain_spans(model, batch, spans, method="attnlrp")
    for row, (rendered, answer) in enumerate(((first, answers[0]), (second, answers[1]))):
        alone = _given(model, [list(rendered.input_ids)], [answer])
        labels = rendered.token_labels()
        for index, (start, stop) in enumerate(spans[row]):
            expected = explain_continuation(model, alone, method="attnlrp", steps=StepSum(start, stop))
            got = together.context_scores(row, index)
            scale = float(expected.context_scores(0, 0).abs().max())
            assert torch.allclose(got, expected.context_scores(0, 0), atol=1e-5 * scale, rtol=0), (family, row, index)
            assert torch.isclose(together.values[row, index], expected.values[0, 0], atol=1e-6)
            prompt_scores = got[: len(rendered.input_ids)]
            ranked = cite(got, labels, len(DOCUMENTS) if row == 0 else 2)
            words = explain_units(rendered.text, rendered.offsets, prompt_scores, "word", segments=rendered.segments())
            for document, score in ranked:
                summed = sum(
                    float(value)
                    for unit, value in zip(words.units, words.scores, strict=True)
                    if unit.label == ("document", document)
                )
                assert score == pytest.approx(summed, rel=1e-9, abs=1e-12)
            assert [score for _, score in ranked] == sorted((score for _, score in ranked), reverse=True)


def test_a_span_of_the_answer_is_its_steps_summed() -> None:
    model, made = chat_model("qwen2")
    rendered = render_chat(made, [{"role": "user", "content": QUESTION}], DOCUMENTS)
    answer = made(ANSWER, add_special_tokens=False)["input_ids"]
    text, offsets = decoded_offsets(made, answer)
    start = text.index("Paris")
    first, stop = span_steps(text, offsets, start, start + len("Paris"))
    assert "Paris" in made.decode(answer[first:stop])
    batch = _given(model, [list(rendered.input_ids)], [answer])
    spanned = explain_spans(model, batch, [[(first, stop)]], method="grad_x_input")
    summed = explain_continuation(model, batch, method="grad_x_input", steps=StepSum(first, stop))
    assert torch.allclose(spanned.context_scores(0, 0), summed.context_scores(0, 0), atol=1e-12, rtol=0)
    for bad in ((-1, 3), (5, 5), (0, len(text) + 1)):
        with pytest.raises(Exception, match="0 <= start < end"):
            span_steps(text, offsets, *bad)


def test_explain_citations_is_the_pipeline_in_one_call() -> None:
    model, made = chat_model("gemma2")
    messages = [{"role": "user", "content": QUESTION}]
    cited = explain_citations(model, made, messages, DOCUMENTS, answer=ANSWER, method="grad_x_input")
    assert cited.answer == made.decode(made(ANSWER, add_special_tokens=False)["input_ids"], skip_special_tokens=True)
    assert [cited.answer[s.start : s.end] for s in cited.sentences] == [
        "It was finished in 1889.", "It stands in Paris!", "Big Ben is in London."
    ]  # fmt: skip
    assert cited.rendered.placement == "user" and cited.explanation is not None
    labels = cited.rendered.token_labels()
    for index, ranked in enumerate(cited.documents):
        scores = cited.explanation.context_scores(0, index)
        for document, score in ranked:
            inside = [float(v) for v, label in zip(scores, labels, strict=False) if label == ("document", document)]
            assert score == pytest.approx(sum(inside), rel=1e-9, abs=1e-12)
        assert len(ranked) == len(DOCUMENTS)
    generated = explain_citations(model, made, prompt=QUESTION, documents=DOCUMENTS[:1], max_new_tokens=3)
    assert len(generated.answer_ids) <= 3 and generated.rendered.placement == "prompt"
