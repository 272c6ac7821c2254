"""Log-probabilities and stop sequences of the generation task (what the OpenAI API's ``logprobs`` and ``stop`` are
served from), in-process: each step's log-probability and most probable tokens equal an independent forward's
``log_softmax``, the same batched or alone, and asking for them changes nothing else; a stop sequence ends the row at
the step that wrote it, the text ends before it, and an explained answer's sentences stay inside that text."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from explainers.tasks.continuation import generate_continuation, step_logprobs
from serving_core.config import HandlerConfig
from serving_core.tasks.generation_logprobs import byte_level_decoder
from serving_core.tasks.generation_service import GenerationService
from tests.chat_zoo import tokenizer as chat_tokenizer
from tests.generation_checkpoint import PROMPTS, causal_lm, serve_rows

CONFIG = HandlerConfig.from_model_yaml(
    {"handler": {"task": "generation", "default_method": "grad_x_input", "max_length": 16, "max_new_tokens": 8,
                 "default_new_tokens": 3, "device": "cpu"}}
)  # fmt: skip


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return causal_lm(tmp_path_factory.mktemp("lm") / "model")


@pytest.fixture(scope="module")
def service(folder: Path) -> GenerationService:
    return GenerationService(CONFIG, folder, torch.device("cpu"))


def _forward_logprobs(folder: Path, service: GenerationService, prompt: str, ids: list[int]) -> torch.Tensor:
    """``(T, vocab)`` the log-probabilities at each step from one plain forward over prompt + continuation."""
    model = AutoModelForCausalLM.from_pretrained(str(folder)).eval()
    prompt_ids = service.tokenizer(prompt)["input_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + ids])).logits[0]
    return logits[len(prompt_ids) - 1 : len(prompt_ids) - 1 + len(ids)].float().log_softmax(-1)


def test_logprobs_equal_a_forward_and_change_nothing_else(service: GenerationService, folder: Path) -> None:
    documents: list[dict[str, Any]] = [
        {"prompt": PROMPTS[0], "max_new_tokens": 5, "logprobs": 3},
        {"prompt": PROMPTS[0], "max_new_tokens": 5},
        {"prompt": PROMPTS[1], "max_new_tokens": 4, "logprobs": 0},
        {"prompt": PROMPTS[2], "continuation": "the food was slow", "logprobs": 2},
        {"prompt": PROMPTS[0], "max_new_tokens": 5, "logprobs": 21},
    ]
    batch = serve_rows(service, CONFIG, documents)
    assert batch[4]["error"]["code"] == "invalid_request"
    asked, plain, zero, given = batch[:4]
    assert asked["text"] == plain["text"] and [s["probability"] for s in asked["steps"]] == [
        s["probability"] for s in plain["steps"]
    ]
    assert all(key not in step for step in plain["steps"] for key in ("logprob", "text", "top_logprobs"))
    for document, answer in ((documents[0], asked), (documents[2], zero), (documents[3], given)):
        ids = [step["token_id"] for step in answer["steps"]]
        expected = _forward_logprobs(folder, service, document["prompt"], ids)
        for index, step in enumerate(answer["steps"]):
            assert step["logprob"] == pytest.approx(float(expected[index, step["token_id"]]), abs=1e-4)
            assert step["text"] == service.tokenizer.decode([step["token_id"]])
            values, top_ids = expected[index].topk(document["logprobs"])
            assert [top["token_id"] for top in step["top_logprobs"]] == top_ids.tolist()
            assert [top["logprob"] for top in step["top_logprobs"]] == pytest.approx(values.tolist(), abs=1e-4)
            if document["logprobs"] and "continuation" not in document:  # greedy: the chosen token is the top one
                assert step["top_logprobs"][0]["token_id"] == step["token_id"]
    alone = serve_rows(service, CONFIG, [documents[0]])[0]
    assert alone["text"] == asked["text"]
    for mine, batched in zip(alone["steps"], asked["steps"], strict=True):
        assert mine["logprob"] == pytest.approx(batched["logprob"], abs=1e-5)
        assert [top["token_id"] for top in mine["top_logprobs"]] == [top["token_id"] for top in batched["top_logprobs"]]


def test_a_stop_sequence_ends_the_row_where_it_is_written(service: GenerationService) -> None:
    free = serve_rows(service, CONFIG, [{"prompt": PROMPTS[0], "max_new_tokens": 8}])[0]
    words = free["text"].split(" ")
    assert len(words) >= 4, free["text"]
    stop = f"{words[1]} {words[2]}"
    start = free["text"].index(stop)
    documents: list[dict[str, Any]] = [
        {"prompt": PROMPTS[0], "max_new_tokens": 8, "stop": ["zebra", stop],
         "explain": {"method": "grad_x_input", "steps": "sentences", "granularity": "word"}},
        {"prompt": PROMPTS[0], "max_new_tokens": 8, "stop": "zebra"},
        {"prompt": PROMPTS[0], "continuation": "the food", "stop": "x"},
        {"prompt": PROMPTS[0], "stop": ""},
        {"prompt": PROMPTS[0], "stop": ["a"] * 17},
    ]  # fmt: skip
    stopped, unmatched, *refused = serve_rows(service, CONFIG, documents)
    assert [answer["error"]["code"] for answer in refused] == ["invalid_request"] * 3
    assert stopped["stop_reason"] == "stop" and stopped["stop"] == stop
    assert stopped["text"] == free["text"][:start]
    ids = [step["token_id"] for step in stopped["steps"]]
    assert stop in service.tokenizer.decode(ids) and stop not in service.tokenizer.decode(ids[:-1])
    assert [step["token_id"] for step in stopped["steps"]] == [
        step["token_id"] for step in free["steps"][: len(stopped["steps"])]
    ]
    assert all(sentence["end"] <= len(stopped["text"]) for sentence in stopped["explanation"]["sentences"])
    assert unmatched["text"] == free["text"] and unmatched["stop_reason"] == free["stop_reason"]
    assert "stop" not in unmatched


def test_the_library_records_logprobs_only_when_asked_and_stops_when_told(folder: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(str(folder)).eval()
    inputs = {"input_ids": torch.tensor([[4, 5, 6], [4, 7, 8]])}
    plain = generate_continuation(model, inputs, 4, {"eos_token_id": None})
    assert plain.logprobs is None
    recorded = generate_continuation(model, inputs, 4, {"eos_token_id": None}, top_logprobs=2)
    assert recorded.logprobs is not None and torch.equal(recorded.tokens, plain.tokens)
    assert recorded.logprobs.top_ids.shape == (2, 4, 2)
    assert torch.allclose(recorded.logprobs.chosen.exp(), plain.probabilities, atol=1e-6)  # type: ignore[arg-type]
    with torch.no_grad():
        logits = model(recorded.sequences).logits[:, 2:-1]
    again = step_logprobs(logits, recorded.tokens, recorded.token_mask, 2)
    assert torch.allclose(again.chosen, recorded.logprobs.chosen, atol=1e-4)
    assert torch.equal(again.top_ids, recorded.logprobs.top_ids)
    calls: list[int] = []

    def second_row_after_two(tokens: torch.Tensor) -> torch.Tensor:
        calls.append(tokens.shape[1])
        return torch.tensor([False, tokens.shape[1] >= 2])

    stopped = generate_continuation(model, inputs, 4, {"eos_token_id": None}, stop=second_row_after_two)
    assert stopped.token_mask.sum(dim=1).tolist() == [4, 2] and calls == [1, 2, 3, 4]
    assert torch.equal(stopped.tokens[0], plain.tokens[0]) and torch.equal(stopped.tokens[1, :2], plain.tokens[1, :2])


def test_byte_level_bytes_spell_the_answer() -> None:
    tokenizer = chat_tokenizer("llama")
    decoder = byte_level_decoder(tokenizer)
    assert decoder is not None and len(set(decoder.values())) == 256
    text = "Eiffel — 1889 ✓"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    pieces = tokenizer.convert_ids_to_tokens(ids)
    assert bytes(decoder[c] for piece in pieces for c in piece).decode("utf-8") == text
    assert byte_level_decoder(chat_tokenizer("mistral")) is None
