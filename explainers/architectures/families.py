"""The architecture families the explainers know: one :class:`Family` record per ``config.model_type``.

A family's facts are the fields of its record in :data:`FAMILIES`, and nothing else in the library keeps a list of
model types:

- its kind (:data:`Kind`) and the classes accepted for each task (:data:`TaskName`);
- where its sequence classifiers read the sequence (:class:`Pooling`, read by
  :func:`explainers.architectures.heads.pooled_position`);
- whether its text models take ``token_type_ids`` (``segments``, read by :func:`explainers.describe`), and the
  tokens before the patches of its image models (``prefix_tokens``);
- the padding sides accepted for text;
- its blocks as Chefer et al.'s LRP reads them (:class:`LrpBlocks`, resolved against a model's modules by
  :mod:`explainers.architectures.blocks`), or ``None`` when LRP has no rule for them;
- the methods it refuses, with the reason (read by :mod:`explainers.architectures.support`).

:func:`model_family` looks a model's family up by its ``config.model_type``. Adding an architecture is adding its
record here and its tiny test configs (``tests/arch_zoo.py``; a decoder's causal LM also ``tests/causal_zoo.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Kind = Literal["encoder", "decoder", "vision"]
TaskName = Literal["sequence_classification", "token_classification", "causal_lm"]
Pooled = Literal["first", "last", "mean", "class_distillation", "class_patch_mean", "each"]

#: The methods that run Chefer et al.'s LRP rules through the blocks (:mod:`explainers.rules.lrp`): a family without
#: a rule for its blocks refuses them all, for the same reason.
LRP_METHODS = ("relevance", "lrp", "partial_lrp")


def _lrp_refused(reason: str) -> dict[str, str]:
    """A family's refusals of every method of :data:`LRP_METHODS`, for ``reason``."""
    return dict.fromkeys(LRP_METHODS, reason)


_LRP_DECODER = (
    "Chefer et al.'s LRP rules cover post-LayerNorm encoders and ViT blocks; this decoder's RMSNorm, gated MLP "
    "products and rotary embeddings have no rule here (use attnlrp, gae, rollout or the saliency methods)"
)


@dataclass(frozen=True)
class Pooling:
    """Where a family's sequence classifiers read the sequence (see :mod:`explainers.architectures.heads`).

    Attributes:
        position: the position read (one of :data:`explainers.POOLED_POSITIONS` but ``each``).
        by_class: class name → the position its head reads, for the classes that read elsewhere (DeiT with a
            teacher averages the class and distillation heads).
        option: the config attribute that chooses the position (ModernBERT's ``classifier_pooling``), or ``None``.
        by_option: a value of ``config.<option>`` → the position it chooses; any other value reads ``position``.
    """

    position: Pooled
    by_class: Mapping[str, Pooled] = field(default_factory=dict)
    option: str | None = None
    by_option: Mapping[str, Pooled] = field(default_factory=dict)

    def pooled(self, class_name: str, config: Any) -> Pooled:
        """The position read by the sequence classifier class ``class_name`` with ``config``."""
        if class_name in self.by_class:
            return self.by_class[class_name]
        chosen = None if self.option is None else getattr(config, self.option, None)
        if isinstance(chosen, str):
            return self.by_option.get(chosen, self.position)
        return self.position


@dataclass(frozen=True)
class LayerPaths:
    """Dotted paths, relative to one layer, of the modules Chefer et al.'s LRP reads in it (the fields of
    :class:`~explainers.architectures.blocks.Block` after ``layer``, in order)."""

    attention: str
    query: str
    key: str
    value: str
    attention_output: str
    ffn_in: str
    ffn_out: str


@dataclass(frozen=True)
class HeadRead:
    """One classification head as LRP reads it.

    Attributes:
        token: the position the head reads.
        linears: dotted paths, relative to the model, of the head's linear layers in forward order (activations
            between them are treated as identity by LRP, as in Chefer et al.'s code).
    """

    token: int
    linears: tuple[str, ...]


@dataclass(frozen=True)
class LrpBlocks:
    """A family's blocks and heads as Chefer et al.'s LRP reads them.

    Attributes:
        base: the model's attribute holding the backbone (``bert``).
        layers: dotted paths, relative to the backbone, of its list of layers; the first one the backbone has is
            read (newer transformers name the ViT layers ``layers``, older ones ``encoder.layer``).
        layer: the modules read in one layer.
        heads: the sequence classifier's heads, in the order the model adds their logits.
        heads_by_class: class name → its heads, for the classes whose heads differ (DeiT with a teacher: a class
            head and a distillation head, whose logits the model averages).
        norm_first: True for pre-LayerNorm blocks (ViT), False for post-LayerNorm blocks (BERT family).
        shared_groups: ALBERT's layout: ``layers`` names the shared layer groups, called ``config.num_hidden_layers``
            times over ``config.num_hidden_groups`` groups of ``albert_layers``.
        position_embeddings: the dotted path, relative to the backbone, of the position embeddings added to the
            prefix and patch tokens before the first block (images); ``None`` for text.
        token_head: the dotted path of the token classifier's one linear head, every token read by it; ``None`` when
            the family's token classifiers are not described.
    """

    base: str
    layers: tuple[str, ...]
    layer: LayerPaths
    heads: tuple[HeadRead, ...]
    heads_by_class: Mapping[str, tuple[HeadRead, ...]] = field(default_factory=dict)
    norm_first: bool = False
    shared_groups: bool = False
    position_embeddings: str | None = None
    token_head: str | None = None

    def heads_of(self, class_name: str) -> tuple[HeadRead, ...]:
        """The heads of the sequence classifier class ``class_name``."""
        return self.heads_by_class.get(class_name, self.heads)


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

#: The classification head of RoBERTa, XLM-RoBERTa and ELECTRA: a dense layer and a projection, on the first token.
_DENSE_PROJECTION_HEAD = (HeadRead(0, ("classifier.dense", "classifier.out_proj")),)
#: The layers of a ViT / DeiT backbone, in the newer and the older transformers.
_VIT_LAYERS = ("layers", "encoder.layer")


def _roberta_blocks(base: str) -> LrpBlocks:
    """The LRP description of a BERT-layout backbone ``base`` with the dense + projection head."""
    return LrpBlocks(base, ("encoder.layer",), _BERT_LAYER, _DENSE_PROJECTION_HEAD, token_head="classifier")


@dataclass(frozen=True)
class Family:
    """One supported architecture family.

    Attributes:
        model_type: ``config.model_type``.
        kind: ``encoder`` (text, bidirectional), ``decoder`` (text, causal) or ``vision``.
        classes: the sequence-classifier classes accepted (by class name).
        title: how the README names the family.
        padding: the padding sides accepted for text (``right``, ``left``).
        refused: method name → why it is refused on this family.
        token_classes: the token-classifier classes accepted (task ``token_classification``).
        causal_lm_classes: the causal language-model classes accepted (task ``causal_lm``).
        pooling: where its sequence classifiers read the sequence.
        segments: whether its text models take ``token_type_ids`` (sentence pairs as two segments); False for images.
        prefix_tokens: for images, the tokens before the patches (class, distillation); 0 for text.
        lrp: its blocks as Chefer et al.'s LRP reads them; ``None`` when LRP has no rule for them (then every method
            of :data:`LRP_METHODS` is in ``refused``).
    """

    model_type: str
    kind: Kind
    classes: tuple[str, ...]
    title: str
    padding: tuple[str, ...] = ("right",)
    refused: Mapping[str, str] = field(default_factory=dict)
    token_classes: tuple[str, ...] = ()
    causal_lm_classes: tuple[str, ...] = ()
    pooling: Pooling = Pooling("first")
    segments: bool = False
    prefix_tokens: int = 0
    lrp: LrpBlocks | None = None

    def task_of(self, class_name: str) -> TaskName | None:
        """The task of the model class named ``class_name`` in this family (``None`` if it is not accepted)."""
        if class_name in self.classes:
            return "sequence_classification"
        if class_name in self.token_classes:
            return "token_classification"
        if class_name in self.causal_lm_classes:
            return "causal_lm"
        return None

    @property
    def all_classes(self) -> tuple[str, ...]:
        """Every accepted class, of every task."""
        return self.classes + self.token_classes + self.causal_lm_classes


_LAST = Pooling("last")

FAMILIES: dict[str, Family] = {
    family.model_type: family
    for family in (
        Family(
            "bert",
            "encoder",
            ("BertForSequenceClassification",),
            "BERT",
            token_classes=("BertForTokenClassification",),
            segments=True,
            lrp=LrpBlocks(
                "bert",
                ("encoder.layer",),
                _BERT_LAYER,
                (HeadRead(0, ("bert.pooler.dense", "classifier")),),
                token_head="classifier",
            ),
        ),
        Family(
            "roberta",
            "encoder",
            ("RobertaForSequenceClassification",),
            "RoBERTa",
            token_classes=("RobertaForTokenClassification",),
            segments=True,
            lrp=_roberta_blocks("roberta"),
        ),
        Family(
            "xlm-roberta",
            "encoder",
            ("XLMRobertaForSequenceClassification",),
            "XLM-RoBERTa",
            token_classes=("XLMRobertaForTokenClassification",),
            segments=True,
            lrp=_roberta_blocks("roberta"),
        ),
        Family(
            "distilbert",
            "encoder",
            ("DistilBertForSequenceClassification",),
            "DistilBERT",
            token_classes=("DistilBertForTokenClassification",),
            lrp=LrpBlocks(
                "distilbert",
                ("transformer.layer",),
                _DISTILBERT_LAYER,
                (HeadRead(0, ("pre_classifier", "classifier")),),
                token_head="classifier",
            ),
        ),
        Family(
            "electra",
            "encoder",
            ("ElectraForSequenceClassification",),
            "ELECTRA",
            token_classes=("ElectraForTokenClassification",),
            segments=True,
            lrp=_roberta_blocks("electra"),
        ),
        Family(
            "albert",
            "encoder",
            ("AlbertForSequenceClassification",),
            "ALBERT (shared layers, recorded per call)",
            token_classes=("AlbertForTokenClassification",),
            segments=True,
            lrp=LrpBlocks(
                "albert",
                ("encoder.albert_layer_groups",),
                _ALBERT_LAYER,
                (HeadRead(0, ("albert.pooler", "classifier")),),
                shared_groups=True,
                token_head="classifier",
            ),
        ),
        Family(
            "modernbert",
            "encoder",
            ("ModernBertForSequenceClassification",),
            "ModernBERT (cls or mean pooling, sliding-window layers)",
            refused=_lrp_refused(
                "Chefer et al.'s LRP rules cover post-LayerNorm encoders; ModernBERT's pre-norm blocks "
                "with a gated GLU feed-forward and rotary embeddings have no rule here (use attnlrp, gae, rollout or "
                "the saliency methods)"
            ),
            token_classes=("ModernBertForTokenClassification",),
            pooling=Pooling("first", option="classifier_pooling", by_option={"mean": "mean"}),
        ),
        Family(
            "deberta-v2",
            "encoder",
            ("DebertaV2ForSequenceClassification",),
            "DeBERTa-v2 / v3",
            refused=_lrp_refused(
                "Chefer et al.'s LRP rules have no rule for DeBERTa's disentangled relative-position "
                "terms (content-to-position and position-to-content scores) (use attnlrp, gae, rollout or the saliency "
                "methods)"
            ),
            token_classes=("DebertaV2ForTokenClassification",),
            segments=True,
        ),
        Family(
            "llama",
            "decoder",
            ("LlamaForSequenceClassification",),
            "Llama (grouped-query attention)",
            ("left", "right"),
            _lrp_refused(_LRP_DECODER),
            causal_lm_classes=("LlamaForCausalLM",),
            pooling=_LAST,
        ),
        Family(
            "qwen2",
            "decoder",
            ("Qwen2ForSequenceClassification",),
            "Qwen2",
            ("left", "right"),
            _lrp_refused(_LRP_DECODER),
            causal_lm_classes=("Qwen2ForCausalLM",),
            pooling=_LAST,
        ),
        Family(
            "qwen3",
            "decoder",
            ("Qwen3ForSequenceClassification",),
            "Qwen3",
            ("left", "right"),
            _lrp_refused(_LRP_DECODER),
            causal_lm_classes=("Qwen3ForCausalLM",),
            pooling=_LAST,
        ),
        Family(
            "mistral",
            "decoder",
            ("MistralForSequenceClassification",),
            "Mistral",
            ("left", "right"),
            _lrp_refused(_LRP_DECODER),
            causal_lm_classes=("MistralForCausalLM",),
            pooling=_LAST,
        ),
        Family(
            "gemma2",
            "decoder",
            ("Gemma2ForSequenceClassification",),
            "Gemma 2 (sliding-window layers, soft-capping)",
            ("left", "right"),
            _lrp_refused(_LRP_DECODER),
            causal_lm_classes=("Gemma2ForCausalLM",),
            pooling=_LAST,
        ),
        Family(
            "gpt2",
            "decoder",
            ("GPT2ForSequenceClassification",),
            "GPT-2",
            ("left", "right"),
            _lrp_refused(
                "Chefer et al.'s LRP is wired here for encoders and ViT blocks; GPT-2's causal pre-norm "
                "blocks with a last-token head are not (use attnlrp, gae, rollout or the saliency methods)"
            ),
            causal_lm_classes=("GPT2LMHeadModel",),
            pooling=_LAST,
        ),
        Family(
            "vit",
            "vision",
            ("ViTForImageClassification",),
            "ViT",
            prefix_tokens=1,
            lrp=LrpBlocks(
                "vit",
                _VIT_LAYERS,
                _VIT_LAYER,
                (HeadRead(0, ("classifier",)),),
                norm_first=True,
                position_embeddings="embeddings.position_embeddings",
            ),
        ),
        Family(
            "deit",
            "vision",
            ("DeiTForImageClassification", "DeiTForImageClassificationWithTeacher"),
            "DeiT (class head, and class + distillation heads)",
            pooling=Pooling("first", by_class={"DeiTForImageClassificationWithTeacher": "class_distillation"}),
            prefix_tokens=2,
            lrp=LrpBlocks(
                "deit",
                _VIT_LAYERS,
                _VIT_LAYER,
                (HeadRead(0, ("classifier",)),),
                heads_by_class={
                    "DeiTForImageClassificationWithTeacher": (
                        HeadRead(0, ("cls_classifier",)),
                        HeadRead(1, ("distillation_classifier",)),
                    )
                },
                norm_first=True,
                position_embeddings="embeddings.position_embeddings",
            ),
        ),
        Family(
            "dinov2",
            "vision",
            ("Dinov2ForImageClassification",),
            "DINOv2 (class token + patch mean)",
            refused=_lrp_refused(
                "Chefer et al.'s LRP is wired here for heads that read single tokens; DINOv2's head "
                "reads the class token concatenated with the patch mean, and its blocks rescale each branch "
                "(LayerScale), which this implementation does not propagate (use attnlrp, gae, rollout or the saliency "
                "methods)"
            ),
            pooling=Pooling("class_patch_mean"),
            prefix_tokens=1,
        ),
    )
}


def supported_model_types() -> list[str]:
    """The ``config.model_type`` values the explainers support, sorted."""
    return sorted(FAMILIES)


def family(model_type: str) -> Family | None:
    """The :class:`Family` of ``model_type``, or ``None``."""
    return FAMILIES.get(model_type)


def model_family(model: Any) -> Family | None:
    """The :class:`Family` of a Hugging Face model, by its ``config.model_type`` (``None`` if it has none or the type
    is not supported)."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    return FAMILIES.get(model_type) if isinstance(model_type, str) else None
