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


def test_the_door_handoff_is_a_command_line_the_door_launcher_reads(tmp_path: Path) -> None:
    """``SERVER=kserve|ray``: TorchServe's launcher resolves the archives, then runs ``python -m servers`` with them
    (no import between the two); that command line parses to the same folders, example and options."""
    from model_store.serving import launcher
    from servers.launcher import build_parser

    archives = {"sentiment": tmp_path / "sentiment" / "archive", "pairs": tmp_path / "packages" / "pairs"}
    given = ["start", "--server", "ray", "--replicas", "2", "--run-dir", str(tmp_path / "run")]
    line = launcher.door_command(launcher.build_parser().parse_args(given), archives, ("pairs", "text"))
    assert line[1:3] == ["-m", "servers"]
    arguments = build_parser().parse_args(line[3:])
    assert (arguments.command, arguments.server, arguments.replicas) == ("start", "ray", 2)
    assert dict(arguments.archive) == {name: str(folder.resolve()) for name, folder in archives.items()}
    assert arguments.example == ("pairs", "text") and arguments.run_dir == tmp_path / "run"


def test_archive_arguments_are_name_value_pairs() -> None:
    from model_store.serving.launcher import build_parser

    arguments = build_parser().parse_args(
        ["serve", "--archive", "a=x/archive", "--archive", "b=/y=z", "--example", "b=text"]
    )
    assert arguments.archive == [("a", "x/archive"), ("b", "/y=z")] and arguments.example == ("b", "text")
    for bad in ("a", "=x", "a="):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["serve", "--archive", bad])
