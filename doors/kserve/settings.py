"""A served model's settings, read from the same archive folder TorchServe serves (``model-config.yaml`` beside the
checkpoint in ``model/``): the default models' archives (``model_store/build/<name>/archive``) and the packages of
``MODELS=`` checkpoints (``model_store/build/packages/<name>``) alike.

The ``handler:`` section is the typed :class:`~serving_core.config.HandlerConfig` every door uses; the TorchServe keys
are read for the same jobs on the other doors: ``batchSize`` and ``maxBatchDelay`` (ms) bound a batch, ``minWorkers``
is the number of Ray Serve replicas, ``handler.threads`` the CPUs of each replica and ``handler.device`` whether it
asks for a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from serving_core.config import HandlerConfig


@dataclass(frozen=True)
class ModelSettings:
    """One served model.

    Attributes:
        name: the served name (the URL's ``<model_name>``).
        archive: the archive folder (``model-config.yaml`` and the checkpoint folder).
        config: the handler config.
        batch_size: most rows per batch (``batchSize``).
        max_batch_delay: seconds a batch waits for more rows (``maxBatchDelay`` / 1000).
        replicas: Ray Serve replicas (``minWorkers``; ``REPLICAS=`` overrides it).
        response_timeout: seconds a request may take (``responseTimeout``).
    """

    name: str
    archive: Path
    config: HandlerConfig
    batch_size: int = 8
    max_batch_delay: float = 0.002
    replicas: int = 1
    response_timeout: float = 60.0

    @property
    def model_dir(self) -> Path:
        """The checkpoint folder."""
        return self.archive / self.config.model_dir

    @property
    def replica_cpus(self) -> float:
        """CPUs one Ray Serve replica asks for: its torch threads (``handler.threads``), else 1."""
        return float(self.config.threads or 1)

    @property
    def replica_gpus(self) -> float:
        """GPUs one replica asks for: 1 when ``handler.device`` is ``cuda``, else 0 (``auto`` uses a GPU only where
        the replica's node has one and Ray gave it one)."""
        return 1.0 if self.config.device == "cuda" else 0.0


def _positive(document: dict[str, Any], key: str, default: float) -> float:
    value = document.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ValueError(f"model-config.yaml: {key} must be a positive number, got {value!r}")
    return float(value)


def read_settings(name: str, archive: Path, replicas: int | None = None) -> ModelSettings:
    """The settings of the archive folder ``archive`` served as ``name``.

    Args:
        name: the served name.
        archive: the archive folder.
        replicas: Ray Serve replicas, overriding ``minWorkers`` (``None``: keep it).

    Raises:
        FileNotFoundError: if the folder has no ``model-config.yaml``.
        ValueError: if a setting is invalid (:class:`~serving_core.config.ConfigError` for the ``handler:`` section).
    """
    path = archive / "model-config.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"{archive} has no model-config.yaml: build it (make models) or package it first")
    document = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    config = HandlerConfig.from_model_yaml(document)
    if replicas is not None and replicas < 1:
        raise ValueError(f"replicas must be at least 1, got {replicas}")
    return ModelSettings(
        name=name,
        archive=archive.resolve(),
        config=config,
        batch_size=int(_positive(document, "batchSize", 8)),
        max_batch_delay=_positive(document, "maxBatchDelay", 2) / 1000.0,
        replicas=replicas if replicas is not None else int(_positive(document, "minWorkers", 1)),
        response_timeout=_positive(document, "responseTimeout", 60),
    )
