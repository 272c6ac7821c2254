"""Chat, words and citations through the generation task's serving core in-process, on a saved tiny chat model of
every decoder family with a chat template: a batch mixing chats with documents (sentences and their citations),
word and sentence units, a span of the answer and bad rows; each explained row equals the library on the row alone,
unit scores are the sums of the token scores, citations are the sums over each document's units, the JSON and the
protobuf answers agree, and every bad row gets its error-table code while the good rows are served."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from explain_client.protos import explain_messages
from explainers import decoded_offsets, explain_spans, render_chat, span_steps, token_units
from explainers.tasks.continuation import given_continuation
from serving_core.config import ConfigError, HandlerConfig
from serving_core.tasks.generation_service import GenerationService

from .chat_zoo import CHAT_FAMILIES, DOCUMENTS, QUESTION, STYLES, SYSTEM, save_chat_model
from .generation_checkpoint import serve_rows

ANSWER = "It was finished in 1889. It stands in Paris!"


def _config(**extra: Any) -> HandlerConfig:
    """The chat models' config; a time budget of a day: these tests check answers, not admission (the estimates
    err high on a loaded machine; tests/test_served_speed.py checks them)."""
    handler = {"task": "generation", "default_method": "attnlrp", "max_length": 320, "max_new_tokens": 24,
               "default_new_tokens": 4, "device": "cpu", "max_messages": 4, "max_documents": 3,
               "time_budget_s": 86400, **extra}  # fmt: skip
    return HandlerConfig.from_model_yaml({"handler": handler})


def _serve(service: GenerationService, config: HandlerConfig, requests: list[Any]) -> list[dict[str, Any]]:
    return serve_rows(service, config, requests)


def _turns(family: str) -> list[dict[str, str]]:
    turns = [
        {"role": "user", "content": "Which tower is in Paris?"},
        {"role": "assistant", "content": "The Eiffel Tower."},
        {"role": "user", "content": QUESTION},
    ]
    return turns if family in ("mistral", "gemma2") else [{"role": "system", "content": SYSTEM}, *turns]


def _service(family: str, factory: pytest.TempPathFactory) -> tuple[str, Path, Any]:
    folder = save_chat_model(family, factory.mktemp(family) / "model")
    return family, folder, GenerationService(_config(), folder, torch.device("cpu"))


@pytest.fixture(scope="module", params=CHAT_FAMILIES)
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, Any]:
    return _service(str(request.param), tmp_path_factory)


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, Any]:
    return _service("qwen2", tmp_path_factory)


def test_chats_with_documents_words_sentences_and_spans(served: tuple[str, Path, Any]) -> None:
    family, folder, service = served
    config = _config()
    turns = _turns(family)
    chat = {"messages": turns, "documents": list(DOCUMENTS), "continuation": ANSWER}
    probe = AutoTokenizer.from_pretrained(str(folder))
    answer_text, answer_offsets = decoded_offsets(probe, probe(ANSWER, add_special_tokens=False)["input_ids"])
    paris = span_steps(answer_text, answer_offsets, ANSWER.index("Paris"), len(ANSWER))
    requests: list[Any] = [
        {**chat, "explain": {"method": "attnlrp", "granularity": "word"}},
        {**chat, "explain": {"method": "attnlrp", "granularity": "token", "steps": "sentences"}},
        {**chat, "explain": {"method": "attnlrp", "span": {"start": ANSWER.index("Paris"), "end": len(ANSWER)}}},
        {**chat, "explain": {"method": "attnlrp", "steps": {"sum": list(paris)}}},
        {"messages": turns[-1:], "max_new_tokens": 3, "explain": {"method": "grad_x_input", "granularity": "word"}},
    ]
    answers = _serve(service, config, requests)
    assert all("error" not in answer for answer in answers), answers
    words, tokens, span, summed, generated = answers
    model = AutoModelForCausalLM.from_pretrained(str(folder), attn_implementation="eager").eval()
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    rendered = render_chat(tokenizer, turns, DOCUMENTS)
    assert words["rendered_prompt"] == rendered.text and words["documents_placement"] == rendered.placement
    for index, (message, part) in enumerate(zip(turns, words["messages"], strict=True)):
        assert part["role"] == message["role"]
        assert rendered.text[part["start"] : part["end"]] in (message["content"], message["content"].strip())
        assert any(unit["message"] == index for unit in words["explanation"]["context"])
    for index, part in enumerate(words["documents"]):
        document = DOCUMENTS[index]
        assert rendered.text[part["start"] : part["end"]] == (
            document if isinstance(document, str) else document["text"]
        )
    token_context = tokens["explanation"]["context"]
    assert len(token_context) == len(rendered.input_ids) + len(tokens["steps"])
    assert not any(mark in unit["text"] for unit in token_context + words["explanation"]["context"] for mark in "Ġ▁")
    for unit in token_context:  # a token's text is its characters: in the rendered prompt, or in the answer
        source = ANSWER if unit["generated"] else rendered.text
        assert unit["start"] is None or unit["text"] == source[unit["start"] : unit["end"]]
    assert [unit["template"] for unit in token_context[: len(rendered.input_ids)]] == [
        label is None for label in rendered.token_labels()
    ]
    controls = {STYLES[family].bos, *STYLES[family].controls}
    for unit, piece in zip(token_context, tokens["prompt_tokens"], strict=False):
        if piece in controls:
            assert unit["template"] and unit["message"] is None and unit["document"] is None
    # the sentences, explained together, equal each explained alone by the library
    answer_ids = tokenizer(ANSWER, add_special_tokens=False)["input_ids"]
    sentences = tokens["explanation"]["sentences"]
    assert [sentence["text"] for sentence in sentences] == ["It was finished in 1889.", "It stands in Paris!"]
    prompt = torch.tensor([list(rendered.input_ids)])
    made = given_continuation(model, {"input_ids": prompt}, torch.tensor([answer_ids]))
    for sentence in sentences:
        alone = explain_spans(model, made, [[tuple(sentence["steps"])]], method="attnlrp")
        expected = alone.context_scores(0, 0)
        assert sentence["scores"] == pytest.approx(expected.tolist(), rel=1e-4, abs=1e-5 * float(expected.abs().max()))
        assert sentence["value"] == pytest.approx(float(alone.values[0, 0]), rel=1e-5)
    # word units: each the sum of its tokens' scores; citations: the sums over each document's units
    word_context = words["explanation"]["context"]
    shift = len(rendered.input_ids)
    groups = [
        unit.tokens for unit in token_units(rendered.text, rendered.offsets, "word", segments=rendered.segments())
    ]
    groups += [range(u.first + shift, u.stop + shift) for u in token_units(answer_text, answer_offsets, "word")]
    assert len(groups) == len(word_context)
    for word_sentence, token_sentence in zip(words["explanation"]["sentences"], sentences, strict=True):
        assert word_sentence["documents"] == token_sentence["documents"]
        scale = max(abs(value) for value in token_sentence["scores"])
        token_scores = token_sentence["scores"]
        assert len(word_sentence["scores"]) == len([group for group in groups if group.start < len(token_scores)])
        for group, value in zip(groups, word_sentence["scores"], strict=False):
            assert value == pytest.approx(sum(token_scores[group.start : group.stop]), abs=1e-4 * scale)
        for citation in word_sentence["documents"]:
            own = [
                value
                for unit, value in zip(word_context, word_sentence["scores"], strict=False)
                if unit["document"] == citation["document"]
            ]
            assert citation["score"] == pytest.approx(sum(own), abs=1e-4 * scale)
        ranked = [citation["score"] for citation in word_sentence["documents"]]
        assert ranked == sorted(ranked, reverse=True) and len(ranked) == len(DOCUMENTS)
    # a span of the answer: the same numbers as its steps summed
    steps = span["explanation"]["span"]["steps"]
    assert span["explanation"]["span"]["text"] == "Paris!"
    library = explain_spans(model, made, [[tuple(steps)]], method="attnlrp").context_scores(0, 0)
    scale = float(library.abs().max())
    assert span["explanation"]["span"]["scores"] == pytest.approx(library.tolist(), rel=1e-4, abs=1e-5 * scale)
    assert (summed["explanation"]["sum"]["start"], summed["explanation"]["sum"]["stop"]) == tuple(steps)
    assert summed["explanation"]["sum"]["scores"] == pytest.approx(
        span["explanation"]["span"]["scores"], abs=1e-6 * scale
    )
    assert generated["explanation"]["context"][-1]["generated"] and generated["explanation"]["granularity"] == "word"


def test_bad_rows_get_their_codes_and_the_good_rows_are_served(qwen2: tuple[str, Path, Any]) -> None:
    _, _, service = qwen2
    config = _config()
    user = [{"role": "user", "content": QUESTION}]
    good = {"messages": user, "documents": list(DOCUMENTS[:2]), "max_new_tokens": 3, "explain": True}
    requests: list[Any] = [
        good,
        {"messages": user * 5},
        {"messages": user, "documents": list(DOCUMENTS) * 2},
        {"messages": [{"role": "robot", "content": "hi"}]},
        {"messages": user, "continuation": ANSWER, "explain": {"span": {"start": 3, "end": 999}}},
        {"messages": user, "explain": {"granularity": "paragraph"}},
        {"messages": [{"role": "user", "content": " ".join([QUESTION] * 40)}]},
        {"messages": "hello"},
        {"prompt": "x", "messages": user},
        {"messages": user, "continuation": ANSWER, "explain": {"steps": "sentences", "contrast": "It"}},
        {"prompt": QUESTION, "documents": [DOCUMENTS[0]], "max_new_tokens": 2, "explain": {"granularity": "word"}},
    ]  # fmt: skip
    answers = _serve(service, config, requests)
    codes = {index: answer["error"]["code"] for index, answer in enumerate(answers) if "error" in answer}
    assert codes == {
        1: "too_many_messages",
        2: "too_many_documents",
        3: "unknown_role",
        4: "invalid_target",
        5: "invalid_option",
        6: "too_many_tokens",
        7: "invalid_messages",
        8: "invalid_request",
        9: "invalid_target",
    }
    assert answers[0]["explanation"]["sentences"] is not None and answers[0]["documents_placement"] == "user"
    plain = answers[10]
    assert plain["documents_placement"] == "prompt" and plain["rendered_prompt"].endswith(QUESTION)
    assert any(unit["document"] == 0 for unit in plain["explanation"]["context"])
    assert "paragraph" in answers[5]["error"]["message"] and "token, word, sentence" in answers[5]["error"]["message"]


def test_templates_the_model_lacks_or_refuses(tmp_path: Path) -> None:
    folder = save_chat_model("gpt2", tmp_path / "gpt2")
    config = _config()
    service = GenerationService(config, folder, torch.device("cpu"))
    user = [{"role": "user", "content": QUESTION}]
    refused, prompted = _serve(service, config, [{"messages": user}, {"prompt": QUESTION, "max_new_tokens": 2}])
    assert refused["error"]["code"] == "no_chat_template" and "chat_template" in refused["error"]["message"]
    assert "text" in prompted
    configured = _config(chat_template=STYLES["qwen2"].template)
    with_template = GenerationService(configured, folder, torch.device("cpu"))
    answer = _serve(with_template, configured, [{"messages": user, "max_new_tokens": 2, "explain": True}])[0]
    assert answer["rendered_prompt"].startswith("<|im_start|>system")
    gemma = save_chat_model("gemma2", tmp_path / "gemma2")
    gemma_service = GenerationService(config, gemma, torch.device("cpu"))
    system = [{"role": "system", "content": SYSTEM}, *user]
    refusal = _serve(gemma_service, config, [{"messages": system}])[0]["error"]
    assert refusal["code"] == "invalid_messages" and "System role not supported" in refusal["message"]
    with pytest.raises(ConfigError, match="chat_template"):
        _config(chat_template="{% for %}")
    with pytest.raises(ConfigError, match="generation task only"):
        HandlerConfig.from_model_yaml({"handler": {"task": "text", "labels": ["a"], "max_documents": 2}})


def test_protobuf_chat_rows_answer_as_json_rows(qwen2: tuple[str, Path, Any]) -> None:
    family, _, service = qwen2
    config = _config()
    turns = _turns(family)
    request = explain_messages().ExplainRequest()
    for turn in turns:
        message = request.generation.messages.add()
        message.role, message.content = turn["role"], turn["content"]
    for document in DOCUMENTS:
        added = request.generation.documents.add()
        added.text = document if isinstance(document, str) else document["text"]
        added.title = "" if isinstance(document, str) else document["title"]
    request.generation.continuation = ANSWER
    request.generation.explain.method = "attnlrp"
    request.generation.explain.granularity = "word"
    as_json = {"messages": turns, "documents": list(DOCUMENTS), "continuation": ANSWER,
               "explain": {"method": "attnlrp", "granularity": "word"}}  # fmt: skip
    proto_answer, json_answer = _serve(service, config, [request.SerializeToString(), as_json])
    result = proto_answer["protobuf"].generation
    assert result.rendered_prompt == json_answer["rendered_prompt"] and result.granularity == "word"
    assert [unit.text for unit in result.context] == [unit["text"] for unit in json_answer["explanation"]["context"]]
    assert [unit.HasField("message") for unit in result.context] == [
        unit["message"] is not None for unit in json_answer["explanation"]["context"]
    ]
    assert result.explained_sentences and len(result.sentences) == len(json_answer["explanation"]["sentences"])
    for mine, theirs in zip(result.sentences, json_answer["explanation"]["sentences"], strict=True):
        assert list(mine.scores) == pytest.approx(theirs["scores"], rel=1e-4, abs=1e-5)
        assert [c.document for c in mine.documents] == [c["document"] for c in theirs["documents"]]
    assert [part.role for part in result.messages] == [turn["role"] for turn in turns]
