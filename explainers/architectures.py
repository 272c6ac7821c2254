"""Where the parts of each supported Hugging Face architecture live.

The explainers never fork Hugging Face model files. Instead each supported ``config.model_type`` is described
once, here, by the stock modules that the relevance propagation needs: the six linear layers of every block,
whether the block normalises before (ViT) or after (BERT family) its residual additions, and the linear
layers of the classification head that read the first ([CLS] / class) token.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass
from typing import Any, Literal

from torch import nn

from .errors import UnsupportedModelError
from .heads import head_type, pooled_position
from .support import family, supported_model_types

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
    """A supported model, described by references to its own modules.

    Every family has the fields that the attention-based and saliency methods read (the number of attention calls
    and heads, the input embeddings, the pooled position, the head kind). The block structure that Chefer et al.'s
    relevance needs (``blocks``, ``head``, ``head_paths``, ``norm_first``) is described only for the families that
    support it, and is empty elsewhere.

    Attributes:
        model_type: ``config.model_type``.
        kind: ``encoder``, ``decoder`` or ``vision`` (see :mod:`explainers.support`).
        task: ``sequence_classification``, ``token_classification`` or ``causal_lm`` (:data:`explainers.TASKS`):
            which entry point explains the model.
        modality: ``text`` (scores per token) or ``image`` (scores per patch).
        num_layers: attention calls per forward (one per layer; ALBERT calls its shared layer this many times).
        num_heads: attention heads per call.
        input_embeddings: the module whose output is the per-token / per-patch input embedding
            (used by ``grad_x_input`` and ``integrated_gradients``).
        input_keys: keys the model accepts in ``inputs``; ``required_keys`` must be present.
        grid: for images, ``(grid_h, grid_w)`` patches of the configured image size; ``None`` for text (a model
            that interpolates its position embeddings, such as DINOv2, is explained on the grid of the input it
            gets: see ``patch``).
        patch: for images, ``(patch_h, patch_w)`` pixels per patch; ``None`` for text.
        prefix_tokens: tokens before the patches for images (class, distillation); 0 for text.
        pooled: where the head reads (:func:`explainers.heads.pooled_position`).
        head_type: ``single_label``, ``multi_label`` or ``regression`` (:func:`explainers.heads.head_type`).
        padding: padding sides accepted for text.
        norm_first: True for pre-LayerNorm blocks (ViT), False for post-LayerNorm blocks (BERT family).
        blocks: for relevance, the encoder blocks in call order (ALBERT repeats its shared block), input side first.
        head: for relevance, the linear layers of the classification head(s) in forward order (activations between
            them are treated as identity by LRP, as in Chefer et al.'s code).
        head_paths: for relevance, per head ``(token, number of linears in head)``: DeiT with a teacher has two
            heads (class token, distillation token), whose logits the model averages.
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

    @property
    def has_blocks(self) -> bool:
        """Whether the block structure for relevance is described."""
        return bool(self.blocks)


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

TEXT_PAIR_KEYS = frozenset({"input_ids", "attention_mask", "token_type_ids"})
TEXT_SINGLE_KEYS = frozenset({"input_ids", "attention_mask"})


@dataclass(frozen=True)
class _Lrp:
    """The block structure relevance reads."""

    blocks: tuple[Block, ...]
    head: tuple[nn.Linear, ...]
    head_paths: tuple[tuple[int, int], ...]
    norm_first: bool


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


def _lrp(model: Any) -> _Lrp | None:
    """The block structure of the families that support relevance (``None`` for the others)."""
    model_type = model.config.model_type
    if model_type == "bert":
        base = model.bert
        return _Lrp(
            _blocks(base.encoder.layer, _BERT_LAYER),
            _linear_head(base.pooler.dense, model.classifier),
            ((0, 2),),
            False,
        )
    if model_type in ("roberta", "xlm-roberta"):
        base = model.roberta
        head = _linear_head(model.classifier.dense, model.classifier.out_proj)
        return _Lrp(_blocks(base.encoder.layer, _BERT_LAYER), head, ((0, 2),), False)
    if model_type == "electra":
        base = model.electra
        head = _linear_head(model.classifier.dense, model.classifier.out_proj)
        return _Lrp(_blocks(base.encoder.layer, _BERT_LAYER), head, ((0, 2),), False)
    if model_type == "albert":
        base = model.albert
        return _Lrp(_albert_blocks(base), _linear_head(base.pooler, model.classifier), ((0, 2),), False)
    if model_type == "distilbert":
        base = model.distilbert
        head = _linear_head(model.pre_classifier, model.classifier)
        return _Lrp(_blocks(base.transformer.layer, _DISTILBERT_LAYER), head, ((0, 2),), False)
    if model_type == "vit":
        base = model.vit
        layers = base.layers if hasattr(base, "layers") else base.encoder.layer
        return _Lrp(_blocks(layers, _VIT_LAYER), _linear_head(model.classifier), ((0, 1),), True)
    if model_type == "deit":
        base = model.deit
        layers = base.layers if hasattr(base, "layers") else base.encoder.layer
        if hasattr(model, "distillation_classifier"):
            head = _linear_head(model.cls_classifier, model.distillation_classifier)
            return _Lrp(_blocks(layers, _VIT_LAYER), head, ((0, 1), (1, 1)), True)
        return _Lrp(_blocks(layers, _VIT_LAYER), _linear_head(model.classifier), ((0, 1),), True)
    return None


def _token_lrp(model: Any) -> _Lrp | None:
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
    return _Lrp(blocks, _linear_head(model.classifier), (), False)


def model_config(model: nn.Module) -> Any:
    """The Hugging Face ``config`` of ``model`` (``None`` if it has none)."""
    return getattr(model, "config", None)


def _prefix_tokens(model: Any) -> int:
    if model.config.model_type == "deit":
        return 2
    return 1


def describe(model: nn.Module) -> Architecture:
    """Describe ``model`` by references to its own modules.

    Raises:
        UnsupportedModelError: if the model is not one of the supported classifier classes.
    """
    config = model_config(model)
    model_type = getattr(config, "model_type", None)
    known = family(model_type) if isinstance(model_type, str) else None
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
    if "relevance" not in known.refused and task == "sequence_classification":
        lrp = _lrp(model)
    elif "relevance" not in known.refused and task == "token_classification":
        lrp = _token_lrp(model)
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
        keys = TEXT_SINGLE_KEYS if model_type in _SINGLE_SEGMENT else TEXT_PAIR_KEYS
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
        prefix_tokens=_prefix_tokens(model) if modality == "image" else 0,
        pooled=pooled_position(model),
        head_type=head_type(model),
        padding=known.padding,
        norm_first=False if lrp is None else lrp.norm_first,
        blocks=() if lrp is None else lrp.blocks,
        head=() if lrp is None else lrp.head,
        head_paths=() if lrp is None else lrp.head_paths,
        patch=patch,
    )


def _attention_calls(config: Any) -> int:
    """Attention calls per forward: one per layer; ALBERT runs ``inner_group_num`` shared layers per layer."""
    return int(config.num_hidden_layers) * int(getattr(config, "inner_group_num", 1) or 1)


_SINGLE_SEGMENT = frozenset({"distilbert", "modernbert", "llama", "qwen2", "qwen3", "mistral", "gemma2", "gpt2"})
