"""Each family's record (:data:`explainers.FAMILIES`) against what its tiny models of ``tests/arch_zoo.py`` do.

The record says where a family's sequence classifiers read the sequence, whether its text models take segments
(``token_type_ids``), how many tokens come before the patches of its images, and whether Chefer et al.'s LRP has a
description of its blocks; these tests observe the same facts on the models themselves, so that a record that
drifts from its architecture fails here.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from explainers import FAMILIES, describe, pooled_position
from explainers.architectures.families import LRP_METHODS, model_family

from .arch_zoo import VARIANTS, Variant, image_batch, text_batch

#: The row the positions are observed on: 5 real tokens, right-padded to 7 (images: one picture).
REAL, WIDTH = 5, 7


def _variants(model_type: str) -> list[Variant]:
    variants = [variant for variant in VARIANTS if variant.model_type == model_type]
    assert variants, f"family {model_type!r} has no tiny model in tests/arch_zoo.py"
    return variants


@functools.cache
def _model(name: str) -> Any:
    return next(variant for variant in VARIANTS if variant.name == name).build()


def _row(variant: Variant, model: Any) -> dict[str, Tensor]:
    if not variant.is_text:
        return image_batch(model, size=1)
    batch = text_batch(model, lengths=(REAL, REAL, WIDTH))
    return {key: value[:1] for key, value in batch.items()}


def _last_layer(model: nn.Module) -> nn.Module:
    """The last layer of the model's largest list of layers (the backbone's blocks)."""
    lists = [module for module in model.modules() if isinstance(module, nn.ModuleList)]
    layers = max(lists, key=lambda layers: sum(parameter.numel() for parameter in layers.parameters()))
    return layers[-1]


def _hidden(output: Any) -> Tensor:
    return output if isinstance(output, Tensor) else output[0]


def _logits(model: nn.Module, row: dict[str, Tensor], position: int | None = None) -> tuple[Tensor, int]:
    """The logits of ``row``, the last layer's output at ``position`` moved by a random vector on its last call
    (unchanged for ``None``), and the sequence length that layer sees."""
    layer = _last_layer(model)
    calls: list[int] = []
    counted = [0]
    with torch.no_grad():
        handle = layer.register_forward_hook(lambda module, args, output: calls.append(_hidden(output).shape[1]))
        try:
            model(**row)
        finally:
            handle.remove()

        def move(module: nn.Module, args: Any, output: Any) -> Any:
            counted[0] += 1
            if position is None or counted[0] < len(calls):
                return output
            hidden = _hidden(output).clone()
            generator = torch.Generator().manual_seed(position)
            hidden[:, position] += torch.randn(hidden.shape[-1], generator=generator, dtype=hidden.dtype)
            return hidden if isinstance(output, Tensor) else (hidden, *output[1:])

        handle = layer.register_forward_hook(move)
        try:
            logits = model(**row).logits
        finally:
            handle.remove()
    return logits, calls[-1]


def _read_positions(model: nn.Module, row: dict[str, Tensor]) -> set[int]:
    """The positions whose last-layer hidden state the head reads: those whose change changes the logits."""
    plain, length = _logits(model, row)
    read = set()
    for position in range(length):
        moved, _ = _logits(model, row, position)
        if not torch.allclose(moved, plain, rtol=0.0, atol=1e-9):
            read.add(position)
    return read


def _expected_positions(pooled: str, length: int, prefix_tokens: int) -> set[int]:
    """The positions a head that pools at ``pooled`` reads in the observed row."""
    if pooled == "first":
        return {0}
    if pooled == "last":
        return {REAL - 1}
    if pooled == "mean":
        return set(range(REAL))
    if pooled == "class_distillation":
        return {0, 1}
    if pooled == "class_patch_mean":
        return {0, *range(prefix_tokens, length)}
    raise AssertionError(f"no observation for pooled position {pooled!r}")


@pytest.mark.parametrize("model_type", list(FAMILIES))
def test_a_family_pools_where_its_models_read(model_type: str) -> None:
    known = FAMILIES[model_type]
    for variant in _variants(model_type):
        model = _model(variant.name)
        pooled = known.pooling.pooled(type(model).__name__, model.config)
        assert pooled_position(model) == pooled == variant.pooled, variant.name
        row = _row(variant, model)
        _, length = _logits(model, row)
        if variant.is_text:
            assert length == WIDTH and known.prefix_tokens == 0
        else:
            patches = (model.config.image_size // model.config.patch_size) ** 2
            assert length == patches + known.prefix_tokens, variant.name
        assert _read_positions(model, row) == _expected_positions(pooled, length, known.prefix_tokens), variant.name


@pytest.mark.parametrize("model_type", list(FAMILIES))
def test_a_family_takes_segments_as_its_models_do(model_type: str) -> None:
    known = FAMILIES[model_type]
    for variant in _variants(model_type):
        model = _model(variant.name)
        embeds_segments = any(name.endswith("token_type_embeddings") for name, _ in model.named_modules())
        assert known.segments == embeds_segments, variant.name
        if known.segments:
            assert "token_type_ids" in inspect.signature(model.forward).parameters
        keys = describe(model).input_keys
        assert ("token_type_ids" in keys) == known.segments, variant.name


@pytest.mark.parametrize("model_type", list(FAMILIES))
def test_a_family_has_lrp_blocks_exactly_when_it_does_not_refuse_lrp(model_type: str) -> None:
    known = FAMILIES[model_type]
    refused = [method for method in LRP_METHODS if method in known.refused]
    assert refused == ([] if known.lrp is not None else list(LRP_METHODS))
    for variant in _variants(model_type):
        arch = describe(_model(variant.name))
        assert arch.has_blocks == (known.lrp is not None), variant.name
        if arch.has_blocks:
            assert len(arch.head) == sum(count for _, count in arch.head_paths)


def test_the_family_of_a_model_is_found_by_its_model_type_only() -> None:
    model = _model("bert")
    assert model_family(model) is FAMILIES["bert"]
    assert model_family(nn.Linear(2, 2)) is None

    class Unknown(nn.Module):
        config = type("Config", (), {"model_type": "gemma"})()

    assert model_family(Unknown()) is None
    assert pooled_position(Unknown()) == "first"
