"""The system set-up step (scripts/system_setup.py) that `make test` and `make serve` run before anything else."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "system_setup.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("system_setup", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["system_setup"] = module
    spec.loader.exec_module(module)
    return module


setup = _load()


def _bare_path(tmp_path: Path) -> dict[str, str]:
    """An environment whose PATH holds only a python3 (no java, prometheus, chromium, apt-get or sudo)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    env = {key: value for key, value in os.environ.items() if key not in {"PYTHON", "ENGINE_SH"}}
    env["PATH"] = str(bin_dir)
    env["ENGINE_SH"] = str(tmp_path / "no-engine.sh")
    return env


def test_missing_packages_and_no_way_to_install_give_one_message_with_the_command(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--for", "test"], env=_bare_path(tmp_path), capture_output=True, text=True
    )
    assert result.returncode == 1
    message = result.stderr
    assert "no apt-get on this machine" in message
    for name in ("java", "python3.11", "prometheus", "promtool", "prometheus-process-exporter", "chromium"):
        assert name in message.split("Install them with:")[0]
    command = next(line for line in message.splitlines() if "apt-get install" in line)
    packages = command.split("--no-install-recommends")[1].split()
    assert packages == [
        "openjdk-17-jre-headless",
        "python3.11",
        "python3.11-venv",
        "prometheus",
        "prometheus-process-exporter",
        "chromium",
    ] + (["fonts-dejavu-core"] if not Path("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf").exists() else [])
    assert result.stdout == ""


def test_serve_needs_only_java_and_python(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--for", "serve", "--no-install"],
        env=_bare_path(tmp_path),
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1
    head = result.stderr.split("Install them with:")[0]
    assert "java" in head and "python3.11" in head
    assert "prometheus" not in head and "chromium" not in head


def test_no_install_on_this_machine_only_checks() -> None:
    """On the machine the suite runs on, `make test` has already installed everything: the check passes."""
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--for", "test", "--no-install", "--no-engine"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


def test_missing_reads_each_requirement() -> None:
    present = {"java", "python3.11", "prometheus", "promtool"}
    lacking = setup.missing("test", which=lambda name: f"/usr/bin/{name}" if name in present else None)
    names = [req.name for req in lacking]
    assert "prometheus-process-exporter" in names and "chromium" in names
    assert not {"java", "prometheus", "promtool"} & set(names)


def test_packages_are_listed_once_and_sudo_is_non_interactive() -> None:
    prometheus = [req for req in setup.REQUIREMENTS if req.name in {"prometheus", "promtool"}]
    assert setup.packages_of(prometheus) == ["prometheus"]
    update, install = setup.install_command(["prometheus"], as_root=False)
    assert update[:2] == ["sudo", "-n"] and install[:2] == ["sudo", "-n"]
    assert install[-1] == "prometheus" and "-y" in install
    update, install = setup.install_command(["prometheus"], as_root=True)
    assert update[0] == "apt-get" and "sudo" not in install


def test_absent_engine_script_is_not_an_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ENGINE_SH", str(tmp_path / "absent.sh"))
    assert setup.ensure_engine(allow_install=True) == 0


def test_ci_installs_nothing_that_make_test_does_not() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert "apt-get" not in ci
    assert ci.rstrip().splitlines()[-1] == "make test"
    readme = (ROOT / "README.md").read_text()
    assert "make test" in readme.split("## Two commands")[1].split("##")[0]
