"""Answers read again with documents left out: the teacher-forced log-probability of an answer's sentences after a
chat whose documents are a subset of the ones given, and the document view of ``explain-eval --generation``
(:func:`evaluate_documents`).

The measure behind the document view of ``explain-eval --generation`` (:mod:`explain_eval.generation`) and the
leave-one-document-out reference of ``bench/citations.py``: a document is *removed* by rendering the chat again without
it (:func:`explainers.render_chat`; the documents block then numbers the remaining ones ``[1]``, ``[2]``, … in their
order, as if the caller had never sent it), and the same answer tokens are read after that prompt (teacher-forced). A
sentence's value is the sum of its tokens' log-probabilities, the objective its citations explain
(:func:`explainers.explain_spans`).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from explainers import render_chat, render_prompt
from explainers.tasks.continuation import evaluating, pad_token

from .results import RANDOM, GenerationFaithfulness, summary_table


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


#: How documents are removed in the document view (stated with its results).
DOCUMENT_REMOVAL = (
    "the sentence's k highest-ranked documents (its citations) left out of the chat, which is rendered again without "
    "them (the others renumbered); the answer kept as generated; teacher-forced"
)


@dataclass(frozen=True)
class ChatItem:
    """A chat with documents: ``messages`` (or one user message, ``question``) and its ``documents``."""

    messages: tuple[dict[str, str], ...]
    documents: tuple[Any, ...]

    @property
    def title(self) -> str:
        """The last user message (what the table lists)."""
        return next((m["content"] for m in reversed(self.messages) if m.get("role") == "user"), "")


def default_items_file() -> Path:
    """The benchmark's retrieval items (``bench/data/citation_items.json``)."""
    return Path(__file__).resolve().parent.parent / "bench" / "data" / "citation_items.json"


def read_items(path: Path | None, n: int) -> list[ChatItem]:
    """The first ``n`` chats of a JSON file: a list, or ``{"items": [...]}``, of ``{"messages", "documents"}`` or
    ``{"question", "documents"}`` (default: :func:`default_items_file`).

    Raises:
        ValueError: for an item without documents or without messages and question.
    """
    raw = json.loads((path or default_items_file()).read_text(encoding="utf-8"))
    entries = raw["items"] if isinstance(raw, dict) else raw
    items = []
    for index, entry in enumerate(entries[:n]):
        if not entry.get("documents"):
            raise ValueError(f"item {index} has no documents")
        if "messages" in entry:
            messages = tuple(entry["messages"])
        elif "question" in entry:
            messages = ({"role": "user", "content": entry["question"]},)
        else:
            raise ValueError(f"item {index} has neither messages nor a question")
        items.append(ChatItem(messages, tuple(entry["documents"])))
    if not items:
        raise ValueError("no chat with documents to evaluate")
    return items


def evaluate_documents(
    model: nn.Module,
    tokenizer: Any,
    items: Sequence[ChatItem],
    methods: Sequence[str],
    *,
    name: str = "model",
    new_tokens: int = 48,
    ks: Sequence[int] = (1, 2),
    seed: int = 0,
    options: Mapping[str, Mapping[str, Any]] | None = None,
    on_method: Callable[[GenerationFaithfulness], None] | None = None,
    answers: Sequence[Sequence[int]] | None = None,
) -> GenerationFaithfulness:
    """The document view: each chat's greedy answer split into sentences; per method, each sentence's documents
    ranked (:func:`explainers.explain_citations`, the answer given); then for each ``k`` the sentence's ``k``
    highest-ranked documents are removed (:func:`prompt_without`) and the fall of its summed log-probability
    measured, teacher-forced. ``random`` ranks each sentence's documents in a seeded random order. A chat with no
    more than ``k`` documents is left out at that ``k``; statistics as in :func:`explain_eval.results.summarise`
    (a chat's sentences averaged first).

    Args:
        model: the causal LM (eager attention).
        tokenizer: its fast tokenizer with a chat template.
        items: the chats.
        methods: the methods (and ``random``).
        name: the model's name in the table.
        new_tokens: the most tokens of an answer.
        ks: how many documents a sentence loses, each ``>= 1``.
        seed: seed of the random ranking.
        options: each method's options.
        on_method: called with the result so far after each method.
        answers: each chat's answer as token ids, instead of generating (``new_tokens`` is then not used).

    Raises:
        ValueError: for a ``k`` below 1, or answers for another number of chats.
        ExplainError: for a method the model refuses, or a chat it cannot render.
    """
    from explainers import answer_sentences, decoded_offsets, explain_citations
    from explainers.tasks.continuation import generate_continuation

    if any(k < 1 for k in ks):
        raise ValueError(f"every k must be at least 1, got {list(ks)}")
    if answers is not None and len(answers) != len(items):
        raise ValueError(f"{len(answers)} answers for {len(items)} chats")
    started = time.perf_counter()
    answers_read: list[tuple[tuple[int, ...], list[tuple[int, int]], str]] = []  # ids, sentences' steps, text
    special = set(tokenizer.all_special_ids)
    for index, item in enumerate(items):
        if answers is None:
            ids = torch.tensor([list(render_chat(tokenizer, item.messages, item.documents).input_ids)])
            inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
            tokens = generate_continuation(model, inputs, new_tokens).tokens[0].tolist()
        else:
            tokens = [int(token) for token in answers[index]]
        tokens = tokens[: next((i for i, token in enumerate(tokens) if token in special), len(tokens))]  # to EOS
        text, offsets = decoded_offsets(tokenizer, tokens)
        answers_read.append((tuple(tokens), [s.steps for s in answer_sentences(text, offsets)], text))
    seconds = {"generate": round(time.perf_counter() - started, 3)}
    cache: dict[tuple[int, tuple[int, ...]], Tensor] = {}

    def values(row: int, removed: tuple[int, ...]) -> Tensor:
        if (row, removed) not in cache:
            item = items[row]
            prompt = prompt_without(tokenizer, item.messages, item.documents, removed)
            ids, spans, _ = answers_read[row]
            cache[(row, removed)] = span_log_probabilities(model, [prompt], ids, spans)[0]
        return cache[(row, removed)]

    rows = [row for row, (_, spans, _) in enumerate(answers_read) if spans]
    full = {row: values(row, ()) for row in rows}
    generator = torch.Generator().manual_seed(seed)
    per_method: dict[str, dict[int, dict[int, list[float]]]] = {}

    def result() -> GenerationFaithfulness:
        table = summary_table(per_method, ks)
        return GenerationFaithfulness(
            model=name, prompts=[item.title for item in items], continuations=[text for _, _, text in answers_read],
            new_tokens=new_tokens, steps=sum(len(answers_read[row][1]) for row in rows), ks=list(ks),
            mean_log_probability=float(torch.cat([full[row] for row in rows]).mean()) if rows else math.nan,
            drops=table, seconds=dict(seconds), removal=DOCUMENT_REMOVAL, view="document",
        )  # fmt: skip

    for method in sorted(methods, key=lambda method: method != RANDOM):
        started = time.perf_counter()
        rankings: dict[int, list[list[int]]] = {}
        for row in rows:
            item = items[row]
            count = len(item.documents)
            if method == RANDOM:
                rankings[row] = [torch.randperm(count, generator=generator).tolist() for _ in answers_read[row][1]]
            else:
                answer = list(answers_read[row][0])
                cited = explain_citations(model, tokenizer, item.messages, item.documents, answer=answer,
                                          method=method, options=(options or {}).get(method))  # fmt: skip
                rankings[row] = [[document for document, _ in ranked] for ranked in cited.documents]
        seconds[method] = round(time.perf_counter() - started, 3)
        per_method[method] = {}
        for k in ks:
            drops: dict[int, list[float]] = {}
            for row in rows:
                if len(items[row].documents) <= k:
                    continue
                drops[row] = [
                    float(full[row][sentence] - values(row, tuple(sorted(ranking[:k])))[sentence])
                    for sentence, ranking in enumerate(rankings[row])
                ]
            per_method[method][k] = drops
        if on_method is not None:
            on_method(result())
    return result()
