"""Attributions for Hugging Face Transformers, batched: AttnLRP (the served default) and CP-LRP, Chefer et al.'s
relevance, GAE, attention rollout, raw attention, and the baselines the founding papers compare (gradient × input,
integrated gradients, gradient, SmoothGrad, occlusion, attention flow, GradCAM, full and partial LRP).

This module is the public surface; the names below are all a caller needs.

- Sequence classifiers (text encoders, decoder classifiers, vision Transformers): :func:`explain` (a batch, one method)
  and :func:`explain_batch` (a served batch whose rows each ask for their own method, one shared forward).
- Token classifiers (NER, PII): :func:`explain_tokens` explains every entity; :func:`predict_tokens` finds them.
- Causal language models: :func:`explain_generation` explains every generated token; :func:`explain_spans` many spans
  of an answer (its sentences) from one forward, :func:`explain_citations` the documents each sentence rests on.
- Chats and units a reader thinks in: :func:`render_chat` (messages and documents through the chat template, each
  located in the prompt), :func:`explain_units` (any explanation's tokens grouped into words or sentences, scores
  summed).
- Any token-level head: :func:`explain_targets`, many :class:`Targets` from one forward.
- The registry: :func:`available_methods`, :func:`get_method`, :func:`supported_methods`, :func:`check_method`, and
  :data:`DEFAULT_METHOD` (``attnlrp``), the method every entry point uses when none is named; the support matrix:
  :data:`FAMILIES`, :func:`support_table`.
- Serving a batch of any head: :func:`group_rows` groups its rows by what can share a forward and a backward (a
  :class:`GroupKey` per row); the decoding loop :func:`generate_continuation` (a :class:`Continuation`, with
  :class:`GenerationSettings` per row and :class:`StepLogprobs`; its ``on_step`` hook sees each
  :class:`GeneratedStep` as it is written), :func:`explain_continuation` for a continuation's
  steps; the time estimates :func:`check_time_budget`, :func:`check_generation_budget`,
  :func:`check_explanation_budget`, :func:`generation_seconds`, :func:`prediction_seconds`, and :class:`ServedSpeed`,
  a model's speed corrected by the batches it serves.

Behind it: ``plan`` (every head's batch grouping, and the classifier's passes), ``api`` and ``execution`` (the
classifier path), ``methods`` (the registry and what each method declares), ``capture`` (the pass), ``inputs``,
``memory``, ``timing``, ``deadline`` and ``confidence`` (the guards); ``rules/`` (pure tensor maths), ``architectures/``
(what is known of Hugging Face models) and ``tasks/`` (the token-level heads); ``units`` and ``chat`` (text: words,
sentences, rendered chats).

>>> from explainers import explain, available_methods
>>> attribution = explain(model, tokenizer(texts, return_tensors="pt", padding=True))  # DEFAULT_METHOD: attnlrp
"""

from ._version import __version__
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
from .architectures.families import FAMILIES, Family, supported_model_types
from .architectures.heads import HEAD_TYPES, POOLED_POSITIONS, head_type, pooled_position
from .architectures.support import TASKS, Task, check_method, support_table
from .chat import (
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
from .confidence import RowSkipped, prediction_confidence
from .deadline import Deadline, DeadlineExceededError
from .defaults import DEFAULT_METHOD
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
from .methods.registry import Method, available_methods, get_method
from .plan import GroupKey, RowGroup, group_rows
from .served_speed import BatchLedger, ServedSpeed, work_kind
from .tasks.citations import (
    Citations,
    Sentence,
    SpanExplanation,
    answer_sentences,
    cite,
    explain_citations,
    explain_spans,
    span_steps,
)
from .tasks.continuation import (
    Continuation,
    GeneratedStep,
    GenerationSettings,
    StepLogprobs,
    evaluating,
    generate_continuation,
    model_eos_tokens,
    pad_token,
    position_limit,
    step_logprobs,
    vocabulary_size,
)
from .tasks.generation import (
    GenerationExplanation,
    StepSum,
    check_generation_call,
    explain_continuation,
    explain_generation,
    resolve_steps,
    step_probabilities,
)
from .tasks.tagging import LabelScheme, Span, label_scheme
from .tasks.targets import TargetExplanation, Targets, explain_targets
from .tasks.token_classification import TokenExplanation, TokenPrediction, explain_tokens, predict_tokens
from .timing import (
    ModelSpeed,
    TimeBudgetError,
    check_explanation_budget,
    check_generation_budget,
    check_time_budget,
    estimate_seconds,
    generation_seconds,
    prediction_seconds,
)
from .units import GRANULARITIES, Segment, Unit, UnitExplanation, explain_units, token_units, unit_scores


def supported_methods(model_type: str, task: str = "sequence_classification") -> list[str]:
    """The registered methods that work on ``model_type``'s models of ``task`` (the others raise
    :class:`UnsupportedMethodError`).

    Args:
        model_type: a ``config.model_type`` (:func:`supported_model_types` lists them).
        task: ``sequence_classification``, ``token_classification`` or ``causal_lm`` (:data:`TASKS`).
    """
    from .architectures.support import working_methods

    return working_methods(model_type, available_methods(), task)


__all__ = [
    "CAPTURE_IMPLEMENTATION",
    "DEFAULT_METHOD",
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
    "BatchLedger",
    "ChatTemplateError",
    "Citations",
    "Continuation",
    "Deadline",
    "DeadlineExceededError",
    "Document",
    "ExplainError",
    "Family",
    "GeneratedStep",
    "GenerationExplanation",
    "GenerationSettings",
    "GroupKey",
    "InvalidInputError",
    "InvalidOptionError",
    "InvalidTargetError",
    "LabelScheme",
    "MemoryBudgetError",
    "Message",
    "Method",
    "ModelSpeed",
    "NoChatTemplateError",
    "NonFiniteScoresError",
    "PromptField",
    "RenderedPrompt",
    "RowExplanation",
    "RowGroup",
    "RowRequest",
    "RowSkipped",
    "Segment",
    "Sentence",
    "ServedSpeed",
    "Span",
    "SpanExplanation",
    "StepLogprobs",
    "StepSum",
    "TargetExplanation",
    "Targets",
    "Task",
    "TimeBudgetError",
    "TokenExplanation",
    "TokenPrediction",
    "Unit",
    "UnitExplanation",
    "UnknownMethodError",
    "UnknownRoleError",
    "UnsupportedMethodError",
    "UnsupportedModelError",
    "__version__",
    "answer_sentences",
    "attention_implementation",
    "available_methods",
    "capturing_attention",
    "chat_template_of",
    "check_documents",
    "check_explanation_budget",
    "check_generation_budget",
    "check_generation_call",
    "check_messages",
    "check_method",
    "check_time_budget",
    "cite",
    "decoded_offsets",
    "describe",
    "estimate_bytes",
    "estimate_seconds",
    "evaluating",
    "explain",
    "explain_batch",
    "explain_citations",
    "explain_continuation",
    "explain_generation",
    "explain_spans",
    "explain_targets",
    "explain_tokens",
    "explain_units",
    "fused_implementation",
    "generate_continuation",
    "generation_seconds",
    "get_method",
    "group_rows",
    "head_type",
    "label_scheme",
    "model_eos_tokens",
    "pad_token",
    "pooled_position",
    "position_limit",
    "predict_tokens",
    "prediction_confidence",
    "prediction_seconds",
    "render_chat",
    "render_prompt",
    "resolve_steps",
    "span_steps",
    "step_logprobs",
    "step_probabilities",
    "support_table",
    "supported_methods",
    "supported_model_types",
    "token_units",
    "unit_scores",
    "vocabulary_size",
    "work_kind",
]
