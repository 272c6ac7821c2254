"""The two distributions' metadata agree with each other and with the Makefile and the Dockerfile: one version
number, Python 3.11-3.13, no exact torch pin, torch from TORCH_INDEX_URL (CPU by default, the CUDA build and the
``gpu`` profile with GPU=1), and the image's requirement lists read from the right extras."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

from explainers._version import __version__

ROOT = Path(__file__).resolve().parent.parent
CLIENT = f"transformer-explain-client=={__version__}"


def _project(path: Path) -> dict[str, Any]:
    return dict(tomllib.loads(path.read_text(encoding="utf-8"))["project"])


SERVICE = _project(ROOT / "pyproject.toml")
CLIENT_PROJECT = _project(ROOT / "explain_client" / "pyproject.toml")


def _all_requirements(project: dict[str, Any]) -> list[str]:
    return [
        *project["dependencies"],
        *(r for extra in project.get("optional-dependencies", {}).values() for r in extra),
    ]


def test_one_version_number() -> None:
    settings = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert SERVICE["dynamic"] == ["version"] and "version" not in SERVICE
    assert settings["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "explainers._version.__version__"}
    assert CLIENT_PROJECT["version"] == __version__
    extras = SERVICE["optional-dependencies"]
    assert CLIENT in extras["serve"] and CLIENT in extras["eval"], "the service and explain-eval import the client"
    assert f"\n## {__version__}\n" in (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")


def test_python_3_11_to_3_13_and_torch_a_range() -> None:
    assert SERVICE["requires-python"] == ">=3.11,<3.14"
    assert SERVICE["dependencies"] == ["torch>=2.6", "transformers>=5.20,<6", "scipy>=1.11"]
    for requirement in _all_requirements(SERVICE) + _all_requirements(CLIENT_PROJECT):
        assert not re.match(r"torch\s*==", requirement), f"an exact torch pin: {requirement}"
    assert (ROOT / "LICENSE").read_bytes() == (ROOT / "explain_client" / "LICENSE").read_bytes()
    assert SERVICE["license"] == CLIENT_PROJECT["license"] == "MIT" and "MIT License" in (ROOT / "LICENSE").read_text()


def test_the_kserve_extra_and_the_makefile_install_kserve_together() -> None:
    """kserve's wheel cannot be an install requirement (pyproject.toml says why): the extra carries its other
    requirements and the Makefile adds the wheel with --no-deps."""
    assert not any(r.startswith("kserve") for r in SERVICE["optional-dependencies"]["kserve"])
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert "install --quiet --no-deps kserve==$(KSERVE_VERSION)" in makefile
    assert "pip install --no-deps kserve==" in (ROOT / "pyproject.toml").read_text(encoding="utf-8")


def _dry_run(*args: str) -> str:
    """What ``make -n`` would run (nothing is executed), for a virtualenv that does not exist."""
    command = ["make", "-n", "--no-print-directory", "VENV=/nonexistent/venv", *args]
    result = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"}
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_torch_comes_from_the_cpu_index_unless_gpu_is_asked_for() -> None:
    cpu = _dry_run("setup")
    assert '--index-url "https://download.pytorch.org/whl/cpu" "torch==2.13.0"' in cpu
    assert "/nonexistent/venv/.torch-cpu-2.13.0" in cpu
    assert "-c /nonexistent/venv/torch-constraint.txt -e '.[serve,eval,dev]'" in cpu, "later installs keep that torch"
    gpu = _dry_run("setup", "GPU=1")
    assert '--index-url "https://pypi.org/simple" "torch==2.13.0"' in gpu and ".torch-cuda-2.13.0" in gpu
    chosen = _dry_run("setup", "TORCH_INDEX_URL=http://127.0.0.1:1/simple/", "TORCH_VERSION=2.9.1")
    assert '--index-url "http://127.0.0.1:1/simple/" "torch==2.9.1"' in chosen
    assert 'PYTHON="python3.12"' in _dry_run("setup", "PYTHON=python3.12")


def test_gpu_selects_the_gpu_profile() -> None:
    assert 'PROFILE=""' in _dry_run("serve", "-o", "setup")
    assert 'PROFILE="gpu"' in _dry_run("serve", "GPU=1", "-o", "setup")
    assert 'PROFILE="cpu-pooled"' in _dry_run("start", "GPU=1", "PROFILE=cpu-pooled", "-o", "setup")


def test_the_image_installs_the_library_and_the_serve_extra_without_the_client_pin(tmp_path: Path) -> None:
    """The Dockerfile's requirement lists, computed by its own commands from pyproject.toml."""
    dockerfile = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    snippets = re.findall(r'^RUN python -c "(.*)" >(/requirements[-a-z]*\.txt)$', dockerfile, flags=re.MULTILINE)
    assert [target for _, target in snippets] == ["/requirements.txt", "/requirements-doors.txt"]
    lists = {}
    for code, target in snippets:
        code = code.replace("/tmp/pyproject.toml", str(ROOT / "pyproject.toml"))
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        lists[target] = result.stdout.split()
    runtime = lists["/requirements.txt"]
    assert {"torch>=2.6", "torchserve==0.12.0", "grpcio-tools>=1.60", "setuptools>=77"} <= set(runtime)
    assert not [r for r in runtime + lists["/requirements-doors.txt"] if r.startswith("transformer-explain-")]
    assert "ray[serve]==2.60.0" in lists["/requirements-doors.txt"]
