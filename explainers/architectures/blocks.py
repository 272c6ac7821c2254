"""The stock modules Chefer et al.'s relevance propagation reads, found in a model by its family's description.

The explainers never fork Hugging Face model files: each family that supports ``relevance`` says in its record
(:attr:`~explainers.architectures.families.Family.lrp`, an :class:`~explainers.architectures.families.LrpBlocks`)
the dotted paths of the stock modules LRP reads in one layer (the six linear layers of every block), the linear
layers of its classification heads, and whether its blocks normalise before (ViT) or after (BERT family) their
residual additions. This module resolves those paths against a model's own modules. A family without a description
gets no block structure (its ``relevance`` is refused in its record).
"""

from __future__ import annotations

from dataclasses import astuple, dataclass
from typing import Any

from torch import nn

from ..errors import UnsupportedModelError
from .families import LayerPaths, LrpBlocks, model_family


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


def _has(root: Any, path: str) -> bool:
    """Whether ``root.a.b.c`` exists for ``path="a.b.c"``."""
    for name in path.split("."):
        if not hasattr(root, name):
            return False
        root = getattr(root, name)
    return True


def _block(layer: nn.Module, paths: LayerPaths) -> Block:
    """The :class:`Block` of ``layer``, its modules found at ``paths``."""
    return Block(layer, *(_attribute(layer, path) for path in astuple(paths)))


@dataclass(frozen=True)
class BlockStructure:
    """The block structure Chefer et al.'s relevance reads (the fields are those of
    :class:`~explainers.architectures.description.Architecture`)."""

    blocks: tuple[Block, ...]
    head: tuple[nn.Linear, ...]
    head_paths: tuple[tuple[int, int], ...]
    norm_first: bool
    input_positions: nn.Parameter | None = None


def _shared_group_blocks(base: Any, lrp: LrpBlocks) -> tuple[Block, ...]:
    """ALBERT's blocks in call order: ``num_hidden_layers`` calls over ``num_hidden_groups`` shared groups."""
    config = base.config
    groups = _attribute(base, lrp.layers[0])
    blocks: list[Block] = []
    for index in range(config.num_hidden_layers):
        group = groups[int(index / (config.num_hidden_layers / config.num_hidden_groups))]
        blocks += [_block(layer, lrp.layer) for layer in group.albert_layers]
    return tuple(blocks)


def _layer_blocks(base: Any, lrp: LrpBlocks) -> tuple[Block, ...]:
    """The blocks of the backbone ``base`` in call order (input side first)."""
    if lrp.shared_groups:
        return _shared_group_blocks(base, lrp)
    path = next((path for path in lrp.layers[:-1] if _has(base, path)), lrp.layers[-1])
    return tuple(_block(layer, lrp.layer) for layer in _attribute(base, path))


def _linear_head(*modules: Any) -> tuple[nn.Linear, ...]:
    if not all(isinstance(module, nn.Linear) for module in modules):
        raise UnsupportedModelError("this classifier has no linear classification head (num_labels must be > 0)")
    return tuple(modules)


def sequence_blocks(model: Any) -> BlockStructure | None:
    """The block structure of a sequence classifier of a family that supports relevance (``None`` for the others).

    Raises:
        UnsupportedModelError: if the classifier's head is not linear (``num_labels`` 0).
    """
    known = model_family(model)
    lrp = None if known is None else known.lrp
    if lrp is None:
        return None
    base = _attribute(model, lrp.base)
    blocks = _layer_blocks(base, lrp)
    heads = lrp.heads_of(type(model).__name__)
    head = _linear_head(*(_attribute(model, path) for read in heads for path in read.linears))
    paths = tuple((read.token, len(read.linears)) for read in heads)
    positions = None if lrp.position_embeddings is None else _attribute(base, lrp.position_embeddings)
    return BlockStructure(blocks, head, paths, lrp.norm_first, positions)


def token_blocks(model: Any) -> BlockStructure | None:
    """The block structure of a token classifier: its family's blocks, and the one linear head every token reads
    (``head_paths`` empty: the head is not pooled); ``None`` for the families whose token classifiers LRP does not
    describe."""
    known = model_family(model)
    lrp = None if known is None else known.lrp
    if lrp is None or lrp.token_head is None:
        return None
    base = getattr(model, lrp.base, None)
    if base is None:
        return None
    return BlockStructure(_layer_blocks(base, lrp), _linear_head(_attribute(model, lrp.token_head)), (), lrp.norm_first)
