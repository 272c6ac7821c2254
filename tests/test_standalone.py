"""The repository stands alone: nothing a user reads or runs points outside it; a running Docker engine (or Podman's
Docker socket) needs no script; an engine script is used only when ``ENGINE_SH`` names one (``.ci/run`` sets it where
the build machine has one); with no engine at all the container test is skipped with one line saying what to
install."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from deploy import engine, stack
from tests.test_system_setup import setup

ROOT = Path(__file__).resolve().parent.parent
#: Spelled in pieces, so that this file does not match itself.
OUTSIDE = ("../" + "shared", "shared/" + "DATA.md", "/" + "work/")


def _tracked_text_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    files = []
    for name in listed.splitlines():
        path = ROOT / name
        if path.suffix in {".png", ".safetensors", ".ico"} or not path.is_file():
            continue
        files.append(path)
    return files


def test_nothing_points_outside_the_repository() -> None:
    found = []
    for path in _tracked_text_files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), start=1):
            if any(marker in line for marker in OUTSIDE) and path.relative_to(ROOT) != Path(".ci/run"):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:120]}")
    assert not found, "references outside the repository:\n" + "\n".join(found)
    assert (ROOT / "docs" / "DATA.md").is_file() and "licence" in (ROOT / "docs" / "DATA.md").read_text()


def _ci_prefix(tmp_path: Path, with_script: bool, preset: str | None = None) -> str:
    """Run .ci/run up to (not including) its `make test`, in a copy placed like a clean clone beside a shared/
    folder; returns the ENGINE_SH it would pass to `make test`."""
    repo = tmp_path / "clone"
    (repo / ".ci").mkdir(parents=True)
    lines = (ROOT / ".ci" / "run").read_text().rstrip().splitlines()
    assert lines[-1] == "make test"
    (repo / ".ci" / "run").write_text("\n".join([*lines[:-1], 'echo "ENGINE_SH=${ENGINE_SH:-}"']) + "\n")
    if with_script:
        (tmp_path / "shared" / "container").mkdir(parents=True)
        (tmp_path / "shared" / "container" / "engine.sh").write_text("#!/bin/sh\n")
    env = {key: value for key, value in os.environ.items() if key != "ENGINE_SH"}
    if preset is not None:
        env["ENGINE_SH"] = preset
    result = subprocess.run(["bash", str(repo / ".ci" / "run")], capture_output=True, text=True, env=env, check=True)
    return result.stdout.strip().splitlines()[-1].removeprefix("ENGINE_SH=")


def test_ci_passes_the_machines_engine_script_only_where_there_is_one(tmp_path: Path) -> None:
    assert _ci_prefix(tmp_path / "a", with_script=True) == str(tmp_path / "a" / "shared" / "container" / "engine.sh")
    assert _ci_prefix(tmp_path / "b", with_script=False) == ""
    assert _ci_prefix(tmp_path / "c", with_script=True, preset="/opt/engine.sh") == "/opt/engine.sh", "a set one wins"


def test_the_engine_script_runs_only_when_engine_sh_names_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("ENGINE_SH", raising=False)
    assert setup.engine_script() is None and setup.ensure_engine(allow_install=True) == 0
    assert capsys.readouterr().out == "", "no script named: nothing to do (a running engine is used as it is)"
    monkeypatch.setenv("ENGINE_SH", str(tmp_path / "absent.sh"))
    assert setup.ensure_engine(allow_install=True) == 0
    assert "is not a file: not starting an engine" in capsys.readouterr().out
    script = tmp_path / "engine.sh"
    script.write_text(f'#!/bin/sh\necho "$1" > {tmp_path / "ran"}\n')
    monkeypatch.setenv("ENGINE_SH", str(script))
    assert setup.ensure_engine(allow_install=True) == 0
    assert (tmp_path / "ran").read_text().strip() == "start"


def test_podmans_docker_socket_is_found(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(engine, "DOCKER_SOCKET", tmp_path / "no-docker.sock")
    socket = tmp_path / "podman" / "podman.sock"
    socket.parent.mkdir()
    environ = {"XDG_RUNTIME_DIR": str(tmp_path), "PATH": "/usr/bin"}
    assert "DOCKER_HOST" not in engine.docker_env(environ), "no socket yet"
    socket.touch()
    assert engine.docker_env(environ)["DOCKER_HOST"] == f"unix://{socket}"
    assert engine.docker_env({**environ, "DOCKER_HOST": "tcp://10.0.0.1:2375"})["DOCKER_HOST"] == "tcp://10.0.0.1:2375"
    monkeypatch.setattr(engine, "DOCKER_SOCKET", socket)  # a Docker socket: left to docker's default
    assert "DOCKER_HOST" not in engine.docker_env(environ)


def test_without_an_engine_the_stack_says_what_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no docker command
    monkeypatch.delenv("ENGINE_SH", raising=False)
    assert engine.engine_problem() == "no `docker` command"
    with pytest.raises(stack.StackError, match=r"no container engine .*Docker Engine.*Podman"):
        stack.engine()
    monkeypatch.setenv("ENGINE_SH", str(tmp_path / "absent.sh"))
    with pytest.raises(stack.StackError, match="is not a file: unset it"):
        stack.engine()


@pytest.mark.slow
def test_without_an_engine_the_container_test_skips_with_one_line(tmp_path: Path) -> None:
    env = {key: value for key, value in os.environ.items() if key not in {"ENGINE_SH", "DOCKER_HOST"}}
    env["PATH"] = str(tmp_path)  # no docker (nor anything else) on the path
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "tests/test_container.py"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode in (0, 5), result.stdout + result.stderr  # 5: this file alone, every test skipped
    lines = [line for line in result.stdout.splitlines() if line.startswith("SKIPPED")]
    assert len(lines) == 1, result.stdout
    assert "container test: no container engine (no `docker` command); to run it, install" in lines[0]
    assert engine.INSTALL_HINT in lines[0] and "passed" not in result.stdout.splitlines()[-1]
