"""The support matrix: which architecture families the explainers know, and which methods each one refuses.

One registry, :data:`FAMILIES`, read by :func:`explainers.describe` (which classes are accepted, which inputs and
padding sides), by the refusal message of :class:`~explainers.errors.UnsupportedMethodError`, by the README table
(:func:`support_table`) and by the generated test matrix. A method not listed in a family's ``refused`` works on
it; a refused one has the reason here, in one sentence.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from .errors import UnsupportedMethodError

Kind = Literal["encoder", "decoder", "vision"]

_LRP_DECODER = (
    "Chefer et al.'s LRP rules cover post-LayerNorm encoders and ViT blocks; this decoder's RMSNorm, gated MLP "
    "products and rotary embeddings have no rule here (use gae, rollout or the saliency methods)"
)


@dataclass(frozen=True)
class Family:
    """One supported architecture family.

    Attributes:
        model_type: ``config.model_type``.
        kind: ``encoder`` (text, bidirectional), ``decoder`` (text, causal) or ``vision``.
        classes: the classifier classes accepted (by class name).
        padding: the padding sides accepted for text (``right``, ``left``).
        refused: method name → why it is refused on this family.
        title: how the README names the family.
    """

    model_type: str
    kind: Kind
    classes: tuple[str, ...]
    title: str
    padding: tuple[str, ...] = ("right",)
    refused: Mapping[str, str] = field(default_factory=dict)


FAMILIES: dict[str, Family] = {
    family.model_type: family
    for family in (
        Family("bert", "encoder", ("BertForSequenceClassification",), "BERT"),
        Family("roberta", "encoder", ("RobertaForSequenceClassification",), "RoBERTa"),
        Family("xlm-roberta", "encoder", ("XLMRobertaForSequenceClassification",), "XLM-RoBERTa"),
        Family("distilbert", "encoder", ("DistilBertForSequenceClassification",), "DistilBERT"),
        Family("electra", "encoder", ("ElectraForSequenceClassification",), "ELECTRA"),
        Family("albert", "encoder", ("AlbertForSequenceClassification",), "ALBERT (shared layers, recorded per call)"),
        Family(
            "modernbert",
            "encoder",
            ("ModernBertForSequenceClassification",),
            "ModernBERT (cls or mean pooling, sliding-window layers)",
            refused={
                "relevance": "Chefer et al.'s LRP rules cover post-LayerNorm encoders; ModernBERT's pre-norm blocks "
                "with a gated GLU feed-forward and rotary embeddings have no rule here (use gae, rollout or the "
                "saliency methods)"
            },
        ),
        Family(
            "deberta-v2",
            "encoder",
            ("DebertaV2ForSequenceClassification",),
            "DeBERTa-v2 / v3",
            refused={
                "relevance": "Chefer et al.'s LRP rules have no rule for DeBERTa's disentangled relative-position "
                "terms (content-to-position and position-to-content scores) (use gae, rollout or the saliency "
                "methods)"
            },
        ),
        Family(
            "llama",
            "decoder",
            ("LlamaForSequenceClassification",),
            "Llama (grouped-query attention)",
            ("left", "right"),
            {"relevance": _LRP_DECODER},
        ),
        Family(
            "qwen2",
            "decoder",
            ("Qwen2ForSequenceClassification",),
            "Qwen2",
            ("left", "right"),
            {"relevance": _LRP_DECODER},
        ),
        Family(
            "qwen3",
            "decoder",
            ("Qwen3ForSequenceClassification",),
            "Qwen3",
            ("left", "right"),
            {"relevance": _LRP_DECODER},
        ),
        Family(
            "mistral",
            "decoder",
            ("MistralForSequenceClassification",),
            "Mistral",
            ("left", "right"),
            {"relevance": _LRP_DECODER},
        ),
        Family(
            "gemma2",
            "decoder",
            ("Gemma2ForSequenceClassification",),
            "Gemma 2 (sliding-window layers, soft-capping)",
            ("left", "right"),
            {"relevance": _LRP_DECODER},
        ),
        Family(
            "gpt2",
            "decoder",
            ("GPT2ForSequenceClassification",),
            "GPT-2",
            ("left", "right"),
            {
                "relevance": "Chefer et al.'s LRP is wired here for encoders and ViT blocks; GPT-2's causal pre-norm "
                "blocks with a last-token head are not (use gae, rollout or the saliency methods)"
            },
        ),
        Family("vit", "vision", ("ViTForImageClassification",), "ViT"),
        Family(
            "deit",
            "vision",
            ("DeiTForImageClassification", "DeiTForImageClassificationWithTeacher"),
            "DeiT (class head, and class + distillation heads)",
        ),
        Family(
            "dinov2",
            "vision",
            ("Dinov2ForImageClassification",),
            "DINOv2 (class token + patch mean)",
            refused={
                "relevance": "Chefer et al.'s LRP is wired here for heads that read single tokens; DINOv2's head "
                "reads the class token concatenated with the patch mean, and its blocks rescale each branch "
                "(LayerScale), which this implementation does not propagate (use gae, rollout or the saliency "
                "methods)"
            },
        ),
    )
}


def supported_model_types() -> list[str]:
    """The ``config.model_type`` values the explainers support, sorted."""
    return sorted(FAMILIES)


def family(model_type: str) -> Family | None:
    """The :class:`Family` of ``model_type``, or ``None``."""
    return FAMILIES.get(model_type)


def refusal(model_type: str, method: str) -> str | None:
    """Why ``method`` is refused on ``model_type`` (``None`` if it works there or the type is unknown)."""
    known = FAMILIES.get(model_type)
    return None if known is None else known.refused.get(method)


def supported_methods(model_type: str, methods: Sequence[str]) -> list[str]:
    """The methods among ``methods`` that work on ``model_type``, in the given order."""
    return [method for method in methods if refusal(model_type, method) is None]


def check_method(model_type: str, method: str, methods: Sequence[str]) -> None:
    """Raise :class:`UnsupportedMethodError` if ``method`` is refused on ``model_type``.

    Args:
        model_type: ``config.model_type``.
        method: a registered method name.
        methods: every registered method name (to list the ones that work).
    """
    reason = refusal(model_type, method)
    if reason is not None:
        working = ", ".join(supported_methods(model_type, methods))
        raise UnsupportedMethodError(
            f"method {method!r} is not supported for model type {model_type!r}: {reason}; methods that work on "
            f"{model_type!r}: {working}"
        )


def support_matrix(methods: Sequence[str]) -> list[tuple[str, str, str | None]]:
    """Every (model type, method, refusal reason or ``None``) cell, model types sorted, methods in order."""
    return [(model_type, method, refusal(model_type, method)) for model_type in FAMILIES for method in methods]


def support_table(methods: Sequence[str]) -> str:
    """The support matrix as a Markdown table (the README's), with the refusal reasons as footnotes."""
    header = "| model type | family | " + " | ".join(f"`{method}`" for method in methods) + " |"
    lines = [header, "|" + "---|" * (len(methods) + 2)]
    reasons: dict[str, int] = {}
    for model_type, known in FAMILIES.items():
        cells = []
        for method in methods:
            reason = known.refused.get(method)
            if reason is None:
                cells.append("yes")
            else:
                number = reasons.setdefault(reason, len(reasons) + 1)
                cells.append(f"refused ({number})")
        lines.append(f"| `{model_type}` | {known.title} | " + " | ".join(cells) + " |")
    lines.append("")
    lines += [f"- ({number}) {reason}." for reason, number in reasons.items()]
    return "\n".join(lines)
