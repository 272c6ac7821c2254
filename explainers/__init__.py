"""Attributions for Hugging Face Transformer classifiers, batched: raw attention, rollout, Chefer et al.'s
relevance, GAE and two saliency baselines.

>>> from explainers import explain, available_methods
>>> attribution = explain(model, tokenizer(texts, return_tensors="pt", padding=True), method="relevance")
"""

from .api import Attribution, BatchExplanation, RowExplanation, RowRequest, explain, explain_batch
from .architectures import Architecture, describe, supported_model_types
from .errors import (
    ExplainError,
    InvalidInputError,
    InvalidOptionError,
    InvalidTargetError,
    NonFiniteScoresError,
    UnknownMethodError,
    UnsupportedModelError,
)
from .methods import Method, available_methods, get_method

__all__ = [
    "Architecture",
    "Attribution",
    "BatchExplanation",
    "ExplainError",
    "InvalidInputError",
    "InvalidOptionError",
    "InvalidTargetError",
    "Method",
    "NonFiniteScoresError",
    "RowExplanation",
    "RowRequest",
    "UnknownMethodError",
    "UnsupportedModelError",
    "available_methods",
    "describe",
    "explain",
    "explain_batch",
    "get_method",
    "supported_model_types",
]
