"""Where each family keeps the linear layers Chefer et al.'s relevance propagation reads.

The explainers never fork Hugging Face model files: each family that supports ``relevance`` is described here by the
dotted paths of the stock modules LRP reads in one encoder layer (the six linear layers of every block), by the
linear layers of its classification head, and by whether its blocks normalise before (ViT) or after (BERT family)
their residual additions. A family not described here gets no block structure (its ``relevance`` is refused in
:mod:`explainers.architectures.support`).
"""

from __future__ import annotations

from dataclasses import astuple, dataclass
from typing import Any

from torch import nn

from ..errors import UnsupportedModelError


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


_BERT_LAYER = LayerPaths(
    attention="attention.self",
    query="attention.self.query",
    key="attention.self.key",
    value="attention.self.value",
    attention_output="attention.output.dense",
    ffn_in="intermediate.dense",
    ffn_out="output.dense",
)

_DISTILBERT_LAYER = LayerPaths(
    "attention", "attention.q_lin", "attention.k_lin", "attention.v_lin", "attention.out_lin", "ffn.lin1", "ffn.lin2"
)

_ALBERT_LAYER = LayerPaths(
    "attention", "attention.query", "attention.key", "attention.value", "attention.dense", "ffn", "ffn_output"
)

_VIT_LAYER = LayerPaths(
    "attention", "attention.q_proj", "attention.k_proj", "attention.v_proj", "attention.o_proj", "mlp.fc1", "mlp.fc2"
)


@dataclass(frozen=True)
class BlockStructure:
    """The block structure Chefer et al.'s relevance reads (the fields are those of
    :class:`~explainers.architectures.description.Architecture`)."""

    blocks: tuple[Block, ...]
    head: tuple[nn.Linear, ...]
    head_paths: tuple[tuple[int, int], ...]
    norm_first: bool
    input_positions: nn.Parameter | None = None


def _albert_blocks(base: Any) -> tuple[Block, ...]:
    config = base.config
    groups = base.encoder.albert_layer_groups
    blocks: list[Block] = []
    for index in range(config.num_hidden_layers):
        group = groups[int(index / (config.num_hidden_layers / config.num_hidden_groups))]
        blocks += [_ALBERT_LAYER.block(layer) for layer in group.albert_layers]
    return tuple(blocks)


def _linear_head(*modules: Any) -> tuple[nn.Linear, ...]:
    if not all(isinstance(module, nn.Linear) for module in modules):
        raise UnsupportedModelError("this classifier has no linear classification head (num_labels must be > 0)")
    return tuple(modules)


def sequence_blocks(model: Any) -> BlockStructure | None:
    """The block structure of the families that support relevance (``None`` for the others)."""
    model_type = model.config.model_type
    if model_type == "bert":
        base = model.bert
        return BlockStructure(
            _blocks(base.encoder.layer, _BERT_LAYER),
            _linear_head(base.pooler.dense, model.classifier),
            ((0, 2),),
            False,
        )
    if model_type in ("roberta", "xlm-roberta"):
        base = model.roberta
        head = _linear_head(model.classifier.dense, model.classifier.out_proj)
        return BlockStructure(_blocks(base.encoder.layer, _BERT_LAYER), head, ((0, 2),), False)
    if model_type == "electra":
        base = model.electra
        head = _linear_head(model.classifier.dense, model.classifier.out_proj)
        return BlockStructure(_blocks(base.encoder.layer, _BERT_LAYER), head, ((0, 2),), False)
    if model_type == "albert":
        base = model.albert
        return BlockStructure(_albert_blocks(base), _linear_head(base.pooler, model.classifier), ((0, 2),), False)
    if model_type == "distilbert":
        base = model.distilbert
        head = _linear_head(model.pre_classifier, model.classifier)
        return BlockStructure(_blocks(base.transformer.layer, _DISTILBERT_LAYER), head, ((0, 2),), False)
    if model_type == "vit":
        base = model.vit
        layers = base.layers if hasattr(base, "layers") else base.encoder.layer
        head = _linear_head(model.classifier)
        return BlockStructure(_blocks(layers, _VIT_LAYER), head, ((0, 1),), True, base.embeddings.position_embeddings)
    if model_type == "deit":
        base = model.deit
        layers = base.layers if hasattr(base, "layers") else base.encoder.layer
        if hasattr(model, "distillation_classifier"):
            head = _linear_head(model.cls_classifier, model.distillation_classifier)
            paths: tuple[tuple[int, int], ...] = ((0, 1), (1, 1))
        else:
            head, paths = _linear_head(model.classifier), ((0, 1),)
        return BlockStructure(_blocks(layers, _VIT_LAYER), head, paths, True, base.embeddings.position_embeddings)
    return None


def token_blocks(model: Any) -> BlockStructure | None:
    """The block structure of a token classifier: its family's blocks, and the one linear head every token reads
    (``head_paths`` empty: the head is not pooled)."""
    model_type = model.config.model_type
    base = getattr(model, {"xlm-roberta": "roberta"}.get(model_type, model_type), None)
    if base is None:
        return None
    if model_type == "albert":
        blocks = _albert_blocks(base)
    elif model_type == "distilbert":
        blocks = _blocks(base.transformer.layer, _DISTILBERT_LAYER)
    elif model_type in ("bert", "roberta", "xlm-roberta", "electra"):
        blocks = _blocks(base.encoder.layer, _BERT_LAYER)
    else:
        return None
    return BlockStructure(blocks, _linear_head(model.classifier), (), False)
