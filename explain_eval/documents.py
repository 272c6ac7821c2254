"""Answers read again with documents left out: the teacher-forced log-probability of an answer's sentences after a
chat whose documents are a subset of the ones given.

The measure behind the document view of ``explain-eval --generation`` (:mod:`explain_eval.generation`) and the
leave-one-document-out reference of ``bench/citations.py``: a document is *removed* by rendering the chat again without
it (:func:`explainers.render_chat`; the documents block then numbers the remaining ones ``[1]``, ``[2]``, … in their
order, as if the caller had never sent it), and the same answer tokens are read after that prompt (teacher-forced). A
sentence's value is the sum of its tokens' log-probabilities, the objective its citations explain
(:func:`explainers.explain_spans`).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from explainers import render_chat, render_prompt
from explainers.tasks.continuation import evaluating, pad_token


def prompt_without(
    tokenizer: Any,
    messages: Sequence[Any] | None,
    documents: Sequence[Any],
    removed: Collection[int] = (),
    *,
    prompt: str | None = None,
    chat_template: str | None = None,
) -> tuple[int, ...]:
    """The prompt's token ids with the documents ``removed`` (indices into ``documents``) left out.

    Args:
        tokenizer: the model's fast tokenizer.
        messages: the chat messages (``None``: a plain ``prompt``).
        documents: all the documents.
        removed: the indices of the documents to leave out.
        prompt: a plain prompt instead of messages.
        chat_template: a chat template instead of the tokenizer's.

    Raises:
        ValueError: for an index outside ``documents``.
    """
    outside = sorted(index for index in removed if not 0 <= index < len(documents))
    if outside:
        raise ValueError(f"documents {outside} do not exist (there are {len(documents)})")
    left_out = set(removed)
    kept = [document for index, document in enumerate(documents) if index not in left_out]
    if messages is None:
        return render_prompt(tokenizer, prompt or "", kept).input_ids
    return render_chat(tokenizer, messages, kept, chat_template=chat_template).input_ids


@torch.inference_mode()
def span_log_probabilities(
    model: nn.Module,
    prompts: Sequence[Sequence[int]],
    answer: Sequence[int],
    spans: Sequence[tuple[int, int]],
    batch_size: int = 8,
) -> Tensor:
    """Each span's summed log-probability of the answer's tokens, teacher-forced after each prompt.

    The prompts are left-padded into batches of ``batch_size`` with the answer after each (positions counted over the
    real tokens, so a padded row reads what it reads alone); the model runs as in generation
    (:func:`explainers.tasks.continuation.evaluating`). The log-softmax is taken in float64.

    Args:
        model: the causal LM.
        prompts: token ids of each prompt.
        answer: the answer's token ids (step ``t`` is ``answer[t]``).
        spans: ``(start, stop)`` steps of each span (``stop`` exclusive).
        batch_size: prompts per forward.

    Returns:
        ``(len(prompts), len(spans))`` float64.

    Raises:
        ValueError: for an empty answer or a span outside it.
    """
    steps = len(answer)
    if steps == 0:
        raise ValueError("the answer has no token")
    for start, stop in spans:
        if not 0 <= start < stop <= steps:
            raise ValueError(f"span ({start}, {stop}) must satisfy 0 <= start < stop <= {steps}")
    device = next(model.parameters()).device
    pad = pad_token(model)
    tail = torch.tensor(list(answer), dtype=torch.long)
    rows = []
    for first in range(0, len(prompts), batch_size):
        chunk = [torch.tensor(list(prompt), dtype=torch.long) for prompt in prompts[first : first + batch_size]]
        width = max(len(prompt) for prompt in chunk) + steps
        ids = torch.full((len(chunk), width), pad, dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for row, prompt in enumerate(chunk):
            sequence = torch.cat([prompt, tail])
            ids[row, width - len(sequence) :] = sequence
            mask[row, width - len(sequence) :] = 1
        positions = (mask.cumsum(dim=-1) - 1).clamp(min=0)
        with evaluating(model):
            logits = model(
                input_ids=ids.to(device), attention_mask=mask.to(device), position_ids=positions.to(device)
            ).logits
        predicting = logits[:, width - steps - 1 : width - 1].double().log_softmax(dim=-1)
        chosen = predicting.gather(-1, tail.to(device)[None, :, None].expand(len(chunk), steps, 1)).squeeze(-1)
        rows.append(torch.stack([chosen[:, start:stop].sum(dim=-1) for start, stop in spans], dim=-1).cpu())
    return torch.cat(rows)
