"""A checkpoint folder served in this process by the serving core itself — the batched path of the library that the
doors run (:func:`serving_core.task.get_task`, ``Task.load``, ``service.run``) — for ``explain-monitor``'s baselines
and canaries, and for the benchmark.

The task is read from the checkpoint's ``config.json`` (a ``…ForSequenceClassification`` is ``text``, a
``…ForTokenClassification`` ``token_classification``, a ``…ForCausalLM`` ``generation``), its labels from
``id2label`` (transformers' default names when it has none).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig

from serving_core.config import HandlerConfig
from serving_core.registry import task_of_architecture
from serving_core.task import get_task
from serving_core.wire import Encoding

from .canaries import Explain
from .serving import decode_documents, reader_for, service_explainer


def checkpoint_config(folder: Path, device: str = "cpu", max_length: int = 128) -> HandlerConfig:
    """The handler config of a checkpoint folder (task and labels from its ``config.json``).

    Raises:
        ValueError: if the folder has no ``config.json`` or its architecture is none of the monitored tasks.
    """
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise ValueError(f"{folder} is not a checkpoint folder (no config.json)")
    document = json.loads(path.read_text(encoding="utf-8"))
    architectures = document.get("architectures") or []
    facts = next((found for arch in architectures if (found := task_of_architecture(arch)) is not None), None)
    if facts is None or facts.input_kind != "text":
        raise ValueError(f"{folder}: architecture {architectures} is not a text, token or causal LM model")
    task = facts.name
    id2label = AutoConfig.from_pretrained(str(folder), local_files_only=True).id2label
    labels = tuple(str(id2label[key]) for key in sorted(id2label, key=int)) if facts.labelled else ()
    return HandlerConfig(task=task, labels=labels, device=device, max_length=max_length)  # type: ignore[arg-type]


class InProcessModel:
    """A checkpoint folder loaded by its task, on a device, in this process."""

    def __init__(self, name: str, folder: Path, device: str = "cpu", max_length: int = 128) -> None:
        """Load ``folder`` (local safetensors only, eval mode).

        Raises:
            ValueError: for a folder that is not a supported checkpoint.
        """
        self.name = name
        self.config = checkpoint_config(folder, device, max_length)
        self.task = get_task(self.config.task)
        torch_device = torch.device("cuda" if device == "cuda" else "cpu")
        self.service = self.task.load(self.config, Path(folder), torch_device)
        self.reader = reader_for(self.config, self.service)

    def run(
        self, documents: Sequence[Mapping[str, Any]], method: str | None, batch_size: int = 16
    ) -> list[tuple[Any, Any]]:
        """Serve ``documents`` in batches: each decoded row with its outcome."""
        served: list[tuple[Any, Any]] = []
        for start in range(0, len(documents), batch_size):
            rows = decode_documents(self.task, self.config, documents[start : start + batch_size], method)
            outcomes, _ = self.service.run(rows, [Encoding.JSON] * len(rows))
            served.extend(zip(rows, outcomes, strict=True))
        return served

    def explainer(self) -> Explain:
        """The canary runner's ``explain`` on this model."""
        return service_explainer(self.task, self.config, self.service)


def as_device(device: str) -> str:
    """``auto`` → ``cuda`` when available, else the device given."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device
