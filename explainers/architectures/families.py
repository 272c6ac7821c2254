"""The support matrix: which architecture families the explainers know, and which methods each one refuses.

One registry, :data:`FAMILIES`, read by :func:`explainers.describe` (which classes are accepted, which inputs and
padding sides), by the refusal message of :class:`~explainers.errors.UnsupportedMethodError`, by the README table
(:func:`support_table`) and by the generated test matrix. A method not listed in a family's ``refused`` works on
it; a refused one has the reason here, in one sentence.

A family's classes come in three tasks (:data:`TASKS`): sequence classifiers (one label per input, explained by
:func:`explainers.explain` / :func:`explainers.explain_batch`), token classifiers (a label per token, explained by
:func:`explainers.explain_tokens`) and causal language models (a token per step, explained by
:func:`explainers.explain_generation`). The token-level tasks are explained through :mod:`explainers.tasks.targets`;
a task may refuse a method for all its families (:attr:`Task.refused`), with the reason here too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from ..defaults import DEFAULT_METHOD
from ..errors import UnsupportedMethodError

Kind = Literal["encoder", "decoder", "vision"]
TaskName = Literal["sequence_classification", "token_classification", "causal_lm"]


@dataclass(frozen=True)
class Task:
    """What a model class predicts, and where it is explained.

    Attributes:
        name: ``sequence_classification``, ``token_classification`` or ``causal_lm``.
        title: how the docs name it.
        entry_point: the public function that explains models of this task.
        refused: method name → why the method is refused for every model of this task.
    """

    name: TaskName
    title: str
    entry_point: str
    refused: Mapping[str, str] = field(default_factory=dict)


TASKS: dict[str, Task] = {
    task.name: task
    for task in (
        Task("sequence_classification", "sequence classifier", "explainers.explain / explainers.explain_batch"),
        Task("token_classification", "token classifier", "explainers.explain_tokens"),
        Task("causal_lm", "causal language model", "explainers.explain_generation"),
    )
}

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
class Family:
    """One supported architecture family.

    Attributes:
        model_type: ``config.model_type``.
        kind: ``encoder`` (text, bidirectional), ``decoder`` (text, causal) or ``vision``.
        classes: the sequence-classifier classes accepted (by class name).
        token_classes: the token-classifier classes accepted (task ``token_classification``).
        causal_lm_classes: the causal language-model classes accepted (task ``causal_lm``).
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
    token_classes: tuple[str, ...] = ()
    causal_lm_classes: tuple[str, ...] = ()

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


FAMILIES: dict[str, Family] = {
    family.model_type: family
    for family in (
        Family(
            "bert", "encoder", ("BertForSequenceClassification",), "BERT", token_classes=("BertForTokenClassification",)
        ),
        Family(
            "roberta",
            "encoder",
            ("RobertaForSequenceClassification",),
            "RoBERTa",
            token_classes=("RobertaForTokenClassification",),
        ),
        Family(
            "xlm-roberta",
            "encoder",
            ("XLMRobertaForSequenceClassification",),
            "XLM-RoBERTa",
            token_classes=("XLMRobertaForTokenClassification",),
        ),
        Family(
            "distilbert",
            "encoder",
            ("DistilBertForSequenceClassification",),
            "DistilBERT",
            token_classes=("DistilBertForTokenClassification",),
        ),
        Family(
            "electra",
            "encoder",
            ("ElectraForSequenceClassification",),
            "ELECTRA",
            token_classes=("ElectraForTokenClassification",),
        ),
        Family(
            "albert",
            "encoder",
            ("AlbertForSequenceClassification",),
            "ALBERT (shared layers, recorded per call)",
            token_classes=("AlbertForTokenClassification",),
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
        ),
        Family(
            "llama",
            "decoder",
            ("LlamaForSequenceClassification",),
            "Llama (grouped-query attention)",
            ("left", "right"),
            _lrp_refused(_LRP_DECODER),
            causal_lm_classes=("LlamaForCausalLM",),
        ),
        Family(
            "qwen2",
            "decoder",
            ("Qwen2ForSequenceClassification",),
            "Qwen2",
            ("left", "right"),
            _lrp_refused(_LRP_DECODER),
            causal_lm_classes=("Qwen2ForCausalLM",),
        ),
        Family(
            "qwen3",
            "decoder",
            ("Qwen3ForSequenceClassification",),
            "Qwen3",
            ("left", "right"),
            _lrp_refused(_LRP_DECODER),
            causal_lm_classes=("Qwen3ForCausalLM",),
        ),
        Family(
            "mistral",
            "decoder",
            ("MistralForSequenceClassification",),
            "Mistral",
            ("left", "right"),
            _lrp_refused(_LRP_DECODER),
            causal_lm_classes=("MistralForCausalLM",),
        ),
        Family(
            "gemma2",
            "decoder",
            ("Gemma2ForSequenceClassification",),
            "Gemma 2 (sliding-window layers, soft-capping)",
            ("left", "right"),
            _lrp_refused(_LRP_DECODER),
            causal_lm_classes=("Gemma2ForCausalLM",),
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
            refused=_lrp_refused(
                "Chefer et al.'s LRP is wired here for heads that read single tokens; DINOv2's head "
                "reads the class token concatenated with the patch mean, and its blocks rescale each branch "
                "(LayerScale), which this implementation does not propagate (use attnlrp, gae, rollout or the saliency "
                "methods)"
            ),
        ),
    )
}


def supported_model_types() -> list[str]:
    """The ``config.model_type`` values the explainers support, sorted."""
    return sorted(FAMILIES)


def family(model_type: str) -> Family | None:
    """The :class:`Family` of ``model_type``, or ``None``."""
    return FAMILIES.get(model_type)


def refusal(model_type: str, method: str, task: str = "sequence_classification") -> str | None:
    """Why ``method`` is refused on ``model_type`` for ``task`` (``None`` if it works there or the type is unknown).

    A family's own refusal comes first (it holds for every task of the family), then the task's.
    """
    known = FAMILIES.get(model_type)
    if known is None:
        return None
    reason = known.refused.get(method)
    if reason is None and task in TASKS:
        reason = TASKS[task].refused.get(method)
    return reason


def supported_methods(model_type: str, methods: Sequence[str], task: str = "sequence_classification") -> list[str]:
    """The methods among ``methods`` that work on ``model_type`` for ``task``, in the given order."""
    return [method for method in methods if refusal(model_type, method, task) is None]


def check_method(model_type: str, method: str, methods: Sequence[str], task: str = "sequence_classification") -> None:
    """Raise :class:`UnsupportedMethodError` if ``method`` is refused on ``model_type`` for ``task``.

    Args:
        model_type: ``config.model_type``.
        method: a registered method name.
        methods: every registered method name (to list the ones that work).
        task: the model's task (:data:`TASKS`).
    """
    reason = refusal(model_type, method, task)
    if reason is not None:
        working = ", ".join(supported_methods(model_type, methods, task))
        if task == "sequence_classification":
            where, there = f"model type {model_type!r}", repr(model_type)
        else:
            where = there = f"{model_type!r} {TASKS[task].title}s"
        named = f"method {method!r}" + (" (the default method)" if method == DEFAULT_METHOD else "")
        raise UnsupportedMethodError(
            f"{named} is not supported for {where}: {reason}; methods that work on {there}: {working}"
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
