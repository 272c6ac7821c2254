"""README's first command on a fresh Debian 13 (trixie: Python 3.13, Java 21), from a fresh copy of the repository.

A bare Debian 13 image gets only what README asks a user to have (``make`` and ``python3``), then ``git archive`` of
HEAD (the committed tree, not the working tree) and ``make setup``: the part of ``make serve`` that installs — the
system packages this release has (``scripts/system_setup.py``: Java 21, python3.13-venv), the virtualenv, torch, the
project and its service extras. Then, in that virtualenv, ``import explainers`` and TorchServe's ``torchserve
--help``. Building the default models and serving (about 15 more minutes on 2 cores) is left out of CI's time;
CHANGELOG/README give the whole run's figures.

Debian 13 has no Python 3.11, so the local CPU torch wheel of these machines does not fit: torch comes from PyPI
(``TORCH_INDEX_URL=https://pypi.org/simple``, the CUDA build, several GB) unless ``DEBIAN13_TORCH_INDEX_URL`` names
another index (PyTorch's CPU index on a machine that reaches it). Skipped with one line where no container engine
answers (as tests/test_container.py), or where no Debian 13 image can be had.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests import container_support as support

logger = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parent.parent
#: The image: $DEBIAN13_IMAGE, else the engine script's bare trixie (`engine.sh distro trixie`), else Docker Hub's.
LOCAL_IMAGE = "local/trixie:base"
HUB_IMAGE = "debian:trixie"
TORCH_INDEX_URL = os.environ.get("DEBIAN13_TORCH_INDEX_URL", "https://pypi.org/simple")
#: apt, a Python 3.13 virtualenv, a CUDA torch from PyPI (~3 GB) and the project: about 5 minutes here.
SETUP_TIMEOUT = 1200
pytestmark = [pytest.mark.slow, pytest.mark.timeout(SETUP_TIMEOUT + 600)]
ENGINE_PROBLEM = support.engine_problem()
if ENGINE_PROBLEM is not None:
    pytest.skip(support.skip_line(ENGINE_PROBLEM).replace("container test", "Debian 13 test"), allow_module_level=True)

#: Run in the container as root, as a user's first commands on a fresh machine would be (README's prerequisites,
#: then its first command up to the install), then the checks; the last line is one JSON document.
SCRIPT = r"""
set -eu
started=$(date +%s)
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends make python3 >/dev/null
mkdir -p /home/user/explain && cd /home/user/explain && tar -xf /src/repo.tar
make setup 2>&1 | tee /src/setup.log | grep -E '^(system set-up|/usr/bin/python3|\.venv/bin/pip install)' || true
test -f .venv/.installed
seconds=$(( $(date +%s) - started ))
.venv/bin/torchserve --help > /src/torchserve-help.txt
.venv/bin/python - "$seconds" <<'EOF'
import importlib.metadata as m, json, subprocess, sys
import explainers, torch
from explainers._version import __version__
java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.splitlines()[0]
names = [d.metadata["Name"].lower() for d in m.distributions()]
size = subprocess.run(["du", "-sm", ".venv"], capture_output=True, text=True).stdout.split()[0]
print(json.dumps({
    "python": sys.version.split()[0], "java": java, "torch": torch.__version__, "version": __version__,
    "explainers": explainers.__file__, "torchserve": m.version("torchserve"), "seconds": int(sys.argv[1]),
    "venv_mib": int(size), "cuda_packages": sorted(n for n in names if n.startswith(("nvidia", "cuda"))),
}))
EOF
"""


def _image() -> str | None:
    """The Debian 13 image to use, building or pulling it where that is possible; None where there is none."""
    named = os.environ.get("DEBIAN13_IMAGE")
    candidates = [named] if named else [LOCAL_IMAGE, HUB_IMAGE]
    for image in candidates:
        if subprocess.run(["docker", "image", "inspect", image], capture_output=True).returncode == 0:
            return image
    if named:
        return None
    script = os.environ.get("ENGINE_SH")
    if script and Path(script).is_file():
        built = subprocess.run(["bash", script, "distro", "trixie"], capture_output=True, text=True, timeout=900)
        if built.returncode == 0:
            return LOCAL_IMAGE
    pulled = subprocess.run(["docker", "pull", "-q", HUB_IMAGE], capture_output=True, text=True, timeout=600)
    return HUB_IMAGE if pulled.returncode == 0 else None


def test_readme_first_command_sets_up_a_fresh_debian_13(tmp_path: Path) -> None:
    image = _image()
    if image is None:
        pytest.skip(f"Debian 13 test: no Debian 13 image ({LOCAL_IMAGE}, {HUB_IMAGE} or $DEBIAN13_IMAGE) here")
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", "-o", str(tmp_path / "repo.tar"), "HEAD"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert archive.returncode == 0, archive.stderr
    name = f"explain-debian13-{os.getpid()}-{int(time.time()) % 100000}"
    command = ["docker", "run", "--rm", "--name", name, "--network", "host", "-v", f"{tmp_path}:/src"]
    command += ["-e", f"TORCH_INDEX_URL={TORCH_INDEX_URL}", image, "bash", "-c", SCRIPT]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=SETUP_TIMEOUT)
    except subprocess.TimeoutExpired:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, timeout=120)
        log = tmp_path / "setup.log"
        tail = log.read_text()[-4000:] if log.exists() else ""
        pytest.fail(f"make setup in {image} ran past {SETUP_TIMEOUT} s:\n{tail}")
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"in {image}:\n{output[-6000:]}"
    report = json.loads(result.stdout.strip().splitlines()[-1])
    logger.warning("Debian 13 set-up: %s", json.dumps(report))
    lines = result.stdout.splitlines()
    installed = next(line for line in lines if line.startswith("system set-up: installing"))
    # The release's own packages: Java 21 (Debian 13 has no 17) and the venv module of its Python 3.13.
    assert "openjdk-21-jre-headless" in installed and "python3.13-venv" in installed, installed
    assert "openjdk-17" not in output and "python3.11" not in output
    assert "/usr/bin/python3 -m venv .venv" in lines, "the virtualenv is made with the system's python3"
    assert any(f'--index-url "{TORCH_INDEX_URL}" "torch==' in line for line in lines), lines
    assert report["python"].startswith("3.13.") and 'version "21.' in report["java"]
    assert report["explainers"].startswith("/home/user/explain/explainers/")
    assert report["torchserve"] == "0.12.0"
    assert "usage: torchserve" in (tmp_path / "torchserve-help.txt").read_text()
