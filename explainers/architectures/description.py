"""Describe one model for the explainers: :func:`describe` reads a Hugging Face model into an :class:`Architecture`.

The description holds references to the model's own modules and what its config says: the task and modality, the
attention calls and heads, the input embedding module, the accepted inputs, the position the head reads and the
head kind, and, for the families that support Chefer et al.'s relevance, the block structure of
:mod:`explainers.architectures.blocks`. Which families and classes are accepted, and what each family's text models
take, come from the family's record (:mod:`explainers.architectures.families`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from torch import nn

from ..errors import UnsupportedModelError
from .blocks import Block, sequence_blocks, token_blocks
from .families import model_family, supported_model_types
from .heads import head_type, pooled_position

Modality = Literal["text", "image"]


@dataclass(frozen=True)
class Architecture:
    """A supported model, described by references to its own modules.

    Every family has the fields that the attention-based and saliency methods read (the number of attention calls
    and heads, the input embeddings, the pooled position, the head kind). The block structure that Chefer et al.'s
    relevance needs (``blocks``, ``head``, ``head_paths``, ``norm_first``) is described only for the families that
    support it, and is empty elsewhere.

    Attributes:
        model_type: ``config.model_type``.
        kind: ``encoder``, ``decoder`` or ``vision`` (see :mod:`explainers.architectures.families`).
        task: ``sequence_classification``, ``token_classification`` or ``causal_lm`` (:data:`explainers.TASKS`):
            which entry point explains the model.
        modality: ``text`` (scores per token) or ``image`` (scores per patch).
        num_layers: attention calls per forward (one per layer; ALBERT calls its shared layer this many times).
        num_heads: attention heads per call.
        input_embeddings: the module whose output is the per-token / per-patch input embedding
            (used by ``grad_x_input`` and ``integrated_gradients``).
        input_keys: keys the model accepts in ``inputs``.
        required_keys: the keys of ``input_keys`` that must be present.
        grid: for images, ``(grid_h, grid_w)`` patches of the configured image size; ``None`` for text (a model
            that interpolates its position embeddings, such as DINOv2, is explained on the grid of the input it
            gets: see ``patch``).
        patch: for images, ``(patch_h, patch_w)`` pixels per patch; ``None`` for text.
        prefix_tokens: tokens before the patches for images (class, distillation: the family's record); 0 for
            text.
        pooled: where the head reads (:func:`explainers.architectures.heads.pooled_position`).
        head_type: ``single_label``, ``multi_label`` or ``regression``
            (:func:`explainers.architectures.heads.head_type`).
        padding: padding sides accepted for text.
        norm_first: True for pre-LayerNorm blocks (ViT), False for post-LayerNorm blocks (BERT family).
        blocks: for relevance, the encoder blocks in call order (ALBERT repeats its shared block), input side first.
        head: for relevance, the linear layers of the classification head(s) in forward order (activations between
            them are treated as identity by LRP, as in Chefer et al.'s code).
        head_paths: for relevance, per head ``(token, number of linears in head)``: DeiT with a teacher has two
            heads (class token, distillation token), whose logits the model averages.
        input_positions: for ``lrp`` on images, the position embeddings ``(1, n, hidden)`` added to the prefix and
            patch tokens before the first block (Chefer et al.'s ViT code splits the input's relevance between
            them); ``None`` for text.
    """

    model_type: str
    kind: str
    task: str
    modality: Modality
    num_layers: int
    num_heads: int
    input_embeddings: nn.Module
    input_keys: frozenset[str]
    required_keys: frozenset[str]
    grid: tuple[int, int] | None
    prefix_tokens: int
    pooled: str
    head_type: str
    padding: tuple[str, ...]
    norm_first: bool = False
    blocks: tuple[Block, ...] = ()
    head: tuple[nn.Linear, ...] = ()
    head_paths: tuple[tuple[int, int], ...] = ()
    patch: tuple[int, int] | None = None
    input_positions: nn.Parameter | None = None

    @property
    def has_blocks(self) -> bool:
        """Whether the block structure for relevance is described."""
        return bool(self.blocks)


TEXT_PAIR_KEYS = frozenset({"input_ids", "attention_mask", "token_type_ids"})
TEXT_SINGLE_KEYS = frozenset({"input_ids", "attention_mask"})


def _pair(value: int | list[int] | tuple[int, ...]) -> tuple[int, int]:
    if isinstance(value, int):
        return value, value
    first, second = value
    return int(first), int(second)


def model_config(model: nn.Module) -> Any:
    """The Hugging Face ``config`` of ``model`` (``None`` if it has none)."""
    return getattr(model, "config", None)


def describe(model: nn.Module) -> Architecture:
    """Describe ``model`` by references to its own modules.

    Raises:
        UnsupportedModelError: if the model is not one of the supported classifier classes.
    """
    config = model_config(model)
    model_type = getattr(config, "model_type", None)
    known = model_family(model)
    if known is None:
        raise UnsupportedModelError(
            f"unsupported model type {model_type!r}: expected a Hugging Face classifier of type "
            f"{', '.join(supported_model_types())}"
        )
    task = known.task_of(type(model).__name__)
    if task is None:
        raise UnsupportedModelError(
            f"{type(model).__name__} is not supported: for model type {model_type!r} pass a "
            f"{' or a '.join(known.all_classes)}"
        )
    assert config is not None
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    lrp = None
    if task == "sequence_classification":
        lrp = sequence_blocks(model)
    elif task == "token_classification":
        lrp = token_blocks(model)
    modality: Modality = "image" if known.kind == "vision" else "text"
    grid = None
    patch = None
    if modality == "image":
        image_h, image_w = _pair(config.image_size)
        patch_h, patch_w = _pair(config.patch_size)
        grid = (image_h // patch_h, image_w // patch_w)
        patch = (patch_h, patch_w)
        keys = frozenset({"pixel_values"})
        if not isinstance(getattr(model, "classifier", None) or getattr(model, "cls_classifier", None), nn.Linear):
            raise UnsupportedModelError(
                "this image classifier has no linear classification head (num_labels must be > 0)"
            )
    else:
        keys = TEXT_PAIR_KEYS if known.segments else TEXT_SINGLE_KEYS
    embeddings = model.get_input_embeddings()  # type: ignore[operator]
    if not isinstance(embeddings, nn.Module):
        raise UnsupportedModelError(f"{type(model).__name__} exposes no input embedding module")
    return Architecture(
        model_type=str(model_type),
        kind=known.kind,
        task=task,
        modality=modality,
        num_layers=_attention_calls(text_config),
        num_heads=int(text_config.num_attention_heads),
        input_embeddings=embeddings,
        input_keys=keys,
        required_keys=keys & {"input_ids", "pixel_values"},
        grid=grid,
        prefix_tokens=known.prefix_tokens,
        pooled=pooled_position(model),
        head_type=head_type(model),
        padding=known.padding,
        norm_first=False if lrp is None else lrp.norm_first,
        blocks=() if lrp is None else lrp.blocks,
        head=() if lrp is None else lrp.head,
        head_paths=() if lrp is None else lrp.head_paths,
        patch=patch,
        input_positions=None if lrp is None else lrp.input_positions,
    )


def _attention_calls(config: Any) -> int:
    """Attention calls per forward: one per layer; ALBERT runs ``inner_group_num`` shared layers per layer."""
    return int(config.num_hidden_layers) * int(getattr(config, "inner_group_num", 1) or 1)
