"""Attributions for Hugging Face Transformer classifiers, batched: raw attention, rollout, Chefer et al.'s
relevance, GAE and two saliency baselines.

>>> from explainers import explain, available_methods
>>> attribution = explain(model, tokenizer(texts, return_tensors="pt", padding=True), method="relevance")
"""

from .api import Attribution, BatchExplanation, RowExplanation, RowRequest, explain, explain_batch
from .architectures import Architecture, describe
from .attention_capture import (
    CAPTURE_IMPLEMENTATION,
    FUSED_CAPTURE_IMPLEMENTATION,
    AttentionCall,
    AttentionCapture,
    AttentionObserver,
    attention_implementation,
    capturing_attention,
    fused_implementation,
)
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
from .generation import GenerationExplanation, StepSum, explain_generation
from .heads import HEAD_TYPES, POOLED_POSITIONS, head_type, pooled_position
from .memory import MemoryBudgetError, estimate_bytes
from .methods import Method, available_methods, get_method
from .support import FAMILIES, TASKS, Family, Task, support_table, supported_model_types
from .targets import TargetExplanation, Targets, explain_targets
from .token_classification import TokenExplanation, TokenPrediction, explain_tokens, predict_tokens
from .token_labels import LabelScheme, label_scheme

# Units, chats and citations read the names above: imported last.
from .units import GRANULARITIES, Segment, Unit, UnitExplanation, explain_units, token_units, unit_scores  # isort: skip
from .chat import (  # isort: skip
    ChatTemplateError,
    Document,
    Message,
    NoChatTemplateError,
    PromptField,
    RenderedPrompt,
    UnknownRoleError,
    chat_template_of,
    check_documents,
    check_messages,
    decoded_offsets,
    render_chat,
    render_prompt,
)
from .citations import (  # isort: skip
    Citations,
    Sentence,
    SpanExplanation,
    answer_sentences,
    cite,
    explain_citations,
    explain_spans,
    span_steps,
)


def supported_methods(model_type: str, task: str = "sequence_classification") -> list[str]:
    """The registered methods that work on ``model_type``'s models of ``task`` (the others raise
    :class:`UnsupportedMethodError`)."""
    from .support import supported_methods as _supported

    return _supported(model_type, available_methods(), task)


__all__ = [
    "CAPTURE_IMPLEMENTATION",
    "FAMILIES",
    "FUSED_CAPTURE_IMPLEMENTATION",
    "GRANULARITIES",
    "HEAD_TYPES",
    "POOLED_POSITIONS",
    "TASKS",
    "Architecture",
    "AttentionCall",
    "AttentionCapture",
    "AttentionObserver",
    "Attribution",
    "BatchExplanation",
    "ChatTemplateError",
    "Citations",
    "Document",
    "ExplainError",
    "Family",
    "GenerationExplanation",
    "InvalidInputError",
    "InvalidOptionError",
    "InvalidTargetError",
    "LabelScheme",
    "MemoryBudgetError",
    "Message",
    "Method",
    "NoChatTemplateError",
    "NonFiniteScoresError",
    "PromptField",
    "RenderedPrompt",
    "RowExplanation",
    "RowRequest",
    "RowSkipped",
    "Segment",
    "Sentence",
    "SpanExplanation",
    "StepSum",
    "TargetExplanation",
    "Targets",
    "Task",
    "TokenExplanation",
    "TokenPrediction",
    "Unit",
    "UnitExplanation",
    "UnknownMethodError",
    "UnknownRoleError",
    "UnsupportedMethodError",
    "UnsupportedModelError",
    "answer_sentences",
    "attention_implementation",
    "available_methods",
    "capturing_attention",
    "chat_template_of",
    "check_documents",
    "check_messages",
    "cite",
    "decoded_offsets",
    "describe",
    "estimate_bytes",
    "explain",
    "explain_batch",
    "explain_citations",
    "explain_generation",
    "explain_spans",
    "explain_targets",
    "explain_tokens",
    "explain_units",
    "fused_implementation",
    "get_method",
    "head_type",
    "label_scheme",
    "pooled_position",
    "predict_tokens",
    "prediction_confidence",
    "render_chat",
    "render_prompt",
    "span_steps",
    "support_table",
    "supported_methods",
    "supported_model_types",
    "token_units",
    "unit_scores",
]
