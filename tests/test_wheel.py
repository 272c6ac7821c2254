"""The built wheels, and the library installed from one outside the repository.

Both distributions are built (``pip wheel``) from a copy of the checkout's files; the service's wheel carries every
data file its code reads at run time, ``py.typed``, the licence and the one version number, and its core requires
only torch (a range) and transformers. A fresh virtualenv then gets torch first, then the core wheel alone (pip
installs nothing torch-related and none of the service's libraries), and explains a tiny BERT, written by the test
with a handful-of-words vocabulary, by every method: the same scores as the source tree gives in this process.
The serving and evaluation extras then go into the same virtualenv: ``explain-eval`` runs, and ``explain-serve``
serves a tiny checkpoint from an empty temporary directory (one explanation over REST with the inference token; the
working directory holds the archive and the run state; nothing is written under ``site-packages``; the service is
stopped by its pid).

Slow (three to seven minutes: a virtualenv, torch, transformers and the extras from pip's sources, TorchServe). torch
comes from ``$TORCH_INDEX_URL`` where it is set (``.ci/run`` sets it), else from the index the Makefile installed the
running virtualenv's torch from (its ``.torch-*`` stamp: PyTorch's CPU index by default), else from pip's own
configuration.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from doors.torchserve.config import Ports
from explainers import available_methods, explain, get_method
from explainers._version import __version__
from supervise.processes import pid_alive, read_pid

logger = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parent.parent
PROBE = Path(__file__).with_name("wheel_probe.py")
#: The top-level packages the wheel carries (pyproject.toml's find patterns, ``name*``).
PACKAGES = tuple(
    pattern.rstrip("*")
    for pattern in tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"][
        "packages"
    ]["find"]["include"]
)
TEXT = "the crew was rude and the flight late"
WORDS = ("the", "crew", "was", "rude", "and", "flight", "late", "lovely", "staff")
#: What the fresh virtualenv must not get from the core wheel.
TORCH_RELATED = re.compile(r"^(torch|nvidia|cuda|triton)", re.IGNORECASE)
#: What the extras must not bring beside the installed torch (TorchServe's own packages are ``torch``-named).
ANOTHER_TORCH = re.compile(r"^(torch|triton)$|^(nvidia|cuda)", re.IGNORECASE)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


#: The repository's settings of where the service writes, which a user's shell does not have.
WORKDIR_SETTINGS = ("EXPLAIN_WORKDIR", "MODEL_STORE", "RUN_DIR", "EXPLAIN_PROTO_DIR", "EXPLAIN_DEFAULT_METHOD")


def _environment() -> dict[str, str]:
    """This environment without the test virtualenv's or the repository's Python and working-directory settings."""
    return {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("PYTHON", "VIRTUAL_ENV")) and key not in WORKDIR_SETTINGS
    }


def _run(command: list[str], timeout: float, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(command, cwd=cwd, env=_environment(), capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{' '.join(command)}:\n{(result.stdout + result.stderr)[-6000:]}"
    return result


def _checkout_files() -> list[str]:
    """The repository's files as a clone would have them (tracked, and new files git does not ignore)."""
    listed = _run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], 60, cwd=REPO).stdout
    return [name for name in listed.split("\0") if name and (REPO / name).is_file()]


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The two wheels, built from a copy of the checkout's files: ``{"service": ..., "client": ...}``."""
    root = tmp_path_factory.mktemp("wheels")
    source = root / "source"
    for name in _checkout_files():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, source / name)
    dist = root / "dist"
    pip = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--disable-pip-version-check"]
    _run([*pip, "-w", str(dist), str(source), str(source / "explain_client")], 900)
    built = {path.name.split("-")[0]: path for path in dist.glob("*.whl")}
    return {"service": built["transformer_explain_service"], "client": built["transformer_explain_client"]}


def _metadata(wheel: Path) -> tuple[list[str], str]:
    """The wheel's file names and its METADATA text."""
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = next(name for name in names if name.endswith(".dist-info/METADATA"))
        return names, archive.read(metadata).decode("utf-8")


def _requires(metadata: str) -> list[str]:
    return [line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Requires-Dist:")]


def test_the_wheel_carries_its_data_files_typing_licence_and_version(wheels: dict[str, Path]) -> None:
    names, metadata = _metadata(wheels["service"])
    data_files = [
        name for name in _checkout_files()
        if name.split("/")[0] in PACKAGES and not name.endswith((".py", ".md"))
    ]  # fmt: skip
    assert "doors/torchserve/profiles.yaml" in data_files and "model_store/writer.yaml" in data_files
    missing = sorted(set(data_files) - set(names))
    assert not missing, f"the wheel lacks files the code reads: {missing}"
    assert "explainers/py.typed" in names and "explainers/_version.py" in names
    assert not any(name.startswith(("tests/", "scripts/", "deploy/", "proto/")) for name in names)
    licence = next(name for name in names if name.endswith(".dist-info/licenses/LICENSE"))
    with zipfile.ZipFile(wheels["service"]) as archive:
        assert archive.read(licence) == (REPO / "LICENSE").read_bytes()
    assert f"\nVersion: {__version__}\n" in metadata and "\nLicense-Expression: MIT\n" in metadata
    assert "\nRequires-Python: <3.14,>=3.11\n" in metadata
    core = [req for req in _requires(metadata) if "extra ==" not in req]
    assert core == ["torch>=2.6", "transformers<6,>=5.20", "scipy>=1.11"], (
        "the library needs torch (a range), transformers and scipy (attention_flow's solver)"
    )
    client_pin = f"transformer-explain-client=={__version__}"
    for extra in ("serve", "eval"):
        assert f'{client_pin}; extra == "{extra}"' in _requires(metadata), extra
    client_names, client_metadata = _metadata(wheels["client"])
    assert f"\nVersion: {__version__}\n" in client_metadata, "one version number for both distributions"
    assert "explain_client/py.typed" in client_names
    assert any(name.endswith(".dist-info/licenses/LICENSE") for name in client_names)


def _tiny_checkpoint(folder: Path) -> None:
    """A 2-layer BERT classifier with a WordPiece vocabulary of a few words, saved as a checkpoint folder."""
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizer

    vocab = folder / "vocab.txt"
    folder.mkdir(parents=True)
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n", encoding="utf-8")
    tokenizer = BertTokenizer(vocab=str(vocab), do_lower_case=True)
    config = BertConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=32,
    )  # fmt: skip
    config.num_labels = 3
    config.id2label = {0: "negative", 1: "neutral", 2: "positive"}
    config.label2id = {label: index for index, label in config.id2label.items()}
    torch.manual_seed(0)
    BertForSequenceClassification(config).eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def _torch_index() -> str | None:
    """Where the fresh virtualenv's torch comes from (see the module's docstring)."""
    if os.environ.get("TORCH_INDEX_URL"):
        return os.environ["TORCH_INDEX_URL"]
    stamps = sorted(Path(sys.prefix).glob(".torch-*"))
    return (stamps[0].read_text(encoding="utf-8").strip() or None) if stamps else None


@pytest.fixture(scope="module")
def core_venv(wheels: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh virtualenv outside the repository with torch, then the core wheel alone; its Python."""
    root = tmp_path_factory.mktemp("core-venv")
    venv = root / "venv"
    started = time.perf_counter()
    _run([sys.executable, "-m", "venv", str(venv)], 300)
    python = venv / "bin" / "python"
    # --no-compile: no bytecode compiled at install (torch's thousands of modules); Python caches what is imported
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-compile"]
    release = importlib.metadata.version("torch").split("+")[0]
    index = _torch_index()
    _run([*pip, *(["--index-url", index] if index else []), f"torch=={release}"], 900, cwd=root)
    with_torch = time.perf_counter()
    report = root / "core-install.json"
    _run([*pip, "--report", str(report), str(wheels["service"])], 900, cwd=root)
    installed = sorted(item["metadata"]["name"] for item in json.loads(report.read_text())["install"])
    finished = time.perf_counter()
    logger.warning(
        "core wheel: venv + torch %.0f s, core install %.0f s, %d packages: %s",
        with_torch - started, finished - with_torch, len(installed), installed,
    )  # fmt: skip
    assert "transformer-explain-service" in installed and "transformers" in installed
    assert not [name for name in installed if TORCH_RELATED.match(name)], "the core wheel pulled a torch package"
    yield python


def _explain_here(folder: Path) -> dict[str, Any]:
    """What the source tree's explainers give for the checkpoint, in this process."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(str(folder)).eval()
    inputs = dict(AutoTokenizer.from_pretrained(str(folder))([TEXT], return_tensors="pt"))
    return {method: explain(model, inputs, method=method).scores[0] for method in available_methods()}


def test_the_core_wheel_explains_a_tiny_model_outside_the_repository(core_venv: Path, tmp_path: Path) -> None:
    checkpoint = tmp_path / "tiny-bert"
    _tiny_checkpoint(checkpoint)
    result = _run([str(core_venv), str(PROBE), str(checkpoint), TEXT], 600, cwd=tmp_path)
    report = json.loads(result.stdout.strip().splitlines()[-1])
    site = core_venv.parent.parent / "lib"
    assert Path(report["explainers_file"]).is_relative_to(site), "imported from the wheel, not the repository"
    assert report["version"] == report["metadata_version"] == __version__
    assert report["py_typed"]
    assert report["present_service_libraries"] == [], "the core install brought the service's libraries"
    serving = ("profiles.yaml", "metrics.yaml", "config.properties.template")
    data_files = {*(f"doors/torchserve/{name}" for name in serving), "model_store/writer.yaml"}
    assert data_files <= set(report["data_files"])
    assert report["tokens"] == ["[CLS]", *TEXT.split(), "[SEP]"]
    expected = _explain_here(checkpoint)
    # A method that needs a package beyond torch and transformers (attention_flow: SciPy) is refused by the core
    # install, naming what to install; every other method explains there as here.
    for method, refused in report["refused"].items():
        assert refused["missing"] == list(get_method(method).packages), method
        assert all(get_method(method).packages[module] in refused["message"] for module in refused["missing"])
    assert set(report["methods"]) | set(report["refused"]) == set(expected) and len(report["methods"]) >= 8
    for method, scores in expected.items():
        if method in report["refused"]:
            continue
        served = torch.tensor(report["methods"][method]["scores"])
        assert served.shape == scores.shape and torch.isfinite(served).all(), method
        assert torch.allclose(served, scores, atol=1e-6, rtol=1e-5), (method, served, scores)


@pytest.fixture(scope="module")
def serve_venv(core_venv: Path, wheels: dict[str, Path]) -> Path:
    """The core virtualenv with the serving and evaluation extras installed from the wheels; its Python."""
    root = core_venv.parent.parent.parent
    pip = [str(core_venv), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-compile"]
    report = root / "serve-install.json"
    started = time.perf_counter()
    find_links = ["--find-links", str(wheels["client"].parent)]
    _run([*pip, *find_links, "--report", str(report), f"{wheels['service']}[serve,eval]"], 900, cwd=root)
    installed = sorted(item["metadata"]["name"] for item in json.loads(report.read_text())["install"])
    logger.warning("serve and eval extras: %.0f s, %d packages: %s", time.perf_counter() - started, len(installed),
                   installed)  # fmt: skip
    assert {"torchserve", "transformer-explain-client", "matplotlib"} <= set(installed)
    assert not [name for name in installed if ANOTHER_TORCH.match(name)], "an extra pulled another torch"
    return core_venv


def test_explain_eval_runs_from_the_wheel(serve_venv: Path, tmp_path: Path) -> None:
    result = _run([str(serve_venv.parent / "explain-eval"), "--help"], 300, cwd=tmp_path)
    assert "usage: explain-eval" in result.stdout and "--build-dir" in result.stdout


def _site_files(python: Path) -> set[str]:
    """Every file under the virtualenv's ``site-packages`` but Python's own bytecode caches (``__pycache__``, written
    on import since the packages were installed without compiling)."""
    purelib = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], 60).stdout
    site = Path(purelib.strip())
    return {
        str(path.relative_to(site))
        for path in site.rglob("*")
        if path.is_file() and "__pycache__" not in path.relative_to(site).parts
    }


def _post(url: str, token: str, document: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    request = urllib.request.Request(url, data=json.dumps(document).encode(), headers=headers, method="POST")
    with urllib.request.urlopen(request, timeout=120) as response:
        return int(response.status), json.loads(response.read())


@pytest.mark.skipif(shutil.which("java") is None, reason="TorchServe's frontend needs Java (17 or 21)")
def test_explain_serve_serves_a_checkpoint_from_an_empty_directory(serve_venv: Path, tmp_path: Path) -> None:
    checkpoint = tmp_path / "tiny-bert"
    _tiny_checkpoint(checkpoint)
    here = tmp_path / "empty"
    here.mkdir()
    before = _site_files(serve_venv)
    ports = Ports.free()
    env = _environment() | {
        "MANAGEMENT_PORT": str(ports.management), "METRICS_PORT": str(ports.metrics),
        "GRPC_MANAGEMENT_PORT": str(ports.grpc_management), "EXPORTER_PORT": str(ports.exporter),
    }  # fmt: skip
    command = [
        str(serve_venv.parent / "explain-serve"),
        "--models",
        f"tiny={checkpoint}",
        "--default-method",
        "rollout",
    ]
    command += ["--port", str(ports.inference), "--grpc-port", str(ports.grpc_inference)]
    log_path = tmp_path / "explain-serve.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, cwd=here, env=env, stdout=log, stderr=subprocess.STDOUT)
    run = here / "run"
    try:
        deadline = time.monotonic() + 420
        while "The explanation service is up" not in log_path.read_text(errors="replace"):
            assert process.poll() is None, f"explain-serve exited with {process.returncode}:\n{log_path.read_text()}"
            assert time.monotonic() < deadline, f"explain-serve not up in time:\n{log_path.read_text()[-4000:]}"
            time.sleep(1)
        assert f"{run}/key_file.json" in log_path.read_text(), "it says where the tokens are"
        token = json.loads((run / "key_file.json").read_text())["inference"]["key"]
        status, answer = _post(f"http://127.0.0.1:{ports.inference}/explanations/tiny", token, {"text": TEXT})
        assert status == 200 and answer["explanation"]["method"] == "rollout", answer  # --default-method
        assert answer["explanation"]["tokens"] == ["[CLS]", *TEXT.split(), "[SEP]"]
        served = [read_pid(run / name) for name in ("torchserve.pid", "exporter.pid")]
    finally:
        process.send_signal(signal.SIGTERM)  # stopped by its pid, as Ctrl-C would
        try:
            process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    assert process.returncode == 0, log_path.read_text()[-4000:]
    assert not [pid for pid in served if pid is not None and pid_alive(pid)], "the servers were stopped"
    written = sorted(_site_files(serve_venv) - before)
    assert written == [], f"files written under site-packages: {written[:20]}"
    assert (here / "model_store/build/packages/tiny/MAR-INF/MANIFEST.json").is_file()
    assert (run / "config.properties").is_file() and (run / "logs").is_dir()
    assert (here / "build/protos/management_pb2.py").is_file(), "TorchServe's stubs are generated in the workdir"
