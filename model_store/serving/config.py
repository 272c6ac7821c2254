"""The service's configuration: its ports, the addresses it binds, the keys' lifetime, ``config.properties`` rendered
from ``config.properties.template``, the batching/device profiles of ``profiles.yaml``, and the per-run model store
(links to each archive, with its ``model-config.yaml`` overlaid by a profile).

Everything binds 127.0.0.1 unless ``INFERENCE_ADDRESS`` / ``METRICS_ADDRESS`` say otherwise (containers and pods);
management is never configurable. Token authorization stays on.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import socket
import string
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

SERVING_DIR = Path(__file__).resolve().parent
REPO_ROOT = SERVING_DIR.parent.parent
TEMPLATE = SERVING_DIR / "config.properties.template"
METRICS_YAML = SERVING_DIR / "metrics.yaml"
PROFILES = SERVING_DIR / "profiles.yaml"
DEFAULT_RUN_DIR = REPO_ROOT / "run"
DEFAULT_MODEL_STORE = REPO_ROOT / "model_store" / "build"


@dataclass(frozen=True)
class Ports:
    """The service's ports (all bound to 127.0.0.1)."""

    inference: int = 8080
    management: int = 8081
    metrics: int = 8082
    grpc_inference: int = 7070
    grpc_management: int = 7071
    exporter: int = 8083

    @classmethod
    def from_env(cls) -> Ports:
        """Defaults overridden by ``INFERENCE_PORT``, ``MANAGEMENT_PORT``, ``METRICS_PORT``, ``GRPC_INFERENCE_PORT``,
        ``GRPC_MANAGEMENT_PORT`` and ``EXPORTER_PORT``."""
        values = {name: int(os.environ.get(f"{name.upper()}_PORT", default)) for name, default in asdict(cls()).items()}
        return cls(**values)

    @classmethod
    def free(cls) -> Ports:
        """Six currently free loopback ports (for tests)."""
        sockets = []
        try:
            for _ in range(6):
                sock = socket.socket()
                sock.bind(("127.0.0.1", 0))
                sockets.append(sock)
            numbers = [sock.getsockname()[1] for sock in sockets]
        finally:
            for sock in sockets:
                sock.close()
        return cls(*numbers)


def bind_address(variable: str) -> str:
    """The address to bind named by the environment variable ``variable`` (``INFERENCE_ADDRESS`` or
    ``METRICS_ADDRESS``), 127.0.0.1 when unset. Only for containers and pods, where the port must be reachable from
    outside the container's loopback (docs/OPERATIONS.md); management is never configurable.

    Raises:
        ValueError: if the value is not an IP address literal.
    """
    value = os.environ.get(variable) or "127.0.0.1"
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        raise ValueError(f"{variable}={value!r} is not an IP address (e.g. 127.0.0.1 or 0.0.0.0)") from None


#: Default lifetime of TorchServe's inference and management keys, in minutes (365 days).
DEFAULT_TOKEN_EXPIRATION_MIN = 525_600
#: The longest lifetime accepted (100 years): TorchServe adds it to the current time and fails past Instant.MAX.
MAX_TOKEN_EXPIRATION_MIN = 52_560_000


def token_expiration_minutes() -> float:
    """Lifetime of the keys TorchServe generates, from ``$TOKEN_EXPIRATION_MIN`` (minutes), else
    :data:`DEFAULT_TOKEN_EXPIRATION_MIN`.

    Raises:
        ValueError: if the value is not a number of minutes in (0, :data:`MAX_TOKEN_EXPIRATION_MIN`].
    """
    value = os.environ.get("TOKEN_EXPIRATION_MIN") or str(DEFAULT_TOKEN_EXPIRATION_MIN)
    try:
        minutes = float(value)
    except ValueError:
        minutes = float("nan")
    if not 0 < minutes <= MAX_TOKEN_EXPIRATION_MIN:
        raise ValueError(
            f"TOKEN_EXPIRATION_MIN={value!r} is not a number of minutes in (0, {MAX_TOKEN_EXPIRATION_MIN}]"
        )
    return minutes


def write_config(run_dir: Path, ports: Ports, model_store: Path) -> Path:
    """Fill the template into ``run_dir/config.properties`` and return its path."""
    workflow_store = run_dir / "workflow-store"
    workflow_store.mkdir(parents=True, exist_ok=True)
    workflow_store.chmod(0o555)
    text = string.Template(TEMPLATE.read_text(encoding="utf-8")).substitute(
        inference_host=bind_address("INFERENCE_ADDRESS"),
        metrics_host=bind_address("METRICS_ADDRESS"),
        inference_port=ports.inference,
        management_port=ports.management,
        metrics_port=ports.metrics,
        grpc_inference_port=ports.grpc_inference,
        grpc_management_port=ports.grpc_management,
        model_store=model_store.resolve(),
        workflow_store=workflow_store.resolve(),
        metrics_config=METRICS_YAML,
        token_expiration_min=f"{token_expiration_minutes():g}",
    )
    path = run_dir / "config.properties"
    path.write_text(text, encoding="utf-8")
    return path


def link_store(
    run_dir: Path, model_store: Path, models: Mapping[str, str], overrides: Mapping[str, Mapping[str, Any]]
) -> Path:
    """A model store ``run_dir/model-store/<name>/`` of symlinks to each archive's files (TorchServe 0.12 does not
    accept nested paths such as ``sentiment/archive`` in ``--models``), with ``model-config.yaml`` rewritten when
    ``overrides[name]`` sets keys (top-level TorchServe keys, and ``handler:`` keys merged into that section)."""
    store = run_dir / "model-store"
    shutil.rmtree(store, ignore_errors=True)
    store.mkdir(parents=True)
    for name, path in models.items():
        source = (model_store / path).resolve()
        target = store / name
        target.mkdir()
        for entry in source.iterdir():
            if entry.name != "model-config.yaml":
                (target / entry.name).symlink_to(entry)
        config = yaml.safe_load((source / "model-config.yaml").read_text(encoding="utf-8")) or {}
        extra = dict(overrides.get(name, {}))
        handler_extra = extra.pop("handler", {}) or {}
        config.update(extra)
        config["handler"] = {**config.get("handler", {}), **handler_extra}
        (target / "model-config.yaml").write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return store


def load_profile(name: str) -> dict[str, Any]:
    """A batching/device profile of ``profiles.yaml`` (``archive`` = no change).

    Raises:
        ValueError: naming the known profiles.
    """
    if name == "archive":
        return {}
    profiles = yaml.safe_load(PROFILES.read_text(encoding="utf-8"))
    if name not in profiles:
        raise ValueError(f"unknown profile {name!r}; known: archive, {', '.join(profiles)}")
    return dict(profiles[name])
