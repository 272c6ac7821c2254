"""One default method: the library's entry points, the serving config, the packager and the client (which names no
method, so the service's default applies) all resolve to :data:`explainers.DEFAULT_METHOD`; a model's
``default_method`` and ``EXPLAIN_DEFAULT_METHOD`` (``explain-serve --default-method``) change the served default; a
default that is not a method, or that a model's family refuses, fails when the model loads (and, for the launcher,
before anything starts) with a message naming the methods that work."""

from __future__ import annotations

import dataclasses
import inspect
import json
import signal
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

import explainers
from doors.models import check_served_default
from explain_client import SERVICE_DEFAULT, Request
from explainers import DEFAULT_METHOD, FAMILIES, TASKS, UnsupportedMethodError, available_methods, supported_methods
from explainers.architectures import support
from model_store.archive import ServingConfig
from model_store.package import Settings, validate
from serving_core import config as serving_config
from serving_core.config import DEFAULT_METHOD_ENV, ConfigError, HandlerConfig
from serving_core.loading import check_default_method, load_classifier
from serving_core.tasks.classify_schema import decode_row
from tests import checkpoints
from tests.arch_zoo import build_token_level
from tests.arch_zoo import text_batch as zoo_batch
from tests.causal_zoo import build_causal, prompts
from tests.conftest import build_bert, text_batch

TEXT_YAML: dict[str, Any] = {"handler": {"task": "text", "labels": ["negative", "neutral", "positive"]}}


def _handler(**keys: Any) -> dict[str, Any]:
    return {"handler": {**TEXT_YAML["handler"], **keys}}


def test_every_entry_point_names_the_one_default() -> None:
    assert DEFAULT_METHOD == "attnlrp" and DEFAULT_METHOD in available_methods()
    for function in (
        explainers.explain,
        explainers.explain_generation,
        explainers.explain_tokens,
        explainers.explain_spans,
        explainers.explain_citations,
    ):
        assert inspect.signature(function).parameters["method"].default == DEFAULT_METHOD, function.__name__
        assert "DEFAULT_METHOD" in (function.__doc__ or ""), f"{function.__name__}'s docstring names the default"
    assert serving_config.DEFAULT_METHOD is DEFAULT_METHOD
    assert HandlerConfig.from_model_yaml(TEXT_YAML, environ={}).default_method == DEFAULT_METHOD
    archive_defaults = {field.name: field.default for field in dataclasses.fields(ServingConfig)}
    assert archive_defaults["default_method"] == DEFAULT_METHOD
    assert SERVICE_DEFAULT == "" and Request(text="x", method=SERVICE_DEFAULT).to_json()["explain"] == {}


def test_no_family_or_task_refuses_the_default() -> None:
    """The default must work wherever the library works: every family, every task it accepts."""
    for model_type, family in FAMILIES.items():
        for task in TASKS:
            classes = {"sequence_classification": family.classes, "token_classification": family.token_classes}
            if classes.get(task, family.causal_lm_classes if task == "causal_lm" else ()):
                assert DEFAULT_METHOD in supported_methods(model_type, task), (model_type, task)


def test_the_library_explains_with_the_default_when_no_method_is_named() -> None:
    torch.manual_seed(0)
    bert = build_bert()
    batch = text_batch(bert)
    named, unnamed = explainers.explain(bert, batch, method=DEFAULT_METHOD), explainers.explain(bert, batch)
    assert unnamed.method == DEFAULT_METHOD and torch.equal(unnamed.scores, named.scores)
    tagger = build_token_level("bert", "token_classification")
    tokens = explainers.explain_tokens(tagger, zoo_batch(tagger), entities=False)
    assert tokens.method == DEFAULT_METHOD
    lm = build_causal("llama")
    generated = explainers.explain_generation(lm, prompts(), max_new_tokens=2)
    assert generated.method == DEFAULT_METHOD


def test_a_refused_default_says_it_is_the_default_and_names_what_works(monkeypatch: pytest.MonkeyPatch) -> None:
    refused = dataclasses.replace(FAMILIES["bert"], refused={DEFAULT_METHOD: "a reason given by the registry"})
    monkeypatch.setitem(support.FAMILIES, "bert", refused)
    bert = build_bert()
    with pytest.raises(UnsupportedMethodError) as caught:
        explainers.explain(bert, text_batch(bert))
    message = str(caught.value)
    assert f"method {DEFAULT_METHOD!r} (the default method) is not supported" in message
    assert "a reason given by the registry" in message and "gae" in message.split("methods that work")[1]


def test_the_client_names_no_method_and_the_service_default_applies() -> None:
    body = Request(text="the crew was rude", method=SERVICE_DEFAULT).to_json()
    served = HandlerConfig.from_model_yaml(TEXT_YAML, environ={})
    assert decode_row({"body": body}, False, served).request.method == DEFAULT_METHOD
    header_only = decode_row({"body": {"text": "the crew was rude"}}, True, served)  # /explanations/{model}
    assert header_only.request.method == DEFAULT_METHOD


def test_the_settings_change_the_served_default() -> None:
    body = Request(text="the crew was rude", method=SERVICE_DEFAULT).to_json()
    per_model = HandlerConfig.from_model_yaml(_handler(default_method="rollout"), environ={})
    assert decode_row({"body": body}, False, per_model).request.method == "rollout"
    everywhere = HandlerConfig.from_model_yaml(_handler(default_method="rollout"), environ={DEFAULT_METHOD_ENV: "gae"})
    assert everywhere.default_method == "gae", "the deployment's setting applies to every model"
    assert decode_row({"body": body}, False, everywhere).request.method == "gae"
    named = Request(text="the crew was rude", method="attention").to_json()
    assert decode_row({"body": named}, False, everywhere).request.method == "attention", "a named method wins"


def test_a_default_that_is_not_a_method_fails_at_load() -> None:
    with pytest.raises(ConfigError, match=rf"{DEFAULT_METHOD_ENV} 'nope' is not a method; choose one of .*attnlrp"):
        HandlerConfig.from_model_yaml(TEXT_YAML, environ={DEFAULT_METHOD_ENV: "nope"})
    with pytest.raises(ConfigError, match=r"handler.default_method 'nope' is not a method"):
        HandlerConfig.from_model_yaml(_handler(default_method="nope"), environ={})


def test_a_default_the_family_refuses_fails_when_the_model_loads(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"default method 'relevance' cannot explain this model"):
        check_default_method("relevance", "llama", "generation")
    check_default_method("relevance", "bert", "text")  # Chefer's LRP works on BERT
    folder = checkpoints.decoder(tmp_path / "decoder")
    config = HandlerConfig.from_model_yaml(
        {"handler": {"task": "text", "labels": ["negative", "positive"]}}, environ={DEFAULT_METHOD_ENV: "relevance"}
    )
    with pytest.raises(ConfigError) as caught:
        load_classifier(config, folder, torch.device("cpu"))
    message = str(caught.value)
    assert "'llama'" in message and DEFAULT_METHOD_ENV in message
    assert DEFAULT_METHOD in message.split("methods that work")[1], "the message names the methods that do work"


def _archive(store: Path, name: str, model_type: str, task: str) -> str:
    archive = store / name
    (archive / "model").mkdir(parents=True)
    (archive / "model-config.yaml").write_text(yaml.safe_dump({"handler": {"task": task, "model_dir": "model"}}))
    (archive / "model" / "config.json").write_text(json.dumps({"model_type": model_type}))
    return name


def test_the_launcher_refuses_a_deployment_default_before_anything_starts(tmp_path: Path) -> None:
    models = {
        "reviews": _archive(tmp_path, "reviews", "bert", "text"),
        "writer": _archive(tmp_path, "w", "gpt2", "generation"),
    }
    check_served_default(tmp_path, models, DEFAULT_METHOD)
    check_served_default(tmp_path, models, "gae")
    with pytest.raises(ConfigError, match=r"model 'writer': default method 'relevance' cannot explain this model"):
        check_served_default(tmp_path, models, "relevance")
    with pytest.raises(ConfigError, match=r"'nope' is not a method"):
        check_served_default(tmp_path, models, "nope")


def test_explain_serve_refuses_a_default_the_checkpoint_cannot_take(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``explain-serve --default-method`` is checked after packaging, before any server starts (exit status 2)."""
    from doors import explain_serve

    for variable in (DEFAULT_METHOD_ENV, "EXPLAIN_WORKDIR", "INFERENCE_PORT", "GRPC_INFERENCE_PORT"):
        monkeypatch.setenv(variable, "")  # restored after the test: explain_serve.main sets them
    for variable in ("MODEL_STORE", "RUN_DIR", "SERVER", "MODELS", "MODELS_FILE"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr(signal, "signal", lambda number, handler: signal.getsignal(number))  # leave pytest's handlers
    folder = checkpoints.decoder(tmp_path / "decoder")
    workdir = tmp_path / "work"
    code = explain_serve.main(["--models", f"clf={folder}", "--workdir", str(workdir), "--default-method", "relevance"])
    assert code == 2
    error = capsys.readouterr().err
    assert "model 'clf': default method 'relevance' cannot explain this model" in error and DEFAULT_METHOD in error
    assert (workdir / "model_store" / "build" / "packages" / "clf" / "model-config.yaml").is_file()
    assert not (workdir / "run" / "torchserve.pid").exists(), "nothing started"


def test_the_packager_defaults_to_the_library_default(tmp_path: Path) -> None:
    checkpoint = validate(checkpoints.decoder(tmp_path / "decoder"), "clf", Settings())
    assert checkpoint.default_method == DEFAULT_METHOD
