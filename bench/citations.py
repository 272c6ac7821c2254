"""Citations: do the documents each method ranks first for a sentence of an answer match the documents the sentence
really depends on, and how long does it take?

On retrieval items (``bench/data/citation_items.json``: a question and 3 to 8 passages of invented facts, one of which
holds the answer, at varied positions), asked as one user message through the model's chat template with the passages
as ``documents`` (:func:`explainers.render_chat`):

- **the answer**: the demo ``writer`` (SmolLM2-135M-Instruct, ``make writer``) writes it, greedy, and it is cut after
  its third sentence; a model with random weights (the tiny models) is given the item's three-sentence reference
  answer instead. The answer is then held fixed: every measure below reads the same tokens (teacher-forced);
- **leave-one-document-out** (the reference): for sentence ``s`` and document ``j``, the fall of ``s``'s summed
  log-probability when ``j`` alone is removed from the prompt (rendered again without it, the others renumbered:
  :mod:`explain_eval.documents`) — the quantity ContextCite's surrogate estimates;
- **each method**: :func:`explainers.explain_citations` on the given answer (one forward for the whole answer, the
  sentences' objectives batched in one backward), each sentence's documents ranked by the sum of its scores over each
  document's tokens; compared with leave-one-out per sentence: **top-1 agreement** (the method's best document is
  leave-one-out's) and **Spearman's rank correlation** over the documents; and the passage holding the answer ranked
  first (``top-1 = answer passage``), for the reference too;
- **ContextCite** (``--context-cite``; pip ``context-cite``, the ``bench`` extra): ``ContextCiter`` on the same model,
  the same prompt (its prompt template and a partitioner whose sources are the documents, checked to give the same
  token ids) and the same answer (its output set to the prompt and our answer, so it generates nothing), at its
  defaults (64 ablations, keep probability 0.5, batch size 1, LASSO): its weights per sentence, compared the same way;
- **time per answer**: wall seconds of each method's :func:`~explainers.explain_citations` call for the whole answer
  (all its sentences) and of ContextCite's ablations and fits for all its sentences; generation is left out of both.
  ``speed-up`` is the median over answers of ContextCite's time divided by the method's (timed one after the other on
  the same answer, so load changes mostly cancel).

Agreement is meaningful on the writer only: the tiny models of every decoder family (2 layers, width 64, random
weights, the writer's tokenizer and chat template) are there to show that every family runs the same path and how
the cost scales, not to rank methods.

    python -m bench.citations --context-cite                       # writer + tiny models, all items
    python -m bench.citations --models writer --items 4 --methods attnlrp grad_x_input --context-cite
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from explain_eval.documents import prompt_without, span_log_probabilities
from explain_eval.provenance import machine
from explain_eval.results import finite_or_lowest, mean_and_stderr, mean_or_nan
from explainers import FAMILIES, Sentence, answer_sentences, decoded_offsets, explain_citations, render_chat

log = logging.getLogger("bench.citations")

ITEMS_FILE = Path(__file__).parent / "data" / "citation_items.json"
#: What the user asks after the question (the documents block comes before it).
INSTRUCTION = "Answer in three short sentences, using the documents."
#: How many sentences of a written answer are kept.
SENTENCES = 3
DEFAULT_METHODS = (
    "attnlrp",
    "cp_lrp",
    "grad_x_input",
    "gradient",
    "integrated_gradients",
    "gae",
    "attention",
    "rollout",
)
#: Options that keep the methods with forwards of their own affordable on a CPU (``--option`` overrides).
FAST_OPTIONS: dict[str, dict[str, Any]] = {"integrated_gradients": {"n_steps": 8}, "smoothgrad": {"n_samples": 8}}
#: The decoder families, whose causal LMs :func:`tiny_model` builds (the families with a causal LM class).
TINY_FAMILIES = tuple(model_type for model_type, known in FAMILIES.items() if known.causal_lm_classes)
CONTEXT_CITE = "ContextCite"
LEAVE_ONE_OUT = "leave-one-out"


@dataclass(frozen=True)
class RetrievalItem:
    """A question, its passages and which one holds the answer.

    Attributes:
        question: the question.
        documents: ``{"title", "text"}`` passages.
        answer_document: the index of the passage that holds the answer.
        reference_answer: a three-sentence answer from that passage (for models that cannot write one).
    """

    question: str
    documents: tuple[dict[str, str], ...]
    answer_document: int
    reference_answer: str

    @property
    def query(self) -> str:
        """The user's text after the documents block."""
        return f"{self.question} {INSTRUCTION}"

    def messages(self) -> list[dict[str, str]]:
        """The chat: one user message (the documents go at its start: :func:`explainers.render_chat`)."""
        return [{"role": "user", "content": self.query}]


def load_items(path: Path = ITEMS_FILE, limit: int | None = None) -> list[RetrievalItem]:
    """The items of ``path`` (the first ``limit``).

    Raises:
        ValueError: for an item whose ``answer_document`` is not one of its documents.
    """
    items = []
    for raw in json.loads(path.read_text(encoding="utf-8"))["items"][:limit]:
        item = RetrievalItem(raw["question"], tuple(raw["documents"]), raw["answer_document"], raw["reference_answer"])
        if not 0 <= item.answer_document < len(item.documents):
            raise ValueError(f"{item.question!r}: answer_document {item.answer_document} is not one of its documents")
        items.append(item)
    return items


# --- the reference and the agreement maths ---------------------------------------------------------------------------


def leave_one_out(
    model: nn.Module,
    tokenizer: Any,
    messages: Sequence[Any],
    documents: Sequence[Any],
    answer_ids: Sequence[int],
    spans: Sequence[tuple[int, int]],
    chat_template: str | None = None,
) -> Tensor:
    """Leave-one-document-out: ``drops[s, j]`` = span ``s``'s summed log-probability after the full prompt minus
    after the prompt without document ``j`` (the answer teacher-forced; positive: ``j`` supports ``s``).

    Args:
        model: the causal LM.
        tokenizer: its fast tokenizer.
        messages: the chat.
        documents: the documents.
        answer_ids: the answer's tokens.
        spans: each span's steps ``(start, stop)``.
        chat_template: a chat template instead of the tokenizer's.

    Returns:
        ``(len(spans), len(documents))`` float64.
    """
    prompts = [prompt_without(tokenizer, messages, documents, (), chat_template=chat_template)]
    prompts += [
        prompt_without(tokenizer, messages, documents, (index,), chat_template=chat_template)
        for index in range(len(documents))
    ]
    values = span_log_probabilities(model, prompts, answer_ids, spans)
    return (values[0][None, :] - values[1:]).T.contiguous()


def average_ranks(values: Sequence[float]) -> list[float]:
    """The rank of each value, 1 for the lowest; tied values share the mean of their ranks."""
    order = sorted(range(len(values)), key=lambda index: values[index])
    ranks = [0.0] * len(values)
    start = 0
    while start < len(order):
        stop = start
        while stop + 1 < len(order) and values[order[stop + 1]] == values[order[start]]:
            stop += 1
        for position in range(start, stop + 1):
            ranks[order[position]] = (start + stop) / 2 + 1
        start = stop + 1
    return ranks


def spearman(first: Sequence[float], second: Sequence[float]) -> float:
    """Spearman's rank correlation (the Pearson correlation of the average ranks); NaN when either is constant.

    Raises:
        ValueError: for sequences of different lengths.
    """
    if len(first) != len(second):
        raise ValueError(f"{len(first)} values against {len(second)}")
    a, b = average_ranks(first), average_ranks(second)
    mean_a, mean_b = statistics.fmean(a), statistics.fmean(b)
    covariance = sum((x - mean_a) * (y - mean_b) for x, y in zip(a, b, strict=True))
    spread = math.sqrt(sum((x - mean_a) ** 2 for x in a) * sum((y - mean_b) ** 2 for y in b))
    return covariance / spread if spread > 0 else math.nan


def top_document(scores: Sequence[float]) -> int:
    """The index of the highest score (ties: the lowest index, as :func:`explainers.cite` ranks)."""
    return min(range(len(scores)), key=lambda index: (-scores[index], index))


def document_matrix(ranked: Sequence[Sequence[tuple[int, float]]], documents: int) -> Tensor:
    """Citations (per sentence, ``(document, score)`` pairs in any order) as a ``(sentences, documents)`` matrix."""
    matrix = torch.zeros((len(ranked), documents), dtype=torch.float64)
    for sentence, pairs in enumerate(ranked):
        for document, score in pairs:
            matrix[sentence, document] = score
    return matrix


@dataclass
class Agreement:
    """Per sentence: whether the best documents agree, and the rank correlation over the documents."""

    top1: list[bool] = field(default_factory=list)
    spearman: list[float] = field(default_factory=list)

    def extend(self, other: Agreement) -> None:
        """Add another answer's sentences."""
        self.top1 += other.top1
        self.spearman += other.spearman


def agreement(scores: Tensor, reference: Tensor) -> Agreement:
    """Compare each sentence's document scores (``(sentences, documents)``) with the reference's.

    Raises:
        ValueError: for matrices of different shapes.
    """
    if scores.shape != reference.shape:
        raise ValueError(f"scores {tuple(scores.shape)} and reference {tuple(reference.shape)} differ")
    result = Agreement()
    for mine, theirs in zip(scores.tolist(), reference.tolist(), strict=True):
        result.top1.append(top_document(mine) == top_document(theirs))
        result.spearman.append(spearman(mine, theirs))
    return result


# --- answers ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    """An answer held fixed: its tokens, text and sentences (their characters and steps)."""

    ids: tuple[int, ...]
    text: str
    sentences: tuple[Sentence, ...]

    @property
    def spans(self) -> list[tuple[int, int]]:
        """Each sentence's steps."""
        return [sentence.steps for sentence in self.sentences]


def answer_of(tokenizer: Any, ids: Sequence[int], sentences: int | None = None) -> Answer:
    """The answer of tokens ``ids``, cut after its ``sentences``-th sentence (``None``: whole)."""
    text, offsets = decoded_offsets(tokenizer, list(ids))
    found = answer_sentences(text, offsets)
    if sentences is not None and len(found) > sentences:
        ids = list(ids)[: found[sentences - 1].steps[1]]
        text, offsets = decoded_offsets(tokenizer, ids)
        found = answer_sentences(text, offsets)
    return Answer(tuple(int(token) for token in ids), text, tuple(found))


def written_answer(model: nn.Module, tokenizer: Any, item: RetrievalItem, max_new_tokens: int) -> Answer:
    """The model's greedy answer, cut after its third sentence (an EOS left out)."""
    from explainers.tasks.continuation import generate_continuation

    ids = torch.tensor([list(render_chat(tokenizer, item.messages(), item.documents).input_ids)])
    made = generate_continuation(model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, max_new_tokens)
    tokens = made.tokens[0][made.token_mask[0]].tolist()
    special = set(tokenizer.all_special_ids)
    while tokens and tokens[-1] in special:
        tokens.pop()
    return answer_of(tokenizer, tokens, SENTENCES)


def reference_answer(tokenizer: Any, item: RetrievalItem) -> Answer:
    """The item's reference answer, tokenized without special tokens."""
    return answer_of(tokenizer, tokenizer(item.reference_answer, add_special_tokens=False)["input_ids"])


# --- ContextCite -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ContextCiteRun:
    """ContextCite's weights per sentence, its time, and whether it read the same prompt and answer tokens."""

    scores: Tensor
    seconds: float
    same_prompt: bool
    same_answer: bool


def context_cite(
    model: nn.Module, tokenizer: Any, item: RetrievalItem, answer: Answer, ablations: int = 64
) -> ContextCiteRun:
    """ContextCite (pip ``context-cite``) on ``item``'s prompt and the fixed ``answer``: its sources are the
    documents (a partitioner whose context is the documents block of :mod:`explainers.chat`, so its prompt is the one
    :func:`explainers.render_chat` renders), its other settings its defaults.

    Raises:
        ImportError: when ``context-cite`` is not installed.
    """
    from context_cite import ContextCiter
    from context_cite.context_partitioner import BaseContextPartitioner

    from explainers.chat import check_documents, documents_block

    documents = check_documents(item.documents)

    class DocumentSources(BaseContextPartitioner):  # type: ignore[misc,unused-ignore]
        """Each document one source; an ablated context is the documents block of the documents kept."""

        def __init__(self) -> None:
            super().__init__(documents_block(documents)[0])

        @property
        def num_sources(self) -> int:
            return len(documents)

        def split_context(self) -> None:
            return None

        def get_source(self, index: int) -> str:
            return documents[index].text

        def get_context(self, mask: Any = None) -> str:
            kept = [doc for doc, keep in zip(documents, mask, strict=True) if keep] if mask is not None else documents
            return documents_block(kept)[0]

    started = time.perf_counter()
    sources = DocumentSources()
    citer = ContextCiter(
        model, tokenizer, sources.context, item.query, num_ablations=ablations, partitioner=sources,
        prompt_template="{context}\n\n{query}",
    )  # fmt: skip
    prompt_ids, prompt = citer._get_prompt_ids(return_prompt=True)
    citer._cache["output"] = prompt + answer.text  # the answer held fixed: ContextCite generates nothing
    shift = citer.response.find(answer.text)
    rows = []
    for sentence in answer.sentences:
        rows.append(torch.tensor(citer.get_attributions(shift + sentence.start, shift + sentence.end, verbose=False)))
    seconds = time.perf_counter() - started
    ours = render_chat(tokenizer, item.messages(), item.documents).input_ids
    return ContextCiteRun(
        torch.stack(rows).double(),
        seconds,
        tuple(prompt_ids) == tuple(ours),
        tuple(citer._response_ids) == answer.ids,
    )


# --- models ----------------------------------------------------------------------------------------------------------


def load_tokenizer(folder: Path) -> Any:
    """The writer's fast tokenizer, as :func:`explain_eval.generation.load_causal_lm` sets it up (left padding, the
    EOS token as pad token if it has none)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def tiny_model(family: str, tokenizer: Any, seed: int = 0) -> nn.Module:
    """A random 2-layer causal LM of ``family`` (width 64, 4 heads) over ``tokenizer``'s vocabulary, eager attention,
    float32, eval mode."""
    import transformers

    model_class = getattr(transformers, FAMILIES[family].causal_lm_classes[0])
    ids = {
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    if family == "gpt2":
        config = model_class.config_class(vocab_size=len(tokenizer), n_embd=64, n_layer=2, n_head=4, n_positions=1024,
                                          **ids)  # fmt: skip
    else:
        config = model_class.config_class(
            vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=1024, **ids,
        )  # fmt: skip
        if hasattr(config, "sliding_window"):
            config.sliding_window = 1024
        if family == "gemma2":
            config.query_pre_attn_scalar = 16
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    return model_class(config).eval()


# --- the run ---------------------------------------------------------------------------------------------------------


@dataclass
class MethodResult:
    """One method's (or the reference's, or ContextCite's) numbers over a model's answers."""

    agreement: Agreement = field(default_factory=Agreement)
    answer_passage: list[bool] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    speedup: list[float] = field(default_factory=list)
    sentences: list[int] = field(default_factory=list)

    def summary(self) -> dict[str, float]:
        """Means over sentences (agreement) and answers (time), medians of the speed-ups."""
        rhos = [value for value in self.agreement.spearman if not math.isnan(value)]
        three = [seconds for seconds, count in zip(self.seconds, self.sentences, strict=True) if count == SENTENCES]
        spearman, spearman_stderr = mean_and_stderr(rhos)
        return {
            "top1": mean_or_nan([float(flag) for flag in self.agreement.top1]),
            "spearman": spearman,
            "spearman_stderr": spearman_stderr,
            "spearman_undefined": len(self.agreement.spearman) - len(rhos),
            "answer_passage": mean_or_nan([float(flag) for flag in self.answer_passage]),
            "seconds": mean_or_nan(self.seconds),
            "seconds_three": mean_or_nan(three),
            "speedup": statistics.median(self.speedup) if self.speedup else math.nan,
            "sentences": len(self.agreement.top1),
        }


def run_model(
    name: str,
    model: nn.Module,
    tokenizer: Any,
    items: Sequence[RetrievalItem],
    methods: Sequence[str],
    *,
    write: bool,
    max_new_tokens: int,
    with_context_cite: bool,
    ablations: int,
    options: dict[str, dict[str, Any]],
    on_item: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Every item on one model: the answer, leave-one-out, each method and ContextCite (see the module docstring);
    ``on_item`` gets the run so far after each item (a run cut short keeps the items it finished)."""
    results: dict[str, MethodResult] = {name: MethodResult() for name in (LEAVE_ONE_OUT, *methods)}
    if with_context_cite:
        results[CONTEXT_CITE] = MethodResult()
    answers: list[dict[str, Any]] = []
    checks = {"context_cite_same_prompt": 0, "context_cite_same_answer": 0, "context_cite_all_zero": 0}

    def snapshot() -> dict[str, Any]:
        return {
            "model": name,
            "answers": list(answers),
            "checks": dict(checks),
            "results": {method: result.summary() for method, result in results.items()},
        }

    for number, item in enumerate(items):
        answer = written_answer(model, tokenizer, item, max_new_tokens) if write else reference_answer(tokenizer, item)
        answers.append({"question": item.question, "documents": len(item.documents), "answer": answer.text,
                        "sentences": len(answer.sentences)})  # fmt: skip
        if not answer.sentences:
            log.warning("%s: item %d: the answer has no sentence (%r): skipped", name, number, answer.text)
            continue
        started = time.perf_counter()
        reference = leave_one_out(model, tokenizer, item.messages(), item.documents, answer.ids, answer.spans)
        loo_seconds = time.perf_counter() - started
        _record(results[LEAVE_ONE_OUT], reference, reference, item, loo_seconds, len(answer.sentences))
        cc_seconds = math.nan
        if with_context_cite:
            run = context_cite(model, tokenizer, item, answer, ablations)
            cc_seconds = run.seconds
            checks["context_cite_same_prompt"] += int(run.same_prompt)
            checks["context_cite_same_answer"] += int(run.same_answer)
            checks["context_cite_all_zero"] += int((run.scores == 0).all(dim=-1).sum())
            _record(results[CONTEXT_CITE], run.scores, reference, item, cc_seconds, len(answer.sentences))
        results[LEAVE_ONE_OUT].speedup.append(cc_seconds / loo_seconds)
        for method in methods:
            started = time.perf_counter()
            cited = explain_citations(model, tokenizer, item.messages(), item.documents, answer=list(answer.ids),
                                      method=method, options=options.get(method))  # fmt: skip
            seconds = time.perf_counter() - started
            if [sentence.steps for sentence in cited.sentences] != answer.spans:
                raise RuntimeError(f"{name}: the citations' sentences differ from the answer's ({answer.text!r})")
            scores = document_matrix(cited.documents, len(item.documents))
            _record(results[method], scores, reference, item, seconds, len(answer.sentences))
            results[method].speedup.append(cc_seconds / seconds)
        log.info("%s: item %d/%d (%d passages, %d sentences): %s", name, number + 1, len(items), len(item.documents),
                 len(answer.sentences), "; ".join(f"{key} {value.seconds[-1]:.2f} s" for key, value in results.items()
                                                  if value.seconds))  # fmt: skip
        if on_item is not None:
            on_item(snapshot())
    return snapshot()


def _record(
    result: MethodResult, scores: Tensor, reference: Tensor, item: RetrievalItem, seconds: float, sentences: int
) -> None:
    result.agreement.extend(agreement(scores, reference))
    result.answer_passage += [top_document(row) == item.answer_document for row in scores.tolist()]
    result.seconds.append(seconds)
    result.sentences.append(sentences)


# --- the report ------------------------------------------------------------------------------------------------------


def markdown_table(run: dict[str, Any]) -> str:
    """One model's table: agreement with leave-one-out, the answer passage first, time per answer, speed-up."""
    answers = [answer for answer in run["answers"] if answer["sentences"]]
    counts = [answer["sentences"] for answer in answers]
    lines = [
        f"**{run['model']}**: {len(answers)} answers, {sum(counts)} sentences ({counts.count(SENTENCES)} answers of "
        f"three sentences), {min((a['documents'] for a in answers), default=0)}-"
        f"{max((a['documents'] for a in answers), default=0)} passages",
        "",
        "| method | top-1 = leave-one-out | Spearman rho (± s.e.) | top-1 = answer passage | s per answer | "
        "s per 3-sentence answer | ContextCite time / method time |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    ranked = sorted(
        run["results"].items(), key=lambda item: (item[0] != LEAVE_ONE_OUT, -finite_or_lowest(item[1]["top1"]))
    )
    for method, row in ranked:
        undefined = f" ({row['spearman_undefined']} undefined)" if row["spearman_undefined"] else ""
        speedup = "-" if method == CONTEXT_CITE or math.isnan(row["speedup"]) else f"{row['speedup']:.1f}x"
        lines.append(
            f"| {method} | {row['top1']:.2f} | {row['spearman']:.2f} ± {row['spearman_stderr']:.2f}{undefined} | "
            f"{row['answer_passage']:.2f} | {row['seconds']:.2f} | {row['seconds_three']:.2f} | {speedup} |"
        )
    return "\n".join(lines)


NOTE = """Citations against leave-one-document-out (`bench/citations.py`). For each sentence of an answer, each
method ranks the documents by the sum of the sentence's scores over each document's tokens (`explain_citations`, the
answer given); the reference is the fall of the sentence's summed log-probability when one document is removed from
the prompt (re-rendered without it, answer teacher-forced). `top-1 = leave-one-out`: the share of sentences whose best
document is the reference's; Spearman's rho over the documents, mean over sentences (undefined where a ranking is
constant, e.g. ContextCite's LASSO setting every weight to 0); `top-1 = answer passage`: the share of sentences whose
best document is the passage that holds the answer. Times per answer exclude generation; the last column is the median
over answers of ContextCite's time (64 ablations, its defaults) over the method's, timed on the same answer. The
writer (SmolLM2-135M-Instruct) writes its answers (greedy, cut after three sentences); the tiny models have random
weights and read the items' reference answers: their agreement says nothing about the methods, only their times do."""


def write_report(
    runs: Sequence[dict[str, Any]],
    out: Path,
    command: str,
    started: str,
    finished_load: str,
    included: Sequence[dict[str, Any]] = (),
) -> None:
    """``out`` (Markdown: note, date, command, machine, one table per model; then the runs of ``included`` reports,
    each with its own date, command and machine) and ``out`` with ``.json``."""
    start = f"{machine()}; load average {os.getloadavg()[0]:.1f}"
    this = {"command": command, "date": started, "machine": start, "end": finished_load, "runs": list(runs)}
    write_reports([this, *included], out)


def write_reports(reports: Sequence[dict[str, Any]], out: Path) -> None:
    """Reports (each ``command``, ``date``, ``machine``, ``end``, ``runs``) as one Markdown file and its ``.json``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    parts = ["# Citations: agreement with leave-one-document-out, and time", "", NOTE]
    for report in reports:
        parts += ["", f"Run {report['date']} (UTC): `{report['command']}`", ""]
        parts += [f"Machine: {report['machine']} at the start; {report.get('end', '?')} at the end."]
        for run in report["runs"]:
            parts += ["", markdown_table(run)]
            checks = run["checks"]
            if any(checks.values()):
                parts += [
                    "",
                    f"ContextCite read the same prompt tokens on {checks['context_cite_same_prompt']} answers and the "
                    f"same answer tokens on {checks['context_cite_same_answer']} (of {len(run['answers'])}); its "
                    f"weights were all 0 for {checks['context_cite_all_zero']} sentences.",
                ]
    out.write_text("\n".join(parts) + "\n", encoding="utf-8")
    document = {**reports[0], "included": list(reports[1:])}
    out.with_suffix(".json").write_text(json.dumps(document, indent=1), encoding="utf-8")


def reports_in(path: Path) -> list[dict[str, Any]]:
    """The report of a ``.json`` file this benchmark wrote, and the reports it included."""
    document = json.loads(path.read_text(encoding="utf-8"))
    return [{key: value for key, value in document.items() if key != "included"}, *document.get("included", [])]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark, print the tables and write the report."""
    parser = argparse.ArgumentParser(prog="python -m bench.citations", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["writer", *TINY_FAMILIES],
                        help="writer and/or tiny families (default: all)")  # fmt: skip
    parser.add_argument("--writer", type=Path, default=Path("model_store/build/writer/model"),
                        help="the writer's folder (its tokenizer serves the tiny models too)")  # fmt: skip
    parser.add_argument("--items", type=int, help="the first N items (default: all)")
    parser.add_argument("--items-file", type=Path, default=ITEMS_FILE)
    parser.add_argument("--methods", nargs="+", default=list(DEFAULT_METHODS))
    parser.add_argument("--option", action="append", default=[], metavar="METHOD.KEY=VALUE")
    parser.add_argument("--context-cite", action="store_true", help="run ContextCite too (pip install context-cite)")
    parser.add_argument("--ablations", type=int, default=64, help="ContextCite's ablations (default: its 64)")
    parser.add_argument("--max-new-tokens", type=int, default=80)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("docs/results/citations.md"))
    parser.add_argument(
        "--include",
        type=Path,
        action="append",
        default=[],
        help="add the runs of an earlier report's .json after this run's (its own command and date)",
    )
    parser.add_argument("--merge-only", action="store_true", help="run nothing: write the --include reports as one")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    included = [report for path in args.include for report in reports_in(path)]
    if args.merge_only:
        write_reports(included, args.out)
        print(f"wrote {args.out} and {args.out.with_suffix('.json')} from {len(included)} reports")
        return 0
    torch.set_num_threads(args.threads)
    from explain_eval.generation import load_causal_lm, parse_options

    options = {method: dict(values) for method, values in FAST_OPTIONS.items()}
    for method, values in parse_options(args.option).items():
        options.setdefault(method, {}).update(values)
    unknown = sorted(set(args.models) - {"writer", *TINY_FAMILIES})
    if unknown:
        parser.error(f"unknown models {unknown}: writer, {', '.join(TINY_FAMILIES)}")
    if not (args.writer / "tokenizer.json").is_file():
        parser.error(f"{args.writer} has no tokenizer.json: build the writer (make writer) or pass --writer")
    if "writer" in args.models and not (args.writer / "config.json").is_file():
        parser.error(f"{args.writer} has no config.json: build the writer (make writer) or pass --writer")
    items = load_items(args.items_file, args.items)
    command = "python -m bench.citations " + " ".join(argv if argv is not None else sys.argv[1:])
    started = datetime.now(UTC).strftime("%Y-%m-%d %H:%M")
    runs: list[dict[str, Any]] = []
    tokenizer = load_tokenizer(args.writer)
    for name in args.models:
        model = load_causal_lm(args.writer)[0] if name == "writer" else tiny_model(name, tokenizer)

        def save(partial: dict[str, Any]) -> None:
            load = os.getloadavg()
            write_report([*runs, partial], args.out, command, started, f"load average {load[0]:.1f}", included)

        run = run_model(
            name if name == "writer" else f"tiny {name}", model, tokenizer, items, args.methods, write=name == "writer",
            max_new_tokens=args.max_new_tokens, with_context_cite=args.context_cite, ablations=args.ablations,
            options=options, on_item=save,
        )  # fmt: skip
        print(markdown_table(run), flush=True)
        save(run)
        runs.append(run)
    print(f"wrote {args.out} and {args.out.with_suffix('.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
