"""Unit tests of the launcher's pure parts: config rendering, profiles and the per-run model store."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from model_store.serving.config import Ports, link_store, load_profile, write_config


def test_config_binds_loopback_and_keeps_auth(tmp_path: Path) -> None:
    ports = Ports(1, 2, 3, 4, 5, 6)
    text = write_config(tmp_path, ports, tmp_path / "store").read_text()
    properties = dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))
    assert properties["inference_address"] == "http://127.0.0.1:1"
    assert properties["management_address"] == "http://127.0.0.1:2"
    assert properties["metrics_address"] == "http://127.0.0.1:3"
    assert properties["grpc_inference_address"] == properties["grpc_management_address"] == "127.0.0.1"
    assert (properties["grpc_inference_port"], properties["grpc_management_port"]) == ("4", "5")
    assert properties["enable_model_api"] == "false" and "disable_token_authorization" not in properties
    assert int(properties["max_request_size"]) <= 4_000_000
    assert properties["allowed_urls"].endswith("$") and "$$" not in properties["allowed_urls"]


def test_free_ports_are_distinct() -> None:
    ports = Ports.free()
    assert len(set(vars(ports).values())) == len(vars(ports)) == 8


def test_profiles_and_overlay(tmp_path: Path) -> None:
    archive = tmp_path / "store" / "sentiment" / "archive"
    (archive / "model").mkdir(parents=True)
    (archive / "model-config.yaml").write_text(
        yaml.safe_dump({"batchSize": 8, "maxBatchDelay": 20, "handler": {"task": "text", "labels": ["a", "b"]}})
    )
    gpu = load_profile("gpu")
    assert gpu["batchSize"] > load_profile("cpu")["batchSize"] and gpu["handler"]["device"] == "cuda"
    assert load_profile("archive") == {}
    with pytest.raises(ValueError, match="known: archive"):
        load_profile("tpu")
    store = link_store(
        tmp_path / "run", tmp_path / "store", {"a": "sentiment/archive", "b": "sentiment/archive"}, {"b": gpu}
    ).path
    untouched = yaml.safe_load((store / "a" / "model-config.yaml").read_text())
    changed = yaml.safe_load((store / "b" / "model-config.yaml").read_text())
    assert untouched["batchSize"] == 8 and untouched["handler"] == {"task": "text", "labels": ["a", "b"]}
    assert changed["batchSize"] == gpu["batchSize"] and changed["maxBatchDelay"] == gpu["maxBatchDelay"]
    assert changed["handler"]["labels"] == ["a", "b"] and changed["handler"]["device"] == "cuda"
    assert (store / "b" / "model").resolve() == (archive / "model").resolve()
