"""Attributions for Hugging Face Transformer classifiers, batched: raw attention, rollout, Chefer et al.'s
relevance, GAE and two saliency baselines.

>>> from explainers import explain, available_methods
>>> attribution = explain(model, tokenizer(texts, return_tensors="pt", padding=True), method="relevance")
"""

from .api import Attribution, BatchExplanation, RowExplanation, RowRequest, explain, explain_batch
from .architectures.attention import (
    CAPTURE_IMPLEMENTATION,
    FUSED_CAPTURE_IMPLEMENTATION,
    AttentionCall,
    AttentionCapture,
    AttentionObserver,
    attention_implementation,
    capturing_attention,
    fused_implementation,
)
from .architectures.description import Architecture, describe
from .architectures.heads import HEAD_TYPES, POOLED_POSITIONS, head_type, pooled_position
from .architectures.support import FAMILIES, TASKS, Family, Task, support_table, supported_model_types
from .confidence import RowSkipped, prediction_confidence
from .errors import (
    ExplainError,
    InvalidInputError,
    InvalidOptionError,
    InvalidTargetError,
    NonFiniteScoresError,
    UnknownMethodError,
    UnsupportedMethodError,
    UnsupportedModelError,
)
from .memory import MemoryBudgetError, estimate_bytes
from .methods import Method, available_methods, get_method
from .tasks.generation import GenerationExplanation, StepSum, explain_generation
from .tasks.tagging import LabelScheme, label_scheme
from .tasks.targets import TargetExplanation, Targets, explain_targets
from .tasks.token_classification import TokenExplanation, TokenPrediction, explain_tokens, predict_tokens


def supported_methods(model_type: str, task: str = "sequence_classification") -> list[str]:
    """The registered methods that work on ``model_type``'s models of ``task`` (the others raise
    :class:`UnsupportedMethodError`)."""
    from .architectures.support import supported_methods as _supported

    return _supported(model_type, available_methods(), task)


__all__ = [
    "CAPTURE_IMPLEMENTATION",
    "FAMILIES",
    "FUSED_CAPTURE_IMPLEMENTATION",
    "HEAD_TYPES",
    "POOLED_POSITIONS",
    "TASKS",
    "Architecture",
    "AttentionCall",
    "AttentionCapture",
    "AttentionObserver",
    "Attribution",
    "BatchExplanation",
    "ExplainError",
    "Family",
    "GenerationExplanation",
    "InvalidInputError",
    "InvalidOptionError",
    "InvalidTargetError",
    "LabelScheme",
    "MemoryBudgetError",
    "Method",
    "NonFiniteScoresError",
    "RowExplanation",
    "RowRequest",
    "RowSkipped",
    "StepSum",
    "TargetExplanation",
    "Targets",
    "Task",
    "TokenExplanation",
    "TokenPrediction",
    "UnknownMethodError",
    "UnsupportedMethodError",
    "UnsupportedModelError",
    "attention_implementation",
    "available_methods",
    "capturing_attention",
    "describe",
    "estimate_bytes",
    "explain",
    "explain_batch",
    "explain_generation",
    "explain_targets",
    "explain_tokens",
    "fused_implementation",
    "get_method",
    "head_type",
    "label_scheme",
    "pooled_position",
    "predict_tokens",
    "prediction_confidence",
    "support_table",
    "supported_methods",
    "supported_model_types",
]
