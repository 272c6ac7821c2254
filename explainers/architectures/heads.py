"""What a classifier's head reads and what it outputs: the explained position and the head kind.

The explained position is a property of the head, read once from the model class and config: a token-level class
reads ``each`` position, and a sequence classifier where its family's record says
(:attr:`~explainers.architectures.families.Family.pooling`), by default the first token:

========================  ===============================================================================
``pooled``                the head reads (and ``attention``, ``rollout``, ``gae``, ``relevance`` explain)
========================  ===============================================================================
``first``                 the first token: [CLS] of the BERT family, ELECTRA, ALBERT, DeBERTa-v2, ModernBERT
                          with ``classifier_pooling="cls"``; the class token of ViT and ``DeiTForImageClassification``
``last``                  the last real token, found as the model finds it: the rightmost token whose id is not
                          ``config.pad_token_id`` (decoder classifiers: Llama, Qwen2/3, Mistral, Gemma2, GPT-2);
                          left and right padding are both accepted
``mean``                  the mean over the real tokens (ModernBERT with ``classifier_pooling="mean"``)
``class_distillation``    the class and distillation tokens, averaged (``DeiTForImageClassificationWithTeacher``
                          averages its two heads, which read them)
``class_patch_mean``      DINOv2: the head reads the class token concatenated with the mean of the patch tokens;
                          the explained row is half the class token's row plus half the mean of the patch rows
``each``                  token-level heads (token classifiers, causal language models): every position has its
                          own output; each explained target names its positions (:mod:`explainers.tasks.targets`)
========================  ===============================================================================

The head kind (:func:`head_type`) decides what ``probabilities`` means on the results: a softmax over the labels
for ``single_label``, an independent sigmoid per label for ``multi_label``
(``problem_type="multi_label_classification"``), and for ``regression`` (``num_labels=1`` or
``problem_type="regression"``) the raw predicted values unchanged, since a regression output is not a probability.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

import torch
from torch import Tensor, nn

from ..errors import InvalidInputError
from .families import Pooled, model_family

HeadType = Literal["single_label", "multi_label", "regression"]

POOLED_POSITIONS: tuple[str, ...] = get_args(Pooled)
HEAD_TYPES: tuple[str, ...] = ("single_label", "multi_label", "regression")


def pooled_position(model: nn.Module) -> str:
    """Where ``model``'s classification head reads the sequence (one of :data:`POOLED_POSITIONS`).

    Args:
        model: a Hugging Face classifier.

    Returns:
        ``first``, ``last``, ``mean``, ``class_distillation``, ``class_patch_mean`` or ``each`` (see the module
        docstring).
    """
    name = type(model).__name__
    if name.endswith(("ForTokenClassification", "ForCausalLM", "LMHeadModel")):
        return "each"
    known = model_family(model)
    if known is None:
        return "first"
    return known.pooling.pooled(name, getattr(model, "config", None))


def head_type(model: nn.Module) -> str:
    """The kind of ``model``'s head: ``single_label``, ``multi_label`` or ``regression``.

    Read from ``config.problem_type`` when set; otherwise one label means regression (as transformers' loss does)
    and more labels a single-label classifier.
    """
    config: Any = getattr(model, "config", None)
    problem = getattr(config, "problem_type", None)
    if problem == "multi_label_classification":
        return "multi_label"
    if problem == "regression" or (problem is None and int(getattr(config, "num_labels", 2)) == 1):
        return "regression"
    return "single_label"


def head_probabilities(logits: Tensor, head: str) -> Tensor:
    """The outputs as the head means them: softmax (single label), sigmoid (multi-label), raw (regression)."""
    if head == "multi_label":
        return logits.sigmoid()
    if head == "regression":
        return logits
    return logits.softmax(dim=-1)


def last_positions(input_ids: Tensor, mask: Tensor, pad_token_id: int | None) -> Tensor:
    """``(batch,)`` the position a decoder classifier's head reads, computed as transformers computes it.

    Raises:
        InvalidInputError: if the model has no ``pad_token_id`` and the batch has several rows, or if the position
            the head reads is padding (``attention_mask`` and ``pad_token_id`` disagree).
    """
    batch, length = input_ids.shape
    if pad_token_id is None:
        if batch != 1:
            raise InvalidInputError(
                "this decoder classifier has no config.pad_token_id, so its head cannot find the last token of a "
                "padded batch; set model.config.pad_token_id to the tokenizer's pad token id, or send one row"
            )
        positions = torch.full((batch,), length - 1, dtype=torch.long, device=input_ids.device)
    else:
        indices = torch.arange(length, device=input_ids.device)
        positions = (indices * (input_ids != pad_token_id)).argmax(dim=-1)
    read = mask.gather(1, positions.view(-1, 1)).view(-1)
    if not bool((read == 1).all()):
        raise InvalidInputError(
            "the head reads the rightmost token that is not config.pad_token_id, and for some row that token is "
            "padding: pad with the model's pad token id (tokenizer.pad_token_id == model.config.pad_token_id)"
        )
    return positions


def readout_weights(pooled: str, mask: Tensor, prefix_tokens: int, last: Tensor | None = None) -> Tensor:
    """``(batch, n)`` weights of the rows the head reads (each row sums to 1; 0 at padding).

    Args:
        pooled: one of :data:`POOLED_POSITIONS`.
        mask: ``(batch, n)`` 1 for real tokens.
        prefix_tokens: tokens before the patches (images: class, distillation).
        last: ``(batch,)`` positions for ``pooled="last"`` (:func:`last_positions`).
    """
    weights = torch.zeros(mask.shape, dtype=torch.float64, device=mask.device)
    if pooled == "first":
        weights[:, 0] = 1.0
    elif pooled == "last":
        if last is None:
            raise ValueError("pooled='last' needs the last positions")
        weights.scatter_(1, last.view(-1, 1), 1.0)
    elif pooled == "mean":
        weights = mask.to(torch.float64) / mask.sum(dim=1, keepdim=True)
    elif pooled == "class_distillation":
        weights[:, 0] = 0.5
        weights[:, 1] = 0.5
    elif pooled == "class_patch_mean":
        patches = mask.shape[1] - prefix_tokens
        weights[:, prefix_tokens:] = 0.5 / patches
        weights[:, 0] += 0.5
    else:
        raise ValueError(f"unknown pooled position {pooled!r}; valid: {', '.join(POOLED_POSITIONS)}")
    return weights


def readout_tokens(pooled: str, weights: Tensor) -> Tensor:
    """``(batch, n)`` bool: the single tokens the head reads (whose self-relevance the rollouts suppress).

    For ``first``, ``last`` and ``class_distillation`` these are the tokens read; for ``class_patch_mean`` the
    class token; for ``mean`` none (every real token is read alike, so the identity adds the same to each).
    """
    if pooled == "mean":
        return torch.zeros(weights.shape, dtype=torch.bool, device=weights.device)
    if pooled == "class_patch_mean":
        tokens = torch.zeros(weights.shape, dtype=torch.bool, device=weights.device)
        tokens[:, 0] = True
        return tokens
    return weights > 0
