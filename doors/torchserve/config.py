"""The service's configuration: its ports, the addresses it binds (:mod:`supervise.environment`), the keys'
lifetime, ``config.properties`` rendered from ``config.properties.template``, the batching/device profiles of
``profiles.yaml``, and the per-run model store (links to each archive, with its ``model-config.yaml`` overlaid by a
profile).

Everything binds 127.0.0.1 unless ``INFERENCE_ADDRESS`` / ``METRICS_ADDRESS`` say otherwise (containers and pods);
management is never configurable. Token authorization stays on.
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import string
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import yaml

from serving_core.registry import is_task, task_facts
from supervise.environment import bind_address, env_port

#: This package's folder: the files below are read from the installed package, never written.
SERVING_DIR = Path(__file__).resolve().parent
TEMPLATE = SERVING_DIR / "config.properties.template"
METRICS_YAML = SERVING_DIR / "metrics.yaml"
PROFILES = SERVING_DIR / "profiles.yaml"


@dataclass(frozen=True)
class Ports:
    """The service's ports (all bound to 127.0.0.1). ``upstream_inference`` and ``upstream_grpc_inference`` are
    TorchServe's own inference ports when the router runs (:mod:`doors.torchserve.router`: a generation model's
    OpenAI API, explanation pools): it then listens on ``inference``/``grpc_inference``, TorchServe behind it on
    loopback."""

    inference: int = 8080
    management: int = 8081
    metrics: int = 8082
    grpc_inference: int = 7070
    grpc_management: int = 7071
    exporter: int = 8083
    upstream_inference: int = 8090
    upstream_grpc_inference: int = 7090

    @classmethod
    def from_env(cls) -> Ports:
        """Defaults overridden by ``<FIELD>_PORT`` (``INFERENCE_PORT``, ``MANAGEMENT_PORT``, ``METRICS_PORT``,
        ``GRPC_INFERENCE_PORT``, ``GRPC_MANAGEMENT_PORT``, ``EXPORTER_PORT``, ``UPSTREAM_INFERENCE_PORT``,
        ``UPSTREAM_GRPC_INFERENCE_PORT``)."""
        return cls(**{name: env_port(name, default) for name, default in asdict(cls()).items()})

    @classmethod
    def free(cls) -> Ports:
        """Currently free loopback ports, all distinct (for tests), chosen at random below the system's ephemeral
        range: a port the system hands out for ``bind(0)`` could be taken again, between this pick and the server's
        own bind, by another process's outgoing connection or random bind (Ray's workers bind many)."""
        return cls(*free_ports(len(fields(cls))))


#: The lowest port :func:`free_ports` picks.
FREE_PORT_FLOOR = 20_000


def _ephemeral_floor() -> int:
    """The first port of the system's ephemeral range (Linux's ``ip_local_port_range``; 32768 where unknown)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text(encoding="ascii").split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def free_ports(count: int) -> list[int]:
    """``count`` distinct loopback ports free now, at random in ``[FREE_PORT_FLOOR, ephemeral range)`` (from the
    system's ephemeral range where that span is too narrow)."""
    low, high = FREE_PORT_FLOOR, _ephemeral_floor()
    chosen: list[int] = []
    if high - low >= 1000:
        picker = random.SystemRandom()
        for _ in range(count * 200):
            port = picker.randrange(low, high)
            if port not in chosen and _bindable(port):
                chosen.append(port)
                if len(chosen) == count:
                    return chosen
    sockets: list[socket.socket] = []
    try:
        while len(chosen) + len(sockets) < count:
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return chosen + [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


#: TorchServe's ``max_request_size`` (config.properties.template), which the router applies too: a larger body is
#: refused with 413 before it is read or forwarded.
MAX_REQUEST_SIZE = 3_000_000

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


def write_config(run_dir: Path, ports: Ports, model_store: Path, behind_router: bool = False) -> Path:
    """Fill the template into ``run_dir/config.properties`` and return its path (``behind_router``: TorchServe's
    inference ports are ``ports.upstream_*`` on 127.0.0.1, the router's are the public ones)."""
    workflow_store = run_dir / "workflow-store"
    workflow_store.mkdir(parents=True, exist_ok=True)
    workflow_store.chmod(0o555)
    text = string.Template(TEMPLATE.read_text(encoding="utf-8")).substitute(
        inference_host="127.0.0.1" if behind_router else bind_address("INFERENCE_ADDRESS"),
        metrics_host=bind_address("METRICS_ADDRESS"),
        inference_port=ports.upstream_inference if behind_router else ports.inference,
        management_port=ports.management,
        metrics_port=ports.metrics,
        grpc_inference_port=ports.upstream_grpc_inference if behind_router else ports.grpc_inference,
        grpc_management_port=ports.grpc_management,
        model_store=model_store.resolve(),
        workflow_store=workflow_store.resolve(),
        metrics_config=METRICS_YAML,
        token_expiration_min=f"{token_expiration_minutes():g}",
        max_request_size=MAX_REQUEST_SIZE,
    )
    path = run_dir / "config.properties"
    path.write_text(text, encoding="utf-8")
    return path


#: The key of ``model-config.yaml`` (or of a profile) that gives a model an explanation pool: TorchServe's batching
#: keys of the pool (``serving_core.pools``; docs/SERVING.md, "Predictions next to explanations"). Consumed here: the
#: per-run configs TorchServe reads do not carry it.
POOL_KEY = "explanationPool"
#: The TorchServe keys a pool may set; the others are the model's.
POOL_SETTINGS = ("minWorkers", "maxWorkers", "batchSize", "maxBatchDelay", "responseTimeout")


@dataclass(frozen=True)
class LinkedStore:
    """The per-run model store: its folder, the names to register (models and pools), the models with a pool and the
    generation models (the OpenAI API serves them)."""

    path: Path
    served: tuple[str, ...]
    pools: tuple[str, ...]
    generation: tuple[str, ...] = ()


def link_store(
    run_dir: Path, model_store: Path, models: Mapping[str, str], overrides: Mapping[str, Mapping[str, Any]]
) -> LinkedStore:
    """A model store ``run_dir/model-store/<name>/`` of symlinks to each archive's files (TorchServe 0.12 does not
    accept nested paths such as ``sentiment/archive`` in ``--models``), with ``model-config.yaml`` rewritten when
    ``overrides[name]`` sets keys (top-level TorchServe keys, and ``handler:`` keys merged into that section).

    A model whose config (after its overrides) has an :data:`POOL_KEY` section also gets its explanation pool,
    ``<name>.explain/``: the same files, the same config with the section's batching keys.

    Raises:
        ValueError: for an explanation pool section that is not a mapping of :data:`POOL_SETTINGS` to integers >= 1.
    """
    from serving_core.pools import pool_name

    store = run_dir / "model-store"
    shutil.rmtree(store, ignore_errors=True)
    store.mkdir(parents=True)
    served: list[str] = []
    pools: list[str] = []
    generation: list[str] = []
    for name, path in models.items():
        source = (model_store / path).resolve()
        config = yaml.safe_load((source / "model-config.yaml").read_text(encoding="utf-8")) or {}
        extra = dict(overrides.get(name, {}))
        handler_extra = extra.pop("handler", {}) or {}
        config.update(extra)
        config["handler"] = {**config.get("handler", {}), **handler_extra}
        pool = _pool_settings(name, config.pop(POOL_KEY, None))
        if pool is not None and pool.get("minWorkers", 1) > pool.get("maxWorkers", pool.get("minWorkers", 1)):
            raise ValueError(f"{name}: {POOL_KEY}: minWorkers is above maxWorkers")
        variants = {name: config} | ({pool_name(name): {**config, **pool}} if pool is not None else {})
        for served_name, variant in variants.items():
            target = store / served_name
            target.mkdir()
            for entry in source.iterdir():
                if entry.name != "model-config.yaml":
                    (target / entry.name).symlink_to(entry)
            (target / "model-config.yaml").write_text(yaml.safe_dump(variant, sort_keys=False), encoding="utf-8")
            served.append(served_name)
        if pool is not None:
            pools.append(name)
        task = config["handler"].get("task")
        if is_task(task) and task_facts(task).chat:  # its models answer the OpenAI API
            generation.append(name)
    return LinkedStore(store, tuple(served), tuple(pools), tuple(generation))


def _pool_settings(name: str, section: Any) -> dict[str, int] | None:
    if section is None or section is False:
        return None
    where = f"{name}: {POOL_KEY}"
    if not isinstance(section, Mapping):
        raise ValueError(f"{where} must be a mapping of {', '.join(POOL_SETTINGS)}, got {section!r}")
    unknown = sorted(set(section) - set(POOL_SETTINGS))
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; allowed: {', '.join(POOL_SETTINGS)}")
    for key, value in section.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{where}: {key} must be an integer >= 1, got {value!r}")
    return dict(section)


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
