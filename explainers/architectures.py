"""Where the parts of each supported Hugging Face architecture live.

The explainers never fork Hugging Face model files. Instead each supported ``config.model_type`` is described
once, here, by the stock modules that the relevance propagation needs: the six linear layers of every block,
whether the block normalises before (ViT) or after (BERT family) its residual additions, and the linear
layers of the classification head that read the first ([CLS] / class) token.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from torch import nn

from .errors import UnsupportedModelError

Modality = Literal["text", "image"]


@dataclass(frozen=True)
class Block:
    """The stock modules of one Transformer block that relevance propagation reads."""

    layer: nn.Module
    attention: nn.Module
    query: nn.Linear
    key: nn.Linear
    value: nn.Linear
    attention_output: nn.Linear
    ffn_in: nn.Linear
    ffn_out: nn.Linear


@dataclass(frozen=True)
class Architecture:
    """A supported classifier, described by references to its own modules.

    Attributes:
        model_type: ``config.model_type`` (``bert``, ``roberta``, ``distilbert``, ``vit``).
        modality: ``text`` (scores per token) or ``image`` (scores per patch).
        norm_first: True for pre-LayerNorm blocks (ViT), False for post-LayerNorm blocks (BERT family).
        blocks: the encoder blocks, input side first.
        head: the linear layers of the classification head, applied in this order to the first token's vector
            (activations between them are treated as identity by LRP, as in Chefer et al.'s code).
        num_heads: attention heads per block.
        input_embeddings: the module whose output is the per-token / per-patch input embedding
            (used by ``grad_x_input`` and ``integrated_gradients``).
        input_keys: keys the model accepts in ``inputs``; ``required_keys`` must be present.
        grid: for images, ``(grid_h, grid_w)`` patches; ``None`` for text.
    """

    model_type: str
    modality: Modality
    norm_first: bool
    blocks: tuple[Block, ...]
    head: tuple[nn.Linear, ...]
    num_heads: int
    input_embeddings: nn.Module
    input_keys: frozenset[str]
    required_keys: frozenset[str]
    grid: tuple[int, int] | None

    @property
    def num_layers(self) -> int:
        """Number of encoder blocks."""
        return len(self.blocks)


TEXT_KEYS = frozenset({"input_ids", "attention_mask", "token_type_ids"})


def _pair(value: int | list[int] | tuple[int, ...]) -> tuple[int, int]:
    if isinstance(value, int):
        return value, value
    first, second = value
    return int(first), int(second)


def _bert_family(model: Any, base: Any, head: tuple[nn.Linear, ...]) -> Architecture:
    blocks = tuple(
        Block(
            layer=layer,
            attention=layer.attention.self,
            query=layer.attention.self.query,
            key=layer.attention.self.key,
            value=layer.attention.self.value,
            attention_output=layer.attention.output.dense,
            ffn_in=layer.intermediate.dense,
            ffn_out=layer.output.dense,
        )
        for layer in base.encoder.layer
    )
    config = model.config
    return Architecture(
        model_type=config.model_type,
        modality="text",
        norm_first=False,
        blocks=blocks,
        head=head,
        num_heads=config.num_attention_heads,
        input_embeddings=base.embeddings.word_embeddings,
        input_keys=TEXT_KEYS,
        required_keys=frozenset({"input_ids"}),
        grid=None,
    )


def _bert(model: Any) -> Architecture:
    return _bert_family(model, model.bert, (model.bert.pooler.dense, model.classifier))


def _roberta(model: Any) -> Architecture:
    return _bert_family(model, model.roberta, (model.classifier.dense, model.classifier.out_proj))


def _distilbert(model: Any) -> Architecture:
    base = model.distilbert
    blocks = tuple(
        Block(
            layer=layer,
            attention=layer.attention,
            query=layer.attention.q_lin,
            key=layer.attention.k_lin,
            value=layer.attention.v_lin,
            attention_output=layer.attention.out_lin,
            ffn_in=layer.ffn.lin1,
            ffn_out=layer.ffn.lin2,
        )
        for layer in base.transformer.layer
    )
    config = model.config
    return Architecture(
        model_type="distilbert",
        modality="text",
        norm_first=False,
        blocks=blocks,
        head=(model.pre_classifier, model.classifier),
        num_heads=config.n_heads,
        input_embeddings=base.embeddings.word_embeddings,
        input_keys=frozenset({"input_ids", "attention_mask"}),
        required_keys=frozenset({"input_ids"}),
        grid=None,
    )


def _vit(model: Any) -> Architecture:
    base = model.vit
    blocks = tuple(
        Block(
            layer=layer,
            attention=layer.attention,
            query=layer.attention.q_proj,
            key=layer.attention.k_proj,
            value=layer.attention.v_proj,
            attention_output=layer.attention.o_proj,
            ffn_in=layer.mlp.fc1,
            ffn_out=layer.mlp.fc2,
        )
        for layer in (base.layers if hasattr(base, "layers") else base.encoder.layer)
    )
    config = model.config
    image_h, image_w = _pair(config.image_size)
    patch_h, patch_w = _pair(config.patch_size)
    if not isinstance(model.classifier, nn.Linear):
        raise UnsupportedModelError("this ViT has no linear classification head (num_labels must be > 0)")
    return Architecture(
        model_type="vit",
        modality="image",
        norm_first=True,
        blocks=blocks,
        head=(model.classifier,),
        num_heads=config.num_attention_heads,
        input_embeddings=base.embeddings.patch_embeddings,
        input_keys=frozenset({"pixel_values"}),
        required_keys=frozenset({"pixel_values"}),
        grid=(image_h // patch_h, image_w // patch_w),
    )


_ADAPTERS: dict[str, Callable[[Any], Architecture]] = {
    "bert": _bert,
    "roberta": _roberta,
    "distilbert": _distilbert,
    "vit": _vit,
}

_CLASSES = {
    "bert": "BertForSequenceClassification",
    "roberta": "RobertaForSequenceClassification",
    "distilbert": "DistilBertForSequenceClassification",
    "vit": "ViTForImageClassification",
}


def model_config(model: nn.Module) -> Any:
    """The Hugging Face ``config`` of ``model`` (``None`` if it has none)."""
    return getattr(model, "config", None)


def supported_model_types() -> list[str]:
    """The ``config.model_type`` values the explainers support."""
    return sorted(_ADAPTERS)


def describe(model: nn.Module) -> Architecture:
    """Describe ``model`` by references to its own modules.

    Raises:
        UnsupportedModelError: if the model is not one of the supported classifier classes.
    """
    model_type = getattr(model_config(model), "model_type", None)
    if model_type not in _ADAPTERS:
        raise UnsupportedModelError(
            f"unsupported model type {model_type!r}: expected a Hugging Face classifier of type "
            f"{', '.join(supported_model_types())}"
        )
    expected = _CLASSES[model_type]
    if type(model).__name__ != expected:
        raise UnsupportedModelError(
            f"{type(model).__name__} is not supported: for model type {model_type!r} pass a {expected}"
        )
    return _ADAPTERS[model_type](model)
