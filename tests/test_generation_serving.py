"""The generation task's serving core in-process: rows decoded from JSON and protobuf, generated together, explained
as each asks, answered in the encoding they came in, each compared with the same checkpoint explained by
:func:`explainers.explain_generation`; every bad row gets its error-table code while the good rows are served."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from explain_client.protos import explain_messages
from explainers import explain_generation
from serving_core.config import ConfigError, HandlerConfig
from serving_core.tasks.generation_service import GenerationService
from tests.generation_checkpoint import PROMPTS, causal_lm, serve_rows

CONFIG = HandlerConfig.from_model_yaml(
    {"handler": {"task": "generation", "default_method": "grad_x_input", "max_length": 16, "max_new_tokens": 6,
                 "default_new_tokens": 3, "device": "cpu"}}
)  # fmt: skip


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return causal_lm(tmp_path_factory.mktemp("lm") / "model")


@pytest.fixture(scope="module")
def service(folder: Path) -> GenerationService:
    return GenerationService(CONFIG, folder, torch.device("cpu"))


def _serve(service: GenerationService, documents: list[Any]) -> list[dict[str, Any]]:
    return serve_rows(service, CONFIG, documents)


def _local(folder: Path) -> tuple[Any, Any]:
    model = AutoModelForCausalLM.from_pretrained(str(folder), attn_implementation="eager").eval()
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    return model, tokenizer


def test_a_mixed_batch_is_served_row_by_row(service: GenerationService, folder: Path) -> None:
    documents: list[Any] = [
        {"prompt": PROMPTS[0], "max_new_tokens": 4, "explain": {"method": "grad_x_input"}},
        {"prompt": PROMPTS[1]},
        {"prompt": PROMPTS[2], "max_new_tokens": 5, "explain": {"method": "rollout", "steps": [0, -1]}},
        {"prompt": PROMPTS[0], "explain": {"method": "saliency"}},
        {"prompt": PROMPTS[0], "max_new_tokens": 60},
        {"prompt": "   "},
        {"prompt": PROMPTS[0], "explain": {"method": "grad_x_input", "steps": [9]}},
        {"prompt": PROMPTS[0], "explain": {"method": "grad_x_input", "contrast": "zebra"}},
        {"prompt": PROMPTS[1], "max_new_tokens": 4, "explain": {"method": "attnlrp", "steps": "sum"}},
        {"prompt": PROMPTS[2], "max_new_tokens": 3, "explain": {"method": "grad_x_input", "contrast": "good"}},
        {"prompt": " ".join([PROMPTS[1]] * 3)},
        {"prompt": PROMPTS[0], "generation": {"do_sample": True, "seed": 3, "top_k": 4}, "max_new_tokens": 4},
    ]
    answers = _serve(service, documents)
    errors = {index: answer["error"]["code"] for index, answer in enumerate(answers) if "error" in answer}
    assert errors == {
        3: "unknown_method",
        4: "too_many_tokens",
        5: "missing_prompt",
        6: "invalid_target",
        7: "invalid_target",
        10: "too_many_tokens",
    }
    model, tokenizer = _local(folder)

    def local(prompt: str, new: int, **kwargs: Any) -> Any:
        return explain_generation(model, tokenizer([prompt], return_tensors="pt"), max_new_tokens=new, **kwargs)

    first = local(PROMPTS[0], 4, method="grad_x_input")
    answer = answers[0]
    assert [step["token_id"] for step in answer["steps"]] == first.generated[0][first.generated_mask[0]].tolist()
    assert answer["explanation"]["steps"] == list(range(len(answer["steps"])))
    for index, step in enumerate(answer["steps"]):
        expected = first.context_scores(0, index)
        assert step["scores"] == pytest.approx(expected.tolist(), rel=1e-4, abs=1e-5)
        assert step["probability"] == pytest.approx(float(first.probabilities[0, index]), rel=1e-4)
        assert len(step["scores"]) == len(answer["prompt_tokens"]) + index
    assert answers[1]["text"] and "explanation" not in answers[1] and len(answers[1]["steps"]) <= 3
    picked = answers[2]
    explained = [index for index, step in enumerate(picked["steps"]) if "scores" in step]
    assert explained == sorted({0, len(picked["steps"]) - 1})
    summed = answers[8]["explanation"]["sum"]
    expected_sum = local(PROMPTS[1], 4, method="attnlrp", steps="sum")
    assert summed["scores"] == pytest.approx(expected_sum.context_scores(0, 0).tolist(), rel=1e-4, abs=1e-5)
    contrast = answers[9]
    good = tokenizer.convert_tokens_to_ids("good")
    assert all(step["foil_id"] == good for step in contrast["steps"])
    sampled = answers[11]
    alone = _serve(service, [documents[11]])[0]
    assert [s["token_id"] for s in sampled["steps"]] == [s["token_id"] for s in alone["steps"]]


def test_protobuf_rows_and_a_given_continuation(service: GenerationService) -> None:
    messages = explain_messages()
    generated = _serve(service, [{"prompt": PROMPTS[0], "max_new_tokens": 4}])[0]
    ids = [step["token_id"] for step in generated["steps"]]
    request = messages.ExplainRequest()
    request.generation.prompt = PROMPTS[0]
    request.generation.continuation_ids.extend(ids)
    request.generation.explain.method = "grad_x_input"
    request.generation.explain.steps.extend([1])
    as_json = {"prompt": PROMPTS[0], "continuation_ids": ids, "explain": {"method": "grad_x_input", "steps": [1]}}
    proto_answer, json_answer = _serve(service, [request.SerializeToString(), as_json])
    result = proto_answer["protobuf"].generation
    assert result.stop_reason == "given" and json_answer["stop_reason"] == "given"
    assert [step.token_id for step in result.steps] == ids
    assert result.steps[1].explained and not result.steps[0].explained
    assert list(result.steps[1].scores) == pytest.approx(json_answer["steps"][1]["scores"], rel=1e-5, abs=1e-6)
    probabilities = [step["probability"] for step in generated["steps"]]
    assert [step["probability"] for step in json_answer["steps"]] == pytest.approx(probabilities, rel=1e-4)
    wrong = messages.ExplainRequest(text="a classifier request")
    assert _serve(service, [wrong.SerializeToString()])[0]["protobuf"].error.code == "unsupported_input"


def test_generation_config_is_checked() -> None:
    with pytest.raises(ConfigError, match="no labels"):
        HandlerConfig.from_model_yaml({"handler": {"task": "generation", "labels": ["a"]}})
    with pytest.raises(ConfigError, match="exceeds max_new_tokens"):
        HandlerConfig.from_model_yaml({"handler": {"task": "generation", "max_new_tokens": 4, "default_new_tokens": 8}})
