"""``gradient``, ``smoothgrad`` and ``occlusion`` against Captum (``Saliency``, ``NoiseTunnel``, ``FeatureAblation``
and ``Occlusion``), in float64, per row of a padded batch.

Captum attributes a function of the input embeddings (the output of the model's input-embedding module, word or
patch; a forward hook puts Captum's tensor there), one example at a time with no padding; ours runs the padded batch.
SmoothGrad is compared with *the same noise*: Captum draws it with ``torch.normal`` from the global generator, which
is seeded with the row's seed, in float64 (the default dtype for the call), so its draws are ours. Skipped with one
line where Captum is not installed (the ``bench`` extra).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from explainers import explain

from .arch_zoo import VARIANTS, batch_for, row_alone

captum_attr = pytest.importorskip("captum.attr", reason="Captum is not installed (pip install captum==0.9.0)")

TOLERANCE = 1e-10
#: The rotary families' eager attention computes its softmax (and transformers its rotary angles) in float32 even in a
#: float64 model, so a row padded in a batch and the same row alone, as Captum runs it, differ by float32 rounding
#: there (measured: up to 2e-7 of the largest score); tests/test_generation.py gives the same reason.
FLOAT32_SOFTMAX = 1e-5
NAMES = ["bert", "llama", "vit"]


def _tolerance(name: str) -> float:
    return FLOAT32_SOFTMAX if name == "llama" else TOLERANCE


def _input_embeddings(model: Any) -> nn.Module:
    embeddings = model.get_input_embeddings()
    assert isinstance(embeddings, nn.Module)
    return embeddings


def _forward(model: nn.Module, inputs: dict[str, Tensor]) -> Callable[[Tensor], Tensor]:
    """The logits as a function of the input embeddings (Captum's batch of them: the inputs repeated to match)."""

    def forward(embeddings: Tensor) -> Tensor:
        copies = embeddings.shape[0] // next(iter(inputs.values())).shape[0]
        repeated = {key: value.repeat(copies, *([1] * (value.dim() - 1))) for key, value in inputs.items()}
        handle = _input_embeddings(model).register_forward_hook(lambda module, args, output: embeddings)
        try:
            return model(**repeated).logits
        finally:
            handle.remove()

    return forward


def _embeddings(model: nn.Module, inputs: dict[str, Tensor]) -> Tensor:
    kept: list[Tensor] = []
    handle = _input_embeddings(model).register_forward_hook(lambda module, args, output: kept.append(output))
    try:
        with torch.no_grad():
            model(**inputs)
    finally:
        handle.remove()
    return kept[0].detach()


@contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def _rows(name: str) -> Iterator[tuple[Any, dict[str, Tensor], Any, int, dict[str, Tensor], Tensor | None]]:
    """(model, batch, variant, row, the row's inputs alone, a mask of its real tokens in the padded batch)."""
    variant = next(variant for variant in VARIANTS if variant.name == name)
    model = variant.build()
    batch = batch_for(variant, model)
    for row in range(next(iter(batch.values())).shape[0]):
        real = batch["attention_mask"][row].bool() if variant.is_text else None
        yield model, batch, variant, row, row_alone(batch, row), real


def _compare(ours: Tensor, row: int, real: Tensor | None, theirs: Tensor, tolerance: float = TOLERANCE) -> float:
    got = ours[row][real] if real is not None else ours[row].flatten()
    scale = float(theirs.abs().max().clamp(min=1e-30))
    difference = float((got - theirs).abs().max())
    assert difference <= tolerance * scale, (difference, scale, got, theirs)
    return difference / scale


@pytest.mark.parametrize("name", NAMES)
def test_gradient_equals_captum_saliency(name: str) -> None:
    worst = 0.0
    cache: dict[str, Tensor] = {}
    for model, batch, _, row, alone, real in _rows(name):
        if "ours" not in cache:
            result = explain(model, batch, method="gradient")
            cache["ours"], cache["targets"] = result.scores, result.target
        saliency = captum_attr.Saliency(_forward(model, alone))
        attribution = saliency.attribute(_embeddings(model, alone), target=int(cache["targets"][row]), abs=True)
        theirs = torch.linalg.vector_norm(attribution[0], dim=-1)
        worst = max(worst, _compare(cache["ours"], row, real, theirs, _tolerance(name)))
    print(f"\n{name} gradient: largest relative difference from Captum {worst:.1e}")
    assert worst <= _tolerance(name)


@pytest.mark.parametrize("name", NAMES)
def test_smoothgrad_equals_captum_noise_tunnel_with_the_same_noise(name: str) -> None:
    samples, stdev, seed = 5, 0.2, 11
    worst = 0.0
    cache: dict[str, Tensor] = {}
    for model, batch, _, row, alone, real in _rows(name):
        if "ours" not in cache:
            options: dict[str, Any] = {"n_samples": samples, "stdev": stdev, "seed": seed, "internal_batch_size": 8}
            result = explain(model, batch, method="smoothgrad", **options)
            cache["ours"], cache["targets"] = result.scores, result.target
        embeddings = _embeddings(model, alone)
        tunnel = captum_attr.NoiseTunnel(captum_attr.InputXGradient(_forward(model, alone)))
        scale = float(embeddings[0].std() * stdev)
        torch.manual_seed(seed)
        with _default_dtype(torch.float64):
            attribution = tunnel.attribute(
                embeddings, nt_type="smoothgrad", nt_samples=samples, stdevs=scale, target=int(cache["targets"][row])
            )
        worst = max(worst, _compare(cache["ours"], row, real, attribution[0].sum(dim=-1), _tolerance(name)))
    print(f"\n{name} smoothgrad: largest relative difference from Captum {worst:.1e}")
    assert worst <= _tolerance(name)


@pytest.mark.parametrize("name", NAMES)
def test_occlusion_equals_captum_feature_ablation(name: str) -> None:
    worst = 0.0
    baseline_token = 5
    for token in (-1, baseline_token):
        cache: dict[str, Tensor] = {}
        for model, batch, variant, row, alone, real in _rows(name):
            if token >= 0 and not variant.is_text:
                break  # no token replaces a patch
            if "ours" not in cache:
                result = explain(model, batch, method="occlusion", baseline_token_id=token)
                cache["ours"], cache["targets"] = result.scores, result.target
            embeddings = _embeddings(model, alone)
            features = torch.arange(embeddings.shape[1]).view(1, -1, 1).expand_as(embeddings)
            baseline: Any = 0.0
            if token >= 0:
                with torch.no_grad():
                    baseline = _input_embeddings(model)(torch.tensor([[token]]))
            ablation = captum_attr.FeatureAblation(_forward(model, alone))
            attribution = ablation.attribute(
                embeddings, baselines=baseline, feature_mask=features, target=int(cache["targets"][row])
            )
            worst = max(worst, _compare(cache["ours"], row, real, attribution[0, :, 0], _tolerance(name)))
    print(f"\n{name} occlusion: largest relative difference from Captum {worst:.1e}")
    assert worst <= _tolerance(name)


def test_occlusion_equals_captum_occlusion_of_one_token_windows() -> None:
    worst = 0.0
    for model, batch, _, row, alone, real in _rows("bert"):
        result = explain(model, batch, method="occlusion")
        embeddings = _embeddings(model, alone)
        occlusion = captum_attr.Occlusion(_forward(model, alone))
        width = embeddings.shape[-1]
        with _default_dtype(torch.float64):  # Captum's Occlusion accumulates in the default dtype
            attribution = occlusion.attribute(
                embeddings, sliding_window_shapes=(1, width), strides=(1, width), target=int(result.target[row])
            )
        # Occlusion divides its sums by the windows' counts after ``.float()``: float32's rounding, not ours.
        worst = max(worst, _compare(result.scores, row, real, attribution[0, :, 0], tolerance=1e-6))
    print(f"\nbert occlusion (Captum's Occlusion): largest relative difference {worst:.1e}")
    assert worst <= 1e-6
