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
