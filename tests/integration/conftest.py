"""A real TorchServe (Java frontend + Python workers) serving the tiny archives on free loopback ports, started
once per test session and stopped by its pid, also when tests fail."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from model_store.serving.launcher import Ports, Server, start, stop
from tests.serving_support import tiny_archives


@pytest.fixture(scope="session")
def archives() -> dict[str, Path]:
    return tiny_archives()


@pytest.fixture(scope="session")
def server(archives: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    run_dir = tmp_path_factory.mktemp("run")
    store = next(iter(archives.values())).parent.parent
    models = {name: str(path.relative_to(store)) for name, path in archives.items()}
    started = start(run_dir, store, models, Ports.free(), timeout=180)
    try:
        yield started
    finally:
        stop(run_dir)
