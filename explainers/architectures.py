"""Where the parts of each supported Hugging Face architecture live.

The explainers never fork Hugging Face model files. Instead each supported ``config.model_type`` is described
once, here, by the stock modules that the relevance propagation needs: the six linear layers of every block,
whether the block normalises before (ViT) or after (BERT family) its residual additions, and the linear
layers of the classification head that read the first ([CLS] / class) token.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import astuple, dataclass
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


def _attribute(root: Any, path: str) -> Any:
    """``root.a.b.c`` for ``path="a.b.c"``."""
    for name in path.split("."):
        root = getattr(root, name)
    return root


@dataclass(frozen=True)
class LayerPaths:
    """Dotted paths, relative to an encoder layer, of the modules a :class:`Block` references (in field order)."""

    attention: str
    query: str
    key: str
    value: str
    attention_output: str
    ffn_in: str
    ffn_out: str

    def block(self, layer: nn.Module) -> Block:
        """The :class:`Block` of ``layer``."""
        return Block(layer, *(_attribute(layer, path) for path in astuple(self)))


def _blocks(layers: Any, paths: LayerPaths) -> tuple[Block, ...]:
    return tuple(paths.block(layer) for layer in layers)


def _text(
    model: Any, base: Any, blocks: tuple[Block, ...], head: tuple[nn.Linear, ...], keys: frozenset[str]
) -> Architecture:
    config = model.config
    return Architecture(
        model_type=config.model_type,
        modality="text",
        norm_first=False,
        blocks=blocks,
        head=head,
        num_heads=config.num_attention_heads,
        input_embeddings=base.embeddings.word_embeddings,
        input_keys=keys,
        required_keys=frozenset({"input_ids"}),
        grid=None,
    )


_BERT_LAYER = LayerPaths(
    attention="attention.self",
    query="attention.self.query",
    key="attention.self.key",
    value="attention.self.value",
    attention_output="attention.output.dense",
    ffn_in="intermediate.dense",
    ffn_out="output.dense",
)


def _bert(model: Any) -> Architecture:
    base = model.bert
    head = (base.pooler.dense, model.classifier)
    return _text(model, base, _blocks(base.encoder.layer, _BERT_LAYER), head, TEXT_KEYS)


def _roberta(model: Any) -> Architecture:
    base = model.roberta
    head = (model.classifier.dense, model.classifier.out_proj)
    return _text(model, base, _blocks(base.encoder.layer, _BERT_LAYER), head, TEXT_KEYS)


def _distilbert(model: Any) -> Architecture:
    base = model.distilbert
    blocks = _blocks(
        base.transformer.layer,
        LayerPaths(
            "attention",
            "attention.q_lin",
            "attention.k_lin",
            "attention.v_lin",
            "attention.out_lin",
            "ffn.lin1",
            "ffn.lin2",
        ),
    )
    head = (model.pre_classifier, model.classifier)
    return _text(model, base, blocks, head, frozenset({"input_ids", "attention_mask"}))


def _vit(model: Any) -> Architecture:
    base = model.vit
    blocks = _blocks(
        base.layers if hasattr(base, "layers") else base.encoder.layer,
        LayerPaths(
            "attention",
            "attention.q_proj",
            "attention.k_proj",
            "attention.v_proj",
            "attention.o_proj",
            "mlp.fc1",
            "mlp.fc2",
        ),
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
