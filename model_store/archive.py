"""TorchServe packaging: the per-model ``model-config.yaml`` and the ``no-archive`` folder made by
``torch-model-archiver``.

The archive folder holds ``MAR-INF/MANIFEST.json``, the handler file, ``model-config.yaml``, ``metrics.json``
and the checkpoint folder ``model/``. Serve it with
``torchserve --model-store model_store/build --models sentiment=sentiment/archive digits=digits/archive``.

Pitfall handled here: ``torch-model-archiver`` 0.12.0 stages files in ``$TMPDIR/<model-name>`` and deletes that
folder first, so two archivers packaging the same model name at once (a build and a test, say) would corrupt each
other. Each run therefore gets its own ``TMPDIR``.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from model_store import REPO_ROOT
from model_store.files import make_readable
from serving_core.registry import task_facts

logger = logging.getLogger(__name__)

MODEL_CONFIG_FILE = "model-config.yaml"
MANIFEST_PATH = Path("MAR-INF") / "MANIFEST.json"
ARCHIVE_VERSION = "1.0"


@dataclass(frozen=True)
class ServingConfig:
    """Content of ``model-config.yaml``: TorchServe's worker/batching keys and our handler's section.

    Attributes:
        task: The task's name (:data:`serving_core.registry.TASKS`; or a task record's ``module:attribute``): its
            record says whether the model has labels and whether it takes text (``max_length``) or images
            (``image_size``, ``max_image_bytes``).
        labels: Class names in index order (the same as the checkpoint's ``id2label``).
        max_length: Text only: tokens per input; longer inputs are truncated.
        image_size: Image only: ``[height, width]`` of the model input.
        max_image_bytes: Image only: largest accepted encoded image.
        model_dir: Checkpoint folder inside the archive.
        default_method: Attribution method used when a request names none (:data:`explainers.DEFAULT_METHOD`).
        device: ``auto``, ``cpu`` or ``cuda``.
        autocast_bf16: Run the forward under bf16 autocast (GPU).
        min_workers: TorchServe ``minWorkers``.
        max_workers: TorchServe ``maxWorkers``.
        batch_size: TorchServe ``batchSize``.
        max_batch_delay_ms: TorchServe ``maxBatchDelay`` (ms): the latency floor of a lone request, which waits all
            of it; under load batches fill from the queue while the worker is busy, so 2 ms loses no batching
            (docs/SERVING.md, "Batching profiles"; TorchServe treats 0 as its 100 ms default).
        response_timeout_s: TorchServe ``responseTimeout`` (s); a slower batch kills the worker.
        explanation_pool: The batching keys of the model's explanation pool (``explanationPool``, read by
            :func:`doors.torchserve.config.link_store`; ``None``: no pool).
        notes: Lines written as comments at the head of the file (why a setting is what it is: the packager's
            ``max_length`` of a causal LM); they change nothing that is read.
    """

    task: str
    labels: tuple[str, ...]
    max_length: int | None = None
    image_size: tuple[int, int] | None = None
    max_image_bytes: int | None = None
    model_dir: str = "model"
    # explainers.DEFAULT_METHOD, written out: importing explainers would import torch, and the build's up-to-date check
    # must stay cheap (tests/test_model_store.py); tests/test_defaults.py checks the two agree.
    default_method: str = "attnlrp"
    device: Literal["auto", "cpu", "cuda"] = "auto"
    autocast_bf16: bool = False
    min_workers: int = 1
    max_workers: int = 1
    batch_size: int = 8
    max_batch_delay_ms: int = 2
    response_timeout_s: int = 60
    extra_handler_keys: Mapping[str, Any] = field(default_factory=dict)
    explanation_pool: Mapping[str, int] | None = None
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        """Check that the task-specific keys match the task."""
        facts = task_facts(self.task)
        if facts.input_kind == "text" and (self.max_length is None or self.image_size is not None):
            raise ValueError(f"a {self.task} model needs max_length and no image_size")
        if facts.input_kind == "image" and (self.image_size is None or self.max_image_bytes is None):
            raise ValueError("an image model needs image_size and max_image_bytes")

    def to_dict(self) -> dict[str, Any]:
        """Return the YAML document, keys in the agreed order."""
        handler: dict[str, Any] = {
            "task": self.task,
            "model_dir": self.model_dir,
            "default_method": self.default_method,
        }
        if self.max_length is not None:
            handler["max_length"] = self.max_length
        if task_facts(self.task).labelled:
            handler["labels"] = list(self.labels)
        if self.image_size is not None:
            handler["image_size"] = list(self.image_size)
        if self.max_image_bytes is not None:
            handler["max_image_bytes"] = self.max_image_bytes
        handler["device"] = self.device
        handler["autocast_bf16"] = self.autocast_bf16
        handler.update(self.extra_handler_keys)
        document: dict[str, Any] = {
            "minWorkers": self.min_workers,
            "maxWorkers": self.max_workers,
            "batchSize": self.batch_size,
            "maxBatchDelay": self.max_batch_delay_ms,
            "responseTimeout": self.response_timeout_s,
        }
        if self.explanation_pool is not None:
            document["explanationPool"] = dict(self.explanation_pool)
        document["handler"] = handler
        return document

    def to_yaml(self) -> str:
        """Return ``model-config.yaml``'s text."""
        header = (
            "# Written by model_store/archive.py; maxBatchDelay in ms, responseTimeout in s.\n"
            "# TorchServe reads the top-level keys; our handler reads the `handler:` section.\n"
        )
        header += "".join(f"# {line}\n" for note in self.notes for line in note.splitlines())
        return header + yaml.safe_dump(self.to_dict(), sort_keys=False, default_flow_style=None)


#: Where the TorchServe entry files are (:attr:`serving_core.registry.TaskFacts.entry_file`).
ENTRY_DIR = REPO_ROOT / "doors" / "torchserve"


def entry_file(task: str) -> Path:
    """The TorchServe entry file an archive of ``task`` is packaged with: the one its record names, or the generic
    ``entry.py`` (which serves the archive's ``handler.task``)."""
    return ENTRY_DIR / task_facts(task).entry_file


def write_model_config(config: ServingConfig, path: Path) -> Path:
    """Write ``config`` as YAML to ``path`` and return the path."""
    path.write_text(config.to_yaml(), encoding="utf-8")
    return path


def make_archive(
    name: str,
    handler: Path,
    model_dir: Path,
    config: ServingConfig,
    destination: Path,
    extra_files: Sequence[Path] = (),
    version: str = ARCHIVE_VERSION,
) -> Path:
    """Package a checkpoint folder as a TorchServe ``no-archive`` model folder.

    Runs ``torch-model-archiver --archive-format no-archive`` in a private staging folder, then moves the result to
    ``destination`` (replacing what was there), so a failed run leaves the previous archive in place.

    Args:
        name: TorchServe model name (``[A-Za-z0-9][A-Za-z0-9_.-]*``).
        handler: The handler ``.py`` file, copied into the archive.
        model_dir: The Hugging Face checkpoint folder, copied into the archive as ``config.model_dir``.
        config: The content of ``model-config.yaml``.
        destination: The archive folder to create.
        extra_files: More files copied to the archive's root (e.g. ``metrics.json``).
        version: The archive's model version.

    Returns:
        ``destination``.

    Raises:
        FileNotFoundError: If the handler or the checkpoint folder is missing.
        RuntimeError: If ``torch-model-archiver`` fails; the message carries its output.
    """
    if not handler.is_file():
        raise FileNotFoundError(
            f"handler {handler} not found: write it, or pass another one (python -m model_store.build --help)."
        )
    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(f"{model_dir} is not a checkpoint folder (no config.json).")
    destination.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".archive-{name}-", dir=destination.parent) as work:
        work_dir = Path(work)
        # --extra-files copies a folder's *content* to the archive root: stage `model/` inside a parent folder.
        stage = work_dir / "stage"
        stage.mkdir()
        (stage / config.model_dir).symlink_to(model_dir.resolve(), target_is_directory=True)
        for extra in extra_files:
            (stage / extra.name).symlink_to(extra.resolve())
        yaml_path = write_model_config(config, work_dir / MODEL_CONFIG_FILE)
        export = work_dir / "export"
        export.mkdir()
        tmp = work_dir / "tmp"
        tmp.mkdir()
        command = [
            sys.executable,
            "-m",
            "model_archiver.model_packaging",
            "--model-name",
            name,
            "--version",
            version,
            "--handler",
            str(handler.resolve()),
            "--config-file",
            str(yaml_path),
            "--extra-files",
            str(stage),
            "--export-path",
            str(export),
            "--archive-format",
            "no-archive",
        ]
        logger.info("%s: torch-model-archiver -> %s", name, destination)
        result = subprocess.run(
            command, capture_output=True, text=True, env={**os.environ, "TMPDIR": str(tmp)}, check=False
        )
        built = export / name
        if result.returncode != 0 or not (built / MANIFEST_PATH).is_file():
            raise RuntimeError(
                f"torch-model-archiver failed for {name} (exit {result.returncode}):\n{result.stdout}\n{result.stderr}"
            )
        make_readable(built)
        if destination.exists():
            shutil.rmtree(destination)
        built.rename(destination)
    return destination
