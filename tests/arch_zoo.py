"""Tiny random classifiers of every family in the support registry, built from configs (no downloads), float64.

Each :class:`Variant` names the registry family it exercises; ``tests/test_architectures.py`` checks that the
variants cover every family of :data:`explainers.FAMILIES`, so a family added to the registry without a tiny model
fails the suite.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import transformers
from torch import Tensor
from transformers import (
    AlbertConfig,
    AlbertForSequenceClassification,
    BertConfig,
    BertForSequenceClassification,
    DebertaV2Config,
    DebertaV2ForSequenceClassification,
    DeiTConfig,
    DeiTForImageClassification,
    DeiTForImageClassificationWithTeacher,
    Dinov2Config,
    Dinov2ForImageClassification,
    DistilBertConfig,
    DistilBertForSequenceClassification,
    ElectraConfig,
    ElectraForSequenceClassification,
    Gemma2Config,
    Gemma2ForSequenceClassification,
    GPT2Config,
    GPT2ForSequenceClassification,
    LlamaConfig,
    LlamaForSequenceClassification,
    MistralConfig,
    MistralForSequenceClassification,
    ModernBertConfig,
    ModernBertForSequenceClassification,
    Qwen2Config,
    Qwen2ForSequenceClassification,
    Qwen3Config,
    Qwen3ForSequenceClassification,
    RobertaConfig,
    RobertaForSequenceClassification,
    ViTConfig,
    ViTForImageClassification,
    XLMRobertaConfig,
    XLMRobertaForSequenceClassification,
)

from tests.weights import perturb

VOCAB = 60
NUM_LABELS = 3
PAD = 1
LENGTHS = (7, 3, 9, 5)


_TEXT: dict[str, Any] = {"vocab_size": VOCAB, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4}
_DECODER: dict[str, Any] = {
    **_TEXT,
    "intermediate_size": 48,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
    "pad_token_id": PAD,
    "bos_token_id": 0,
    "eos_token_id": 2,
    "head_dim": 8,
}


_BUCKETS: dict[str, Any] = {"position_buckets": 8}


def _configs() -> dict[str, Callable[[], Any]]:
    return {
        "bert": lambda: BertConfig(**_TEXT, intermediate_size=48, max_position_embeddings=64),
        "roberta": lambda: RobertaConfig(
            **_TEXT, intermediate_size=48, max_position_embeddings=72, pad_token_id=PAD, bos_token_id=0, eos_token_id=2
        ),
        "xlm-roberta": lambda: XLMRobertaConfig(
            **_TEXT, intermediate_size=48, max_position_embeddings=72, pad_token_id=PAD, bos_token_id=0, eos_token_id=2
        ),
        "distilbert": lambda: DistilBertConfig(
            vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4, hidden_dim=48, max_position_embeddings=64
        ),
        "electra": lambda: ElectraConfig(**_TEXT, embedding_size=16, intermediate_size=48, max_position_embeddings=64),
        "albert": lambda: AlbertConfig(
            **_TEXT, embedding_size=16, intermediate_size=48, max_position_embeddings=64, num_hidden_groups=1
        ),
        "modernbert": lambda: ModernBertConfig(
            **{**_TEXT, "num_hidden_layers": 3},
            intermediate_size=48,
            max_position_embeddings=64,
            pad_token_id=PAD,
            layer_types=["full_attention", "sliding_attention", "full_attention"],
            local_attention=4,
            classifier_pooling="cls",
        ),
        "modernbert-mean": lambda: ModernBertConfig(
            **{**_TEXT, "num_hidden_layers": 3},
            intermediate_size=48,
            max_position_embeddings=64,
            pad_token_id=PAD,
            layer_types=["full_attention", "sliding_attention", "full_attention"],
            local_attention=4,
            classifier_pooling="mean",
        ),
        "deberta-v2": lambda: DebertaV2Config(
            **_TEXT,
            intermediate_size=48,
            max_position_embeddings=64,
            relative_attention=True,
            **_BUCKETS,
            pos_att_type=["p2c", "c2p"],
            type_vocab_size=2,
            pad_token_id=0,
        ),
        "llama": lambda: LlamaConfig(**_DECODER),
        "qwen2": lambda: Qwen2Config(**{key: value for key, value in _DECODER.items() if key != "head_dim"}),
        "qwen3": lambda: Qwen3Config(**_DECODER),
        "mistral": lambda: MistralConfig(**_DECODER, sliding_window=4),
        "gemma2": lambda: Gemma2Config(**_DECODER, sliding_window=4, query_pre_attn_scalar=8),
        "gpt2": lambda: GPT2Config(
            vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64, pad_token_id=PAD, bos_token_id=0
        ),
        "vit": lambda: ViTConfig(
            image_size=16,
            patch_size=4,
            num_channels=3,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=48,
        ),
        "deit": lambda: DeiTConfig(
            image_size=16,
            patch_size=4,
            num_channels=3,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=48,
        ),
        "dinov2": lambda: Dinov2Config(
            image_size=16,
            patch_size=4,
            num_channels=3,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            mlp_ratio=2,
            layerscale_value=0.5,
        ),
    }


_CLASSES: dict[str, Any] = {
    "bert": BertForSequenceClassification,
    "roberta": RobertaForSequenceClassification,
    "xlm-roberta": XLMRobertaForSequenceClassification,
    "distilbert": DistilBertForSequenceClassification,
    "electra": ElectraForSequenceClassification,
    "albert": AlbertForSequenceClassification,
    "modernbert": ModernBertForSequenceClassification,
    "modernbert-mean": ModernBertForSequenceClassification,
    "deberta-v2": DebertaV2ForSequenceClassification,
    "llama": LlamaForSequenceClassification,
    "qwen2": Qwen2ForSequenceClassification,
    "qwen3": Qwen3ForSequenceClassification,
    "mistral": MistralForSequenceClassification,
    "gemma2": Gemma2ForSequenceClassification,
    "gpt2": GPT2ForSequenceClassification,
    "vit": ViTForImageClassification,
    "deit": DeiTForImageClassification,
    "deit-teacher": DeiTForImageClassificationWithTeacher,
    "dinov2": Dinov2ForImageClassification,
}


@dataclass(frozen=True)
class Variant:
    """A tiny model of one registry family.

    Attributes:
        name: test id.
        model_type: the registry family.
        pooled: the position its head reads (what :func:`explainers.pooled_position` must say).
        config_key: which config of :func:`_configs` it builds.
        overrides: config attributes set after construction (problem type, labels).
    """

    name: str
    model_type: str
    pooled: str
    config_key: str = ""
    overrides: dict[str, Any] = field(default_factory=dict)
    attn_implementation: str = "eager"

    @property
    def is_text(self) -> bool:
        return self.model_type not in ("vit", "deit", "dinov2")

    @property
    def is_decoder(self) -> bool:
        return self.pooled == "last"

    def build(self, seed: int = 0) -> Any:
        """The model in float64, eval mode, with ``attn_implementation`` set."""
        config = _configs()[self.config_key or self.name]()
        config.num_labels = NUM_LABELS
        for key, value in self.overrides.items():
            setattr(config, key, value)
        config._attn_implementation = self.attn_implementation
        cls = _CLASSES[self.name if self.name in _CLASSES else self.config_key]
        model = perturb(cls(config), 17 + seed).double().eval()
        return model


VARIANTS: list[Variant] = [
    Variant("bert", "bert", "first"),
    Variant("roberta", "roberta", "first"),
    Variant("xlm-roberta", "xlm-roberta", "first"),
    Variant("distilbert", "distilbert", "first"),
    Variant("electra", "electra", "first"),
    Variant("albert", "albert", "first"),
    Variant("modernbert", "modernbert", "first"),
    Variant("modernbert-mean", "modernbert", "mean"),
    Variant("deberta-v2", "deberta-v2", "first"),
    Variant("llama", "llama", "last"),
    Variant("qwen2", "qwen2", "last"),
    Variant("qwen3", "qwen3", "last"),
    Variant("mistral", "mistral", "last"),
    Variant("gemma2", "gemma2", "last"),
    Variant("gpt2", "gpt2", "last"),
    Variant("vit", "vit", "first"),
    Variant("deit", "deit", "first"),
    Variant("deit-teacher", "deit", "class_distillation", config_key="deit"),
    Variant("dinov2", "dinov2", "class_patch_mean"),
]


FLOAT32_SOFTMAX = frozenset({"modernbert", "llama", "qwen2", "qwen3", "mistral", "gemma2"})
"""Families whose eager attention runs its softmax in float32 even in a float64 model. A row then gets its
probabilities summed over a different number of (masked) terms in a padded batch than alone, and, depending on the
CPU's vectorised float32 reductions, they differ by float32 rounding: ~1e-7 relative in logits and map scores
(measured on an AMD EPYC host), ~1e-6 in gradients through them."""


def alone_tolerance(model_type: str, gradients: bool = False) -> float:
    """Worst difference (relative to the largest value) between a row explained in a padded batch and alone: float64
    rounding, or float32 rounding where the softmax runs in float32 (:data:`FLOAT32_SOFTMAX`)."""
    if model_type not in FLOAT32_SOFTMAX:
        return 1e-9
    return 1e-5 if gradients else 1e-6


TOKEN_LEVEL_FAMILIES: dict[str, tuple[str, ...]] = {
    "token_classification": (
        "bert",
        "roberta",
        "xlm-roberta",
        "distilbert",
        "electra",
        "albert",
        "modernbert",
        "deberta-v2",
    ),
    "causal_lm": ("llama", "qwen2", "qwen3", "mistral", "gemma2", "gpt2"),
}
"""The families whose token-level classes the tests build (the encoders' token classifiers, the decoders' LMs)."""


def build_token_level(model_type: str, task: str, seed: int = 0, num_labels: int = NUM_LABELS) -> Any:
    """A tiny float64 model of ``model_type``'s class for ``task`` (``token_classification``: a token classifier
    with ``num_labels`` labels; ``causal_lm``: the family's causal LM over the :data:`VOCAB` tokens), eval mode,
    eager attention, the same perturbed weights as the classifiers of :data:`VARIANTS`."""
    from explainers import FAMILIES

    family = FAMILIES[model_type]
    names = family.token_classes if task == "token_classification" else family.causal_lm_classes
    config = _configs()[model_type]()
    config.num_labels = num_labels
    config._attn_implementation = "eager"
    cls = getattr(transformers, names[0])
    return perturb(cls(config), 17 + seed).double().eval()


def text_batch(model: Any, lengths: tuple[int, ...] = LENGTHS, side: str = "right", seed: int = 0) -> dict[str, Tensor]:
    """Padded random token ids (never the pad id inside a row) with the given real lengths, padded on ``side``."""
    generator = torch.Generator().manual_seed(seed)
    pad = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    width = max(lengths)
    ids = torch.full((len(lengths), width), pad, dtype=torch.long)
    mask = torch.zeros((len(lengths), width), dtype=torch.long)
    for row, length in enumerate(lengths):
        tokens = torch.randint(3, VOCAB, (length,), generator=generator)
        span = slice(0, length) if side == "right" else slice(width - length, width)
        ids[row, span] = tokens
        mask[row, span] = 1
    batch = {"input_ids": ids, "attention_mask": mask}
    return batch


def pair_batch(model: Any, seed: int = 0) -> dict[str, Tensor]:
    """Right-padded sentence pairs with ``token_type_ids`` 0 for the first segment and 1 for the second."""
    batch = text_batch(model, seed=seed)
    types = torch.zeros_like(batch["input_ids"])
    for row, length in enumerate(LENGTHS):
        types[row, length // 2 : length] = 1
    return {**batch, "token_type_ids": types}


def image_batch(model: Any, size: int = 3, seed: int = 0) -> dict[str, Tensor]:
    """Random pixel values of the model's image size."""
    generator = torch.Generator().manual_seed(seed)
    side = int(model.config.image_size)
    return {"pixel_values": torch.randn((size, 3, side, side), generator=generator, dtype=torch.float64)}


def batch_for(variant: Variant, model: Any, side: str = "right") -> dict[str, Tensor]:
    return text_batch(model, side=side) if variant.is_text else image_batch(model)


def row_alone(batch: dict[str, Tensor], row: int) -> dict[str, Tensor]:
    """Row ``row`` of a batch alone, padding removed (on whichever side it was)."""
    if "pixel_values" in batch:
        return {"pixel_values": batch["pixel_values"][row : row + 1]}
    keep = batch["attention_mask"][row].bool()
    return {key: value[row : row + 1][:, keep] for key, value in batch.items()}
