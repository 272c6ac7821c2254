"""Unit tests of the launcher's pure parts: config rendering, profiles and the per-run model store."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from doors.torchserve.config import Ports, link_store, load_profile, write_config


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


def test_start_runs_the_same_serve_in_the_background_on_the_same_door(tmp_path: Path) -> None:
    """``start`` resolves the models once, then runs ``python -m doors serve`` with them as archives (no other launcher,
    no re-execution); that command line parses to the same door, folders, example and options."""
    from doors import launch

    archives = {"sentiment": "sentiment/archive", "pairs": str(tmp_path / "packages" / "pairs")}
    given = ["start", "--server", "ray", "--replicas", "2", "--run-dir", str(tmp_path / "run"), "--attach"]
    options = launch.options_of(launch.build_parser().parse_args(given))
    line = launch.background_command(options, archives, ("pairs", "text"))
    assert line[1:4] == ["-m", "doors", "serve"]
    arguments = launch.build_parser().parse_args(line[3:])
    assert (arguments.command, arguments.server, arguments.replicas, arguments.attach) == ("serve", "ray", 2, True)
    assert dict(arguments.archive) == archives
    assert arguments.example == ("pairs", "text") and arguments.run_dir == tmp_path / "run"
    assert launch.options_of(arguments) == options


def test_every_door_of_the_table_has_a_launch_module_with_serve_and_stop(tmp_path: Path) -> None:
    import importlib

    from doors import DOORS, make_goal
    from doors.launch import build_parser, stop

    for door in DOORS.values():
        module = importlib.import_module(door.module)
        assert callable(module.serve) and module.stop(tmp_path) is False
        assert make_goal(door.name) == ("extras" if door.extras else "setup")
        assert build_parser().parse_args(["serve", "--server", door.name]).server == door.name
    assert stop(tmp_path) is False and make_goal("nonsense") == "setup"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--server", "nonsense"])


def test_archive_arguments_are_name_value_pairs() -> None:
    from doors.launch import build_parser

    arguments = build_parser().parse_args(
        ["serve", "--archive", "a=x/archive", "--archive", "b=/y=z", "--example", "b=text"]
    )
    assert arguments.archive == [("a", "x/archive"), ("b", "/y=z")] and arguments.example == ("b", "text")
    for bad in ("a", "=x", "a="):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["serve", "--archive", bad])
