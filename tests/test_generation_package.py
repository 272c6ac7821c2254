"""Causal-LM checkpoint folders through ``model_store.package`` (what ``make serve MODELS=name=path`` runs):
validated as the classifiers are (safetensors only, tokenizer present, a pad token decision recorded, an LM head
present or tied), packaged with the generation handler and its token bounds; each refusal is one message."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import yaml

from model_store.package import PackageError, Settings, package, validate
from tests.generation_checkpoint import causal_lm


def test_a_causal_lm_folder_is_packaged_with_the_generation_handler(tmp_path: Path) -> None:
    folder = causal_lm(tmp_path / "lm")
    packaged = package(folder, "writer", tmp_path / "out", Settings(max_new_tokens=12, default_new_tokens=5))
    checkpoint = packaged.checkpoint
    assert checkpoint.task == "generation" and checkpoint.labels == () and checkpoint.default_method == "attnlrp"
    config = yaml.safe_load((packaged.archive / "model-config.yaml").read_text())
    handler = config["handler"]
    assert handler["task"] == "generation" and "labels" not in handler
    assert handler["max_new_tokens"] == 12 and handler["default_new_tokens"] == 5
    assert (packaged.archive / "generation_handler.py").is_file()
    again = package(folder, "writer", tmp_path / "out", Settings(max_new_tokens=12, default_new_tokens=5))
    assert again.reused


def test_a_causal_lm_without_a_pad_token_pads_with_eos(tmp_path: Path) -> None:
    checkpoint = validate(causal_lm(tmp_path / "lm", pad=False), "writer")
    assert checkpoint.pad_token_id == 2 and any("EOS" in warning or "eos" in warning for warning in checkpoint.warnings)


@pytest.mark.parametrize(
    "damage, message",
    [
        ("pickle", "pickle files only"),
        ("tokenizer", "no loadable tokenizer"),
        ("head", "no LM head"),
        ("budget", "exceeds max_new_tokens"),
        ("relevance", "does not work on llama"),
    ],
)
def test_causal_lm_refusals(tmp_path: Path, damage: str, message: str) -> None:
    folder = causal_lm(tmp_path / "lm")
    settings = Settings()
    if damage == "pickle":
        (folder / "model.safetensors").rename(folder / "pytorch_model.bin")
    elif damage == "tokenizer":
        for name in ("tokenizer.json", "tokenizer_config.json"):
            (folder / name).unlink(missing_ok=True)
    elif damage == "head":
        from safetensors.torch import load_file, save_file

        weights = load_file(str(folder / "model.safetensors"))
        weights.pop("lm_head.weight")
        save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    elif damage == "budget":
        settings = Settings(max_new_tokens=4, default_new_tokens=8)
    else:
        settings = Settings(default_method="relevance")
    with pytest.raises(PackageError, match=message):
        validate(folder, "writer", settings)


def test_a_chat_models_template_is_packaged_and_a_chat_template_setting_serves_one(tmp_path: Path) -> None:
    from serving_core.config import HandlerConfig
    from tests.chat_zoo import STYLES, save_chat_model

    chat = package(save_chat_model("qwen2", tmp_path / "qwen2"), "chat", tmp_path / "out")
    assert (chat.archive / "model" / "chat_template.jinja").read_text() == STYLES["qwen2"].template
    assert not any("chat template" in warning for warning in chat.checkpoint.warnings)
    bare = save_chat_model("gpt2", tmp_path / "gpt2")
    assert any("no chat template" in warning for warning in validate(bare, "bare").warnings)
    template_file = tmp_path / "chatml.jinja"
    template_file.write_text(STYLES["qwen2"].template or "", encoding="utf-8")
    models = tmp_path / "models.yaml"
    models.write_text(f"models:\n  bare: {{path: {bare}, chat_template: chatml.jinja}}\n", encoding="utf-8")
    from model_store.package.models_file import read_models_file

    (entry,) = read_models_file(models)
    assert entry.settings.chat_template == STYLES["qwen2"].template
    packaged = package(bare, "bare", tmp_path / "out", entry.settings)
    config = HandlerConfig.from_model_yaml(yaml.safe_load((packaged.archive / "model-config.yaml").read_text()))
    assert config.chat_template == STYLES["qwen2"].template
    with pytest.raises(PackageError, match="does not render a user message"):
        validate(bare, "bare", Settings(chat_template="{{ raise_exception('no chats here') }}"))
    with pytest.raises(PackageError, match="neither a Jinja template nor a readable file"):
        validate(bare, "bare", Settings(chat_template=str(tmp_path / "missing.jinja")))
    from tests.checkpoints import decoder

    with pytest.raises(PackageError, match="generation models"):
        validate(decoder(tmp_path / "classifier"), "classifier", Settings(chat_template="{{ messages }}"))


def test_a_causal_lm_takes_prompts_as_long_as_its_positions_and_the_packager_says_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import torch

    from serving_core.config import HandlerConfig
    from serving_core.tasks.generation_service import GenerationService
    from tests.checkpoints import WORDS
    from tests.generation_checkpoint import serve_rows

    settings = Settings(max_new_tokens=16, default_new_tokens=4)
    with caplog.at_level(logging.INFO, logger="model_store.package.packaging"):
        packaged = package(causal_lm(tmp_path / "lm", positions=1024), "long", tmp_path / "out", settings)
    reason = "max_length 1008: the model's 1024 positions less max_new_tokens 16"
    assert packaged.checkpoint.max_length == 1008 and reason in (packaged.checkpoint.max_length_reason or "")
    assert any(reason in record.getMessage() for record in caplog.records)
    text = (packaged.archive / "model-config.yaml").read_text()
    assert f"# {reason}" in text  # the package's settings say why
    config = HandlerConfig.from_model_yaml(yaml.safe_load(text))
    assert config.max_length == 1008
    service = GenerationService(config, packaged.archive / "model", torch.device("cpu"))
    prompt = " ".join(WORDS[i % len(WORDS)] for i in range(300))
    answer = serve_rows(service, config, [{"prompt": prompt, "max_new_tokens": 4}])[0]
    assert "error" not in answer and len(answer["prompt_tokens"]) >= 300 and len(answer["steps"]) == 4
    # a model of a million positions: what the memory budget holds of a batch's explanations applies
    huge = validate(causal_lm(tmp_path / "huge", positions=1 << 20), "huge", settings)
    assert huge.max_length is not None and 128 < huge.max_length < (1 << 20) - 16
    assert "what a memory budget of 16384 MiB holds of a batch of 8 rows" in (huge.max_length_reason or "")
    assert "pass --max-length" in (huge.max_length_reason or "")
    given = validate(
        causal_lm(tmp_path / "given", positions=1024), "given", Settings(max_length=200, max_new_tokens=16)
    )
    assert given.max_length == 200 and "as given" in (given.max_length_reason or "")
