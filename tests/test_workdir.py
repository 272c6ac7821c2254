"""The working directory: models, archives, run state and generated stubs go to ``$EXPLAIN_WORKDIR``, else the current
directory, never next to the code; ``MODEL_STORE``/``RUN_DIR`` still name one folder; the Makefile makes the clone
the working directory (``make serve`` keeps ``model_store/build`` and ``run/``); ``explain-serve``'s command line.
The installed wheel serving from an empty directory is tests/test_wheel.py's."""

from __future__ import annotations

import os
import shutil
import subprocess
import tomllib
from importlib import import_module
from pathlib import Path

import pytest

from doors import explain_serve
from doors.models import default_model_store
from doors.torchserve.protos import output_dir
from explain_client.cli import default_run_dir
from model_store import REPO_ROOT, default_build_dir
from model_store.package import default_out
from supervise import processes
from supervise.environment import run_dir_from_env
from supervise.workdir import WORKDIR_ENV, workdir

SETTINGS = (WORKDIR_ENV, "MODEL_STORE", "RUN_DIR", "EXPLAIN_PROTO_DIR")


def _places() -> dict[str, Path]:
    return {
        "models": default_build_dir(),
        "packages": default_out(),
        "served store": default_model_store(),
        "run": run_dir_from_env(),
        "client's run": default_run_dir().resolve(),
        "stubs": output_dir(),
    }


def test_everything_written_goes_to_the_current_directory_or_the_configured_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for variable in SETTINGS:
        monkeypatch.delenv(variable, raising=False)
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    assert workdir() == here.resolve()
    expected = {
        "models": "model_store/build", "packages": "model_store/build/packages", "served store": "model_store/build",
        "run": "run", "client's run": "run", "stubs": "build/protos",
    }  # fmt: skip
    assert {name: str(path.relative_to(here)) for name, path in _places().items()} == expected
    elsewhere = tmp_path / "elsewhere"
    monkeypatch.setenv(WORKDIR_ENV, str(elsewhere))
    assert workdir() == elsewhere.resolve()
    assert {name: str(path.relative_to(elsewhere)) for name, path in _places().items()} == expected
    monkeypatch.setenv("MODEL_STORE", str(tmp_path / "store"))
    monkeypatch.setenv("RUN_DIR", str(tmp_path / "state"))
    assert default_model_store() == tmp_path / "store" and run_dir_from_env() == tmp_path / "state"


def test_a_clone_is_on_the_children_s_path_an_installed_package_is_not(monkeypatch: pytest.MonkeyPatch) -> None:
    assert processes.FROM_CHECKOUT, "the tests run from a clone"
    assert processes.python_env(base={"PYTHONPATH": "x"})["PYTHONPATH"].split(":") == [str(REPO_ROOT), "x"]
    monkeypatch.setattr(processes, "FROM_CHECKOUT", False)
    assert processes.python_env(base={"PYTHONPATH": "x"})["PYTHONPATH"] == "x"
    assert "PYTHONPATH" not in processes.python_env(base={})


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_keeps_the_clone_as_the_working_directory(tmp_path: Path) -> None:
    probe = "print-workdir: ; @echo $$EXPLAIN_WORKDIR"
    command = ["make", "-s", "-C", str(REPO_ROOT), "--eval", probe, "print-workdir"]
    env = {**os.environ, WORKDIR_ENV: str(tmp_path)}  # a shell's own setting does not move the clone's state
    shown = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=True)
    assert shown.stdout.strip() == str(REPO_ROOT)


def test_explain_serve_is_a_console_script_of_the_launcher() -> None:
    scripts = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]
    module, _, function = scripts["explain-serve"].partition(":")
    assert getattr(import_module(module), function) is explain_serve.entry_point


def test_explain_serve_hands_the_launcher_absolute_folders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    args = explain_serve.build_parser().parse_args(
        ["--models", "a=ckpt/a,b=~/b", "c=/models/c", "--server", "kserve", "--replicas", "2"]
    )
    line = explain_serve.launcher_arguments(args, tmp_path / "work")
    models = line[line.index("--models") + 1].split(",")
    assert models == [f"a={tmp_path / 'ckpt' / 'a'}", f"b={Path('~/b').expanduser()}", "c=/models/c"]
    assert line[line.index("--run-dir") + 1] == str(tmp_path / "work" / "run")
    assert line[line.index("--model-store") + 1] == str(tmp_path / "work" / "model_store" / "build")
    assert line[:3] == ["serve", "--server", "kserve"] and line[-2:] == ["--replicas", "2"]


def test_explain_serve_needs_models(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        explain_serve.main([])
    assert exited.value.code == 2 and "--models name=/path/to/checkpoint" in capsys.readouterr().err
