"""Causal-LM checkpoint folders through ``model_store.package`` (what ``make serve MODELS=name=path`` runs):
validated as the classifiers are (safetensors only, tokenizer present, a pad token decision recorded, an LM head
present or tied), packaged with the generation handler and its token bounds; each refusal is one message."""

from __future__ import annotations

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
