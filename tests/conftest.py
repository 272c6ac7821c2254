"""Shared fixtures: tiny Hugging Face classifiers built from configs (no downloads), with non-degenerate weights, and
a real TorchServe (Java frontend + Python workers) serving the tiny archives on free loopback ports, started once per
test session (on first use) and stopped by its pid, also when tests fail.

Every server a test starts ends with the pytest process, even when pytest is killed (an outer timeout's SIGKILL)
before any clean-up runs: ``EXPLAIN_OWNER_PID`` names this process, so the launcher (in this process or in a
``python -m doors`` subprocess) puts a watchdog on each TorchServe, and the other servers go through
:func:`tests.serving_support.owned_popen` (tests/test_cleanup.py kills a pytest to prove it)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor, nn
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    DistilBertConfig,
    DistilBertForSequenceClassification,
    RobertaConfig,
    RobertaForSequenceClassification,
    ViTConfig,
    ViTForImageClassification,
)

from doors.torchserve.config import POOL_KEY, Ports
from doors.torchserve.process import Server, start, stop
from supervise.watchdog import OWNER_ENV
from supervise.workdir import WORKDIR_ENV
from tests.serving_support import tiny_archives
from tests.weights import perturb

# `make test` runs under the Makefile's exported EXPLAIN_WORKDIR (the clone, which keeps `make serve`'s
# model_store/build and run/ there); the tests choose their own folders and directories, so the setting goes: they then
# run the same under `make test` as under a bare pytest from the checkout's root (tests/test_workdir.py sets it itself).
os.environ.pop(WORKDIR_ENV, None)

VOCAB = 60
NUM_LABELS = 3


def pytest_configure(config: pytest.Config) -> None:
    """Servers started by this session (and by its subprocesses) end with this process (module docstring)."""
    os.environ[OWNER_ENV] = str(os.getpid())


def _labelled(config: Any) -> Any:
    config.num_labels = NUM_LABELS
    return config


def _eager(model: Any) -> Any:
    model.set_attn_implementation("eager")
    return model.eval()


def build_bert() -> Any:
    config = BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=64, hidden_act="gelu",
    )  # fmt: skip
    return _eager(perturb(BertForSequenceClassification(_labelled(config)), 1, unit_embeddings="embeddings"))


def build_roberta() -> Any:
    config = RobertaConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=72, pad_token_id=1, bos_token_id=0, eos_token_id=2,
    )  # fmt: skip
    return _eager(perturb(RobertaForSequenceClassification(_labelled(config)), 2, unit_embeddings="embeddings"))


def build_distilbert() -> Any:
    config = DistilBertConfig(
        vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4, hidden_dim=64, max_position_embeddings=64,
    )  # fmt: skip
    return _eager(perturb(DistilBertForSequenceClassification(_labelled(config)), 3, unit_embeddings="embeddings"))


def build_vit(image_size: int | list[int] = 16, patch_size: int = 4) -> Any:
    config = ViTConfig(
        image_size=image_size, patch_size=patch_size, num_channels=3, hidden_size=32, num_hidden_layers=2,
        num_attention_heads=4, intermediate_size=64,
    )  # fmt: skip
    return _eager(perturb(ViTForImageClassification(_labelled(config)), 4, unit_embeddings="embeddings"))


def build_vit_wide() -> Any:
    """A non-square ViT: 12×20 pixels in 4×4 patches, a 3×5 grid."""
    return build_vit([12, 20], 4)


@dataclass(frozen=True)
class Case:
    """A tiny model and a function producing a batch of inputs for it."""

    name: str
    build: Callable[[], nn.Module]

    @property
    def is_text(self) -> bool:
        return not self.name.startswith("vit")


CASES = [
    Case("bert", build_bert),
    Case("roberta", build_roberta),
    Case("distilbert", build_distilbert),
    Case("vit", build_vit),
    Case("vit_wide", build_vit_wide),
]

LENGTHS = (7, 3, 9, 5)


def text_batch(model: Any, lengths: tuple[int, ...] = LENGTHS, seed: int = 0) -> dict[str, Tensor]:
    """Right-padded random token ids with a first token of 0 ([CLS]-like) and the given real lengths."""
    generator = torch.Generator().manual_seed(seed)
    pad = model.config.pad_token_id or 0
    width = max(lengths)
    ids = torch.full((len(lengths), width), pad, dtype=torch.long)
    mask = torch.zeros((len(lengths), width), dtype=torch.long)
    for row, length in enumerate(lengths):
        ids[row, :length] = torch.randint(3, VOCAB, (length,), generator=generator)
        ids[row, 0] = 0 if model.config.model_type == "roberta" else 2
        mask[row, :length] = 1
    batch = {"input_ids": ids, "attention_mask": mask}
    if model.config.model_type == "bert":
        batch["token_type_ids"] = torch.zeros_like(ids)
    return batch


def image_batch(model: Any, size: int = 3, seed: int = 0) -> dict[str, Tensor]:
    """Random pixel values of the model's image size."""
    generator = torch.Generator().manual_seed(seed)
    height, width = (
        model.config.image_size if isinstance(model.config.image_size, list) else [model.config.image_size] * 2
    )
    pixels = torch.randn((size, 3, height, width), generator=generator, dtype=next(model.parameters()).dtype)
    return {"pixel_values": pixels}


def make_batch(case: Case, model: Any) -> dict[str, Tensor]:
    return text_batch(model) if case.is_text else image_batch(model)


def row_inputs(batch: dict[str, Tensor], row: int) -> dict[str, Tensor]:
    """Row ``row`` of a batch alone, padding removed."""
    if "pixel_values" in batch:
        return {"pixel_values": batch["pixel_values"][row : row + 1]}
    length = int(batch["attention_mask"][row].sum())
    return {key: value[row : row + 1, :length] for key, value in batch.items()}


@pytest.fixture(params=CASES, ids=[case.name for case in CASES])
def case(request: pytest.FixtureRequest) -> Case:
    return request.param


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """One intra-op thread for the test: tiny models' forwards take a few ms, which OpenMP threads on shared cores
    stretch (the time-budget tests time them)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def archives() -> dict[str, Path]:
    return tiny_archives()


@pytest.fixture(scope="session")
def server(archives: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    run_dir = tmp_path_factory.mktemp("run")
    store = next(iter(archives.values())).parent.parent
    models = {name: str(path.relative_to(store)) for name, path in archives.items()}
    # sentiment is served with an explanation pool (sentiment.explain, behind the router), digits without one: the
    # serving and client tests run through both set-ups (tests/integration/test_explanation_pool.py checks the routing)
    pool = {"sentiment": {POOL_KEY: {"batchSize": 4, "maxBatchDelay": 2}}}
    started = start(run_dir, store, models, Ports.free(), timeout=180, overrides=pool)
    try:
        yield started
    finally:
        stop(run_dir)
