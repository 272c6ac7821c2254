"""Chefer et al.'s baselines against their own code (hila-chefer/Transformer-Explainability), in float64.

Their BERT (``BERT_explainability``: ``Generator.generate_attn_gradcam``, ``generate_full_lrp``,
``generate_LRP_last_layer``, ``generate_LRP``, ``generate_rollout``, ``generate_attn_last_layer``) and ViT
(``baselines/ViT``: ``Baselines.generate_cam_attn``, ``generate_rollout``, ``LRP.generate_LRP`` with ``full``,
``last_layer``, ``last_layer_attn``) are built from a tiny random model's weights and run one example at a time, as
they are written; ours runs a padded batch, and each row is compared with the authors' result for that example alone.
Skipped with one line unless ``CHEFER_REFERENCE`` names a checkout (tests/references.py).

Where the authors' code differs from ours on purpose, the comparison says so: their BERT ``rollout`` and
``attention`` set the [CLS] entry to 0 (ours keep it, so it is left out of the comparison), and their ViT code returns
pixels for full LRP (summed here over each patch: the first layer's zB rule conserves each patch's relevance).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor
from transformers import PreTrainedModel, ViTConfig, ViTForImageClassification

from explainers import explain

from .arch_zoo import VARIANTS, batch_for, row_alone
from .references import CHEFER, CHEFER_MARKER, checkout, chefer
from .weights import perturb

__all__ = ["chefer"]  # the fixture

checkout(CHEFER, CHEFER_MARKER)  # or skip this module, with one line
pytest.importorskip("einops", reason="einops is not installed: Chefer et al.'s ViT code imports it")

#: Largest difference relative to the largest score of the authors' result (float64 throughout). Their ViT full LRP
#: goes down to the pixels through a zB rule whose denominator has ``+1e-9`` (ours stops at the patch embedding):
#: ~4e-9 of the largest score.
TOLERANCE = {"bert": 1e-9, "vit": 1e-8}
DIFFERENCES: dict[str, float] = {}


def _their_bert(model: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The authors' ``BertForSequenceClassification`` with ``model``'s weights. transformers 5 dropped three helpers
    it calls (``init_weights`` in its constructor, and ``get_extended_attention_mask`` / ``get_head_mask``): the
    constructor runs with ``init_weights`` a no-op (every weight is loaded after), and the instance gets the two
    helpers as transformers 4 defined them."""
    from BERT_explainability.modules.BERT.BertForSequenceClassification import BertForSequenceClassification

    config = copy.deepcopy(model.config)
    config.return_dict = False
    with monkeypatch.context() as patch:
        patch.setattr(PreTrainedModel, "init_weights", lambda self: None)
        theirs = BertForSequenceClassification(config)
    theirs = theirs.double().eval()
    missing, unexpected = theirs.load_state_dict(model.state_dict(), strict=False)
    assert unexpected == [] and set(missing) <= {"bert.embeddings.position_ids"}
    dtype = torch.float64
    theirs.bert.get_extended_attention_mask = lambda mask, shape, device: (
        (1.0 - mask[:, None, None, :].to(dtype)) * (torch.finfo(dtype).min)
    )
    theirs.bert.get_head_mask = lambda head_mask, layers: [None] * layers
    return theirs


def _record(name: str, got: Tensor, expected: Tensor) -> None:
    scale = float(expected.abs().max().clamp(min=1e-30))
    difference = float((got - expected).abs().max())
    DIFFERENCES[name] = max(DIFFERENCES.get(name, 0.0), difference)
    assert difference <= TOLERANCE[name.split()[0]] * scale, (name, difference, scale)


def test_bert_baselines_equal_the_authors_code(chefer: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from BERT_explainability.modules.BERT.ExplanationGenerator import Generator

    variant = next(variant for variant in VARIANTS if variant.name == "bert")
    model = variant.build()
    batch = batch_for(variant, model)
    generator = Generator(_their_bert(model, monkeypatch))
    theirs: dict[str, Callable[..., Tensor]] = {
        "gradcam": generator.generate_attn_gradcam,
        "lrp": generator.generate_full_lrp,
        "partial_lrp": generator.generate_LRP_last_layer,
        "relevance": lambda ids, mask: generator.generate_LRP(ids, mask, start_layer=0),
        "rollout": generator.generate_rollout,
        "attention": generator.generate_attn_last_layer,
    }
    for method, reference in theirs.items():
        ours = explain(model, batch, method=method).scores
        for row in range(batch["input_ids"].shape[0]):
            real = batch["attention_mask"][row].bool()
            alone = row_alone(batch, row)
            with torch.enable_grad():
                expected = reference(alone["input_ids"], alone["attention_mask"])[0].detach()
            got = ours[row][real]
            assert (ours[row][~real] == 0).all()
            if method in ("rollout", "attention"):  # their [CLS] entry is set to 0, ours is the row's own
                got, expected = got[1:], expected[1:]
            _record(f"bert {method}", got, expected)
    print("\nlargest differences, BERT:", {name: f"{value:.1e}" for name, value in DIFFERENCES.items()})


def _vit() -> Any:
    """A tiny random ViT on 224-pixel images of 16-pixel patches: their ViT GradCAM reshapes to a 14 × 14 grid."""
    config = ViTConfig(  # type: ignore[call-arg]
        image_size=224, patch_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, num_labels=3, layer_norm_eps=1e-6, qkv_bias=True,
    )  # fmt: skip
    return perturb(ViTForImageClassification(config).double().eval(), seed=7)


def _their_vit(model: Any, module: Any) -> Any:
    """The authors' ``VisionTransformer`` of ``module`` (``ViT_LRP`` or ``ViT_new``) with ``model``'s weights (their
    single ``qkv`` projection is our q, k, v stacked) and our LayerNorm epsilon on every norm."""
    config = model.config
    theirs = module.VisionTransformer(
        img_size=config.image_size, patch_size=config.patch_size, num_classes=config.num_labels,
        embed_dim=config.hidden_size, depth=config.num_hidden_layers, num_heads=config.num_attention_heads,
        mlp_ratio=config.intermediate_size / config.hidden_size, qkv_bias=True,
    )  # fmt: skip
    ours = model.state_dict()
    state = {
        "cls_token": ours["vit.embeddings.cls_token"],
        "pos_embed": ours["vit.embeddings.position_embeddings"],
        "patch_embed.proj.weight": ours["vit.embeddings.patch_embeddings.projection.weight"],
        "patch_embed.proj.bias": ours["vit.embeddings.patch_embeddings.projection.bias"],
        "norm.weight": ours["vit.layernorm.weight"],
        "norm.bias": ours["vit.layernorm.bias"],
        "head.weight": ours["classifier.weight"],
        "head.bias": ours["classifier.bias"],
    }
    for index in range(config.num_hidden_layers):
        prefix = f"vit.layers.{index}."
        for part in ("weight", "bias"):
            state[f"blocks.{index}.attn.qkv.{part}"] = torch.cat(
                [ours[f"{prefix}attention.{name}_proj.{part}"] for name in ("q", "k", "v")]
            )
            state[f"blocks.{index}.attn.proj.{part}"] = ours[f"{prefix}attention.o_proj.{part}"]
            state[f"blocks.{index}.norm1.{part}"] = ours[f"{prefix}layernorm_before.{part}"]
            state[f"blocks.{index}.norm2.{part}"] = ours[f"{prefix}layernorm_after.{part}"]
            state[f"blocks.{index}.mlp.fc1.{part}"] = ours[f"{prefix}mlp.fc1.{part}"]
            state[f"blocks.{index}.mlp.fc2.{part}"] = ours[f"{prefix}mlp.fc2.{part}"]
    theirs = theirs.double().eval()
    theirs.load_state_dict(state, strict=True)
    for norm in theirs.modules():
        if isinstance(norm, torch.nn.LayerNorm):
            norm.eps = config.layer_norm_eps
    return theirs


def _float64_softmax(monkeypatch: pytest.MonkeyPatch) -> None:
    """For this test only: a float64 softmax stays in float64. transformers' eager ViT attention takes its softmax in
    float32 even in a float64 model (``softmax(..., dtype=torch.float32)``), so the maps the methods read would be
    rounded to ~1e-7 where the authors' are not."""
    softmax = torch.nn.functional.softmax

    def exact(tensor: Tensor, dim: int | None = None, _stacklevel: int = 3, dtype: torch.dtype | None = None) -> Tensor:
        return softmax(tensor, dim=dim, dtype=None if tensor.dtype == torch.float64 else dtype)

    monkeypatch.setattr(torch.nn.functional, "softmax", exact)


def test_vit_baselines_equal_the_authors_code(chefer: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _float64_softmax(monkeypatch)
    from baselines.ViT import ViT_LRP, ViT_new
    from baselines.ViT.ViT_explanation_generator import LRP, Baselines

    model = _vit()
    pixels = torch.randn((3, 3, 224, 224), generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    lrp_model = _their_vit(model, ViT_LRP)
    plain_model = _their_vit(model, ViT_new)
    with torch.no_grad():
        plain = model(pixel_values=pixels).logits
    assert torch.allclose(lrp_model(pixels).detach(), plain, atol=1e-10, rtol=0)  # their forward hooks need grad
    lrp, baselines = LRP(lrp_model), Baselines(plain_model)
    grid = model.config.image_size // model.config.patch_size
    patch = model.config.patch_size

    def per_patch(pixel_map: Tensor) -> Tensor:
        return pixel_map.reshape(grid, patch, grid, patch).sum(dim=(1, 3))

    theirs: dict[str, Callable[[Tensor], Tensor]] = {
        "gradcam": lambda image: baselines.generate_cam_attn(image),
        "lrp": lambda image: per_patch(lrp.generate_LRP(image, method="full")[0]),
        "partial_lrp": lambda image: lrp.generate_LRP(image, method="last_layer").reshape(grid, grid),
        "attention": lambda image: lrp.generate_LRP(image, method="last_layer_attn").reshape(grid, grid),
        "rollout": lambda image: baselines.generate_rollout(image, start_layer=0)[0].reshape(grid, grid),
    }
    for method, reference in theirs.items():
        ours = explain(model, {"pixel_values": pixels}, method=method).scores
        for row in range(pixels.shape[0]):
            with torch.enable_grad():
                expected = reference(pixels[row : row + 1]).detach()
            _record(f"vit {method}", ours[row], expected)
    print("\nlargest differences, ViT:", {name: f"{value:.1e}" for name, value in DIFFERENCES.items()})
