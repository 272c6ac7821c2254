"""``explain-eval --generation``: which explanation method is faithful for generated text?

On a causal LM folder and a list of prompts: generate ``T`` greedy tokens once (the service's own loop,
:func:`explainers.tasks.continuation.generate_continuation`), explain every step with each method
(:func:`explainers.tasks.generation.explain_continuation` on that same continuation), then for each step remove the
``k`` prompt tokens that the method scores highest for that step and measure how much **that step's token's
log-probability** falls, teacher-forced on the same continuation. A faithful method picks the tokens the step
depends on, so its drop is large; a seeded ``random`` ranking of the same prompt tokens is the reference.

Removal (stated wherever results are shown): the chosen prompt tokens are **deleted** (the prompt's other tokens keep
their order, positions are counted again from 0, as if the prompt had been written without them); the continuation
before the step is kept as generated, and only prompt tokens are candidates (special tokens never are). A step whose
prompt has no more than ``k`` candidate tokens is left out at that ``k`` (nothing would be left to read).

Views (``--view``): ``token`` (the above); ``word``: a step loses its ``k`` highest-scored prompt *words* (the prompt's
words as :func:`explainers.token_units` groups them, a word's score the sum of its tokens' scores), every token of
them, and ``random`` ranks the words at random; ``document`` (:mod:`explain_eval.documents`): on chats with documents,
each sentence of the greedy answer loses its ``k`` highest-ranked documents (its citations, from
:func:`explainers.explain_citations`), the chat is rendered again without them, and the fall of the sentence's summed
log-probability is measured, against a random order of the documents.

Statistics: a step's drop is ``log p(token | prompt, earlier tokens) - log p(token | prompt minus the k tokens,
earlier tokens)``; each prompt's steps are averaged first (steps of one prompt are not independent), and the table
gives the mean over prompts ± its standard error, and the paired difference to ``random`` (mean ± standard error over
prompts). Example::

    explain-eval --generation --model-dir model_store/build/writer/model --n 10 --new-tokens 8 --out writer-faith
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from .documents import evaluate_documents, read_items
from .faithfulness import candidate_ranks
from .results import RANDOM, REMOVAL, GenerationFaithfulness, finite_or_lowest, summary_table

logger = logging.getLogger(__name__)

#: The methods that explain generation (``relevance`` is refused for causal LMs), in the docs' order.
GENERATION_METHODS = ("attention", "rollout", "gae", "grad_x_input", "integrated_gradients", "attnlrp", "cp_lrp")
VIEWS = ("token", "word", "document")
DEFAULT_KS = (1, 2, 4)
DEFAULT_NEW_TOKENS = 8
WORD_REMOVAL = (
    "every token of the step's k highest-scored prompt words deleted (a word's score: the sum of its tokens'; the rest "
    "of the prompt packed, positions from 0), the continuation before the step kept; teacher-forced"
)
#: Short prompts of everyday English (the default ``--prompts``): each has at least 5 tokens, so ``k = 4`` leaves one.
DEFAULT_PROMPTS = (
    "The capital of France is",
    "My favourite season of the year is autumn because",
    "The flight was delayed for three hours, so the airline",
    "To make a cup of tea, first boil the",
    "The doctor told the patient that he should",
    "After the football match, the fans went to the",
    "The best thing about living near the sea is",
    "She opened the old wooden box and found a",
    "The new phone has a great camera, but the battery",
    "Water boils at a temperature of one hundred degrees",
    "In the morning, I usually drink a glass of",
    "The children played in the park until it started to",
    "The recipe needs two eggs, a cup of flour and",
    "He missed the last train home, so he had to",
    "The museum is closed on Mondays, but on Sundays it",
    "Paris is famous for the Eiffel Tower, and London is famous for",
    "The teacher asked the students to open their books and",
    "When the power went out, we lit a few",
    "The hotel room was clean, but the bed was too",
    "Once upon a time, in a small village, there lived a",
)


def top_k_removals(scores: Tensor, candidates: Tensor, k: int) -> Tensor:
    """Which prompt positions each step loses: its ``k`` highest-scored candidates (ties: the earlier first).

    Args:
        scores: ``(batch, T, P)`` each step's scores over the prompt positions.
        candidates: ``(batch, P)`` bool, the removable prompt tokens.
        k: how many to remove (``k >= 1``).

    Returns:
        ``(batch, T, P)`` bool, ``True`` = removed; a row with no more than ``k`` candidates loses none (see
        :func:`enough_candidates`).
    """
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    batch, steps, width = scores.shape
    if candidates.shape != (batch, width):
        raise ValueError(f"candidates {tuple(candidates.shape)} must be (batch, P) = {(batch, width)}")
    expanded = candidates.bool()[:, None, :].expand(batch, steps, width)
    ranks = candidate_ranks(scores.reshape(batch * steps, width), expanded.reshape(batch * steps, width), True)
    removed = (ranks.reshape(batch, steps, width) < k) & expanded
    return removed & enough_candidates(candidates, k)[:, None, None]


def prompt_words(tokenizer: Any, prompts: Sequence[str], prompt_ids: Tensor, candidates: Tensor) -> Tensor:
    """Which word of its prompt each prompt position belongs to (:func:`explainers.token_units`, granularity
    ``word``), ``-1`` where nothing may be removed (padding, special tokens).

    Args:
        tokenizer: the fast tokenizer the prompts were encoded with.
        prompts: the prompt texts.
        prompt_ids: ``(batch, P)`` the left-padded prompts.
        candidates: ``(batch, P)`` bool, the removable tokens.

    Returns:
        ``(batch, P)`` long: word indices counted from 0 in each row.

    Raises:
        ValueError: if a prompt's tokens are not the row's (another tokenization than the one generated after).
    """
    from explainers import token_units

    words = torch.full(prompt_ids.shape, -1, dtype=torch.long)
    width = prompt_ids.shape[1]
    for row, prompt in enumerate(prompts):
        encoded = tokenizer(prompt, return_offsets_mapping=True)
        ids = list(encoded["input_ids"])
        if prompt_ids[row, width - len(ids) :].tolist() != ids:
            raise ValueError(f"prompt {row} is not tokenized as the row the model read")
        offsets = [(int(a), int(b)) if b > a else None for a, b in encoded["offset_mapping"]]
        start = width - len(ids)
        for index, unit in enumerate(token_units(prompt, offsets, "word")):
            for token in unit.tokens:
                if bool(candidates[row, start + token]):
                    words[row, start + token] = index
    present = words >= 0
    for row in range(words.shape[0]):  # renumber each row's removable words 0, 1, ...
        kept = words[row][present[row]]
        if kept.numel():
            words[row][present[row]] = torch.unique(kept, return_inverse=True)[1]
    return words


def word_scores(scores: Tensor, words: Tensor) -> Tensor:
    """``(batch, T, W)`` each step's score of each word: the sum of its tokens' (``W``: the most words of a row).

    Args:
        scores: ``(batch, T, P)``.
        words: ``(batch, P)`` from :func:`prompt_words`.
    """
    batch, steps, width = scores.shape
    count = max(int(words.max()) + 1, 1)
    valid = (words >= 0)[:, None, :].expand(batch, steps, width)
    index = words.clamp(min=0)[:, None, :].expand(batch, steps, width)
    summed = scores.new_zeros((batch, steps, count))
    return summed.scatter_add_(-1, index, scores.masked_fill(~valid, 0))


def top_k_word_removals(scores: Tensor, words: Tensor, k: int) -> Tensor:
    """Which prompt positions each step loses: every token of its ``k`` highest-scored words (ties: the earlier word).

    Args:
        scores: ``(batch, T, W)`` word scores (:func:`word_scores`).
        words: ``(batch, P)`` from :func:`prompt_words`.
        k: how many words to remove (``k >= 1``).

    Returns:
        ``(batch, T, P)`` bool; a row with no more than ``k`` words loses none.
    """
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    batch, steps, count = scores.shape
    present = torch.zeros((batch, count), dtype=torch.bool)
    for row in range(batch):
        present[row, words[row][words[row] >= 0]] = True
    expanded = present[:, None, :].expand(batch, steps, count)
    ranks = candidate_ranks(scores.reshape(batch * steps, count), expanded.reshape(batch * steps, count), True)
    chosen = (ranks.reshape(batch, steps, count) < k) & expanded
    width = words.shape[1]
    removed = chosen.gather(-1, words.clamp(min=0)[:, None, :].expand(batch, steps, width))
    removed &= (words >= 0)[:, None, :]
    return removed & (present.sum(dim=-1) > k)[:, None, None]


def enough_candidates(candidates: Tensor, k: int) -> Tensor:
    """``(batch,)`` bool: the rows with more than ``k`` candidate tokens (a step keeps at least one)."""
    return candidates.bool().sum(dim=-1) > k


def perturbed_inputs(
    prompt_ids: Tensor, prompt_mask: Tensor, tokens: Tensor, queries: Sequence[tuple[int, int, Tensor]], pad_id: int
) -> tuple[dict[str, Tensor], Tensor]:
    """One left-padded batch that reads each query's step token after its perturbed context.

    Args:
        prompt_ids: ``(batch, P)`` left-padded prompts.
        prompt_mask: ``(batch, P)``.
        tokens: ``(batch, T)`` the continuation.
        queries: ``(row, step, removed)`` with ``removed`` a ``(P,)`` bool mask of deleted prompt positions.
        pad_id: the id written into padding.

    Returns:
        The model inputs (``input_ids``, ``attention_mask``, ``position_ids``: positions counted over real tokens)
        whose last column predicts each query's step token, and ``(len(queries),)`` those tokens.
    """
    contexts = []
    for row, step, removed in queries:
        kept = prompt_mask[row].bool() & ~removed.bool()
        contexts.append(torch.cat([prompt_ids[row][kept], tokens[row, :step]]))
    width = max(len(context) for context in contexts)
    ids = torch.full((len(queries), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(queries), width), dtype=torch.long)
    for index, context in enumerate(contexts):
        if len(context):
            ids[index, width - len(context) :] = context
            mask[index, width - len(context) :] = 1
    targets = torch.stack([tokens[row, step] for row, step, _ in queries])
    positions = (mask.cumsum(dim=-1) - 1).clamp(min=0)
    return {"input_ids": ids, "attention_mask": mask, "position_ids": positions}, targets


@torch.inference_mode()
def step_log_probabilities(
    model: nn.Module,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    tokens: Tensor,
    queries: Sequence[tuple[int, int, Tensor]],
    pad_id: int,
    batch_size: int = 32,
) -> list[float]:
    """Each query's step-token log-probability after its perturbed context (see :func:`perturbed_inputs`), in
    batches of ``batch_size`` contexts of similar lengths. The model runs as in generation
    (:func:`explainers.tasks.continuation.evaluating`: eval mode, and an eager model's attention with finite float64
    masks), so an unperturbed query gives the generation loop's number."""
    from explainers.tasks.continuation import evaluating

    lengths = [int((prompt_mask[row].bool() & ~removed).sum()) + step for row, step, removed in queries]
    order = sorted(range(len(queries)), key=lengths.__getitem__)
    values = [0.0] * len(queries)
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        inputs, targets = perturbed_inputs(prompt_ids, prompt_mask, tokens, [queries[i] for i in chunk], pad_id)
        with evaluating(model):
            logits = model(**inputs, logits_to_keep=1).logits[:, -1].double()
        chosen = logits.log_softmax(dim=-1).gather(-1, targets[:, None].to(logits.device)).squeeze(-1)
        for index, value in zip(chunk, chosen.tolist(), strict=True):
            values[index] = value
    return values


def load_causal_lm(model_dir: Path) -> tuple[nn.Module, Any]:
    """A causal LM folder loaded as the generation handler loads it (eager attention, float32, eval mode), and its
    tokenizer (left padding; the EOS token as pad token if it has none)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), attn_implementation="eager", dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model.eval(), tokenizer


def evaluate_generation(
    model: nn.Module,
    tokenizer: Any,
    prompts: Sequence[str],
    methods: Sequence[str] = (*GENERATION_METHODS, RANDOM),
    *,
    name: str = "model",
    new_tokens: int = DEFAULT_NEW_TOKENS,
    ks: Sequence[int] = DEFAULT_KS,
    seed: int = 0,
    batch_size: int = 32,
    progress: bool = True,
    explain: Callable[..., Any] | None = None,
    options: Mapping[str, Mapping[str, Any]] | None = None,
    on_method: Callable[[GenerationFaithfulness], None] | None = None,
    view: str = "token",
) -> GenerationFaithfulness:
    """Run the test (module docstring) on ``prompts``; ``methods`` may include ``"random"``.

    In the ``word`` view a step loses its ``k`` highest-scored prompt *words* (each word's score the sum of its
    tokens': :func:`explainers.explain_units`' rule), every token of them; ``random`` then ranks the words at random.

    Args:
        model: a causal LM of a supported family (eager attention).
        tokenizer: its tokenizer (left padding).
        prompts: the prompts, generated after together.
        methods: the explanation methods (and ``random``).
        name: the model's name in the table.
        new_tokens: ``T``, the greedy tokens generated per prompt (rows stop early at EOS).
        ks: how many prompt tokens a step loses, each ``>= 1``.
        seed: seed of the random ranking.
        batch_size: contexts per forward of the perturbed steps.
        progress: show a bar over the methods.
        explain: the explanation function (default :func:`explainers.tasks.generation.explain_continuation`).
        options: each method's options (``{"integrated_gradients": {"n_steps": 16}}``); others take their defaults.
        on_method: called with the result so far after each method (``random`` runs first: every partial result
            has its paired differences), so a long run that is cut short still leaves what it measured.
        view: ``token`` (``k`` tokens) or ``word`` (``k`` words); the ``document`` view is
            :func:`explain_eval.documents.evaluate_documents`.

    Raises:
        ValueError: for no prompts, a ``k`` below 1, an unknown view, or a method the model refuses (the explainer's
            message).
    """
    from explainers.tasks.continuation import generate_continuation, pad_token
    from explainers.tasks.generation import explain_continuation

    if not prompts:
        raise ValueError("no prompts to evaluate")
    if any(k < 1 for k in ks):
        raise ValueError(f"every k must be at least 1, got {list(ks)}")
    if view not in ("token", "word"):
        raise ValueError(f"view must be token or word here, got {view!r}")
    explain = explain or explain_continuation
    encoded = tokenizer(list(prompts), padding=True, return_tensors="pt")
    started = time.perf_counter()
    made = generate_continuation(model, dict(encoded), new_tokens)
    seconds = {"generate": round(time.perf_counter() - started, 3)}
    width = made.prompt_width
    special = torch.tensor(sorted(set(tokenizer.all_special_ids)), dtype=torch.long)
    candidates = made.prompt_mask.bool() & ~torch.isin(made.prompt_ids, special)
    words = prompt_words(tokenizer, prompts, made.prompt_ids, candidates) if view == "word" else None
    step_mask = made.token_mask.bool()
    pad_id = pad_token(model)
    pairs = [
        (row, step) for row in range(step_mask.shape[0]) for step in range(step_mask.shape[1]) if step_mask[row, step]
    ]
    empty = torch.zeros(width, dtype=torch.bool)
    unperturbed = dict(
        zip(pairs, step_log_probabilities(model, made.prompt_ids, made.prompt_mask, made.tokens,
                                          [(row, step, empty) for row, step in pairs], pad_id, batch_size),
            strict=True)
    )  # fmt: skip
    cache: dict[tuple[int, int, tuple[int, ...]], float] = {}
    per_method: dict[str, dict[int, dict[int, list[float]]]] = {}
    generator = torch.Generator().manual_seed(seed)
    bar = tqdm(total=len(methods), desc=f"{name}: methods", unit="method", disable=not progress)
    continuations = [
        tokenizer.decode(made.tokens[row][step_mask[row]].tolist(), skip_special_tokens=False)
        for row in range(step_mask.shape[0])
    ]

    def result() -> GenerationFaithfulness:
        table = summary_table(per_method, ks)
        return GenerationFaithfulness(
            model=name,
            prompts=list(prompts),
            continuations=continuations,
            new_tokens=new_tokens,
            steps=len(pairs),
            ks=list(ks),
            mean_log_probability=statistics.fmean(unperturbed.values()),
            drops=table,
            seconds=dict(seconds),
            removal=WORD_REMOVAL if view == "word" else REMOVAL,
            view=view,
        )

    for method in sorted(methods, key=lambda method: method != RANDOM):
        started = time.perf_counter()
        count = 1 if words is None else max(int(words.max()) + 1, 1)
        if method == RANDOM:
            prompt_scores = torch.rand((*step_mask.shape, width if words is None else count), generator=generator,
                                       dtype=torch.float64)  # fmt: skip
        else:
            chosen = dict((options or {}).get(method, {}))
            explanation = explain(model, made, method=method, steps=None, contrast=None, options=chosen)
            prompt_scores = explanation.scores[:, :, :width].detach().double()
            if words is not None:
                prompt_scores = word_scores(prompt_scores, words)
        seconds[method] = round(time.perf_counter() - started, 3)
        per_method[method] = {}
        for k in ks:
            if words is None:
                removed = top_k_removals(prompt_scores, candidates, k)
                usable = enough_candidates(candidates, k)
            else:
                removed = top_k_word_removals(prompt_scores, words, k)
                usable = (words.max(dim=-1).values + 1) > k
            wanted = [(row, step) for row, step in pairs if usable[row]]
            keys = [(row, step, tuple(torch.nonzero(removed[row, step]).flatten().tolist())) for row, step in wanted]
            missing = sorted({key for key in keys if key not in cache})
            queries = [(row, step, removed[row, step]) for row, step in wanted]
            by_key = dict(zip(keys, queries, strict=True))
            values = step_log_probabilities(model, made.prompt_ids, made.prompt_mask, made.tokens,
                                            [by_key[key] for key in missing], pad_id, batch_size)  # fmt: skip
            cache.update(zip(missing, values, strict=True))
            drops: dict[int, list[float]] = {row: [] for row in range(step_mask.shape[0]) if usable[row]}
            for key in keys:
                drops[key[0]].append(unperturbed[key[:2]] - cache[key])
            per_method[method][k] = drops
        logger.info("%s: %s explained and perturbed in %.1f s", name, method, time.perf_counter() - started)
        bar.update(1)
        if on_method is not None:
            on_method(result())
    bar.close()
    return result()


def markdown_table(result: GenerationFaithfulness) -> str:
    """The drop table (nats; higher = more faithful), methods ranked by their drop at the largest ``k``."""
    ks = [str(k) for k in result.ks]
    what = {"token": "prompt tokens", "word": "prompt words", "document": "documents"}[result.view]
    counted = "sentences of answers" if result.view == "document" else "greedy steps"
    lines = [
        f"**{result.model}** ({result.view} view, k {what}; {len(result.prompts)} prompts, {result.steps} {counted} of "
        f"at most {result.new_tokens} tokens, mean {'sentence' if result.view == 'document' else 'step'} "
        f"log-probability {result.mean_log_probability:.2f}; {result.removal})",
        "",
        "| method | " + " | ".join(f"drop, k = {k}" for k in ks) + " | "
        + " | ".join(f"minus random, k = {k}" for k in ks) + " | explain s |",
        "|---|" + "---:|" * (2 * len(ks) + 1),
    ]  # fmt: skip
    ranked = sorted(result.drops.items(), key=lambda item: -finite_or_lowest(item[1][ks[-1]]["mean"]))
    for method, row in ranked:
        drops = [f"{row[k]['mean']:.2f} ± {row[k]['stderr']:.2f}" for k in ks]
        versus = [
            "-" if method == RANDOM else f"{row[k]['vs_random']:+.2f} ± {row[k]['vs_random_stderr']:.2f}" for k in ks
        ]
        seconds = result.seconds.get(method, math.nan)
        lines.append(f"| {method} | " + " | ".join(drops + versus) + f" | {seconds:.1f} |")
    return "\n".join(lines)


def read_prompts(path: Path | None, n: int) -> list[str]:
    """The first ``n`` prompts of ``path`` (one a line, blank lines skipped), or of :data:`DEFAULT_PROMPTS`."""
    if path is None:
        return list(DEFAULT_PROMPTS[:n])
    prompts = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not prompts:
        raise ValueError(f"{path} has no prompt (one a line)")
    return prompts[:n]


def parse_options(values: Sequence[str]) -> dict[str, dict[str, Any]]:
    """``METHOD.KEY=VALUE`` strings (``integrated_gradients.n_steps=16``) as ``{method: {key: value}}``; values are
    read as JSON where they parse (numbers, true/false), else kept as text.

    Raises:
        ValueError: for a string without the ``METHOD.KEY=VALUE`` shape.
    """
    options: dict[str, dict[str, Any]] = {}
    for value in values:
        target, equals, raw = value.partition("=")
        method, dot, key = target.partition(".")
        if not (equals and dot and method and key):
            raise ValueError(f"--option takes METHOD.KEY=VALUE (e.g. integrated_gradients.n_steps=16), got {value!r}")
        try:
            parsed: Any = json.loads(raw)
        except json.JSONDecodeError:
            parsed = raw
        options.setdefault(method, {})[key] = parsed
    return options


NOTE = (
    "Generation faithfulness (explain_eval/generation.py): for each greedy step, the prompt tokens that the method "
    "scores highest for that step are deleted and the fall of the step token's log-probability (nats) is "
    "measured, teacher-forced on the same continuation; higher = more faithful. Mean over prompts of each "
    "prompt's mean over its steps, ± standard error over prompts; `minus random` is the paired difference to a "
    "seeded random ranking of the same prompt tokens."
)


def write_results(result: GenerationFaithfulness, out: Path, command: str, options: Mapping[str, Any]) -> None:
    """``<out>.md`` (the note, the command, the table) and ``<out>.json`` (everything)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(f"{NOTE}\n\n`{command}`\n\n{markdown_table(result)}\n", encoding="utf-8")
    document = {"command": command, "methods": list(result.drops), "options": options, "result": result.to_dict()}
    out.with_suffix(".json").write_text(json.dumps(document, indent=1), encoding="utf-8")


def run_cli(args: argparse.Namespace, argv: Sequence[str] | None, parser: argparse.ArgumentParser) -> int:
    """``explain-eval --generation``: the arguments of :func:`explain_eval.cli.build_parser`; returns the status.
    The files are rewritten after each method (a run cut short keeps the methods it finished)."""
    from explainers import ExplainError

    model_dir = args.model_dir or args.build_dir / "writer" / "model"
    if not (model_dir / "config.json").is_file():
        parser.error(f"{model_dir} has no config.json: build the demo writer (make writer) or pass --model-dir")
    methods = [name.strip() for name in args.methods.split(",") if name.strip()] if args.methods else list(
        GENERATION_METHODS
    )  # fmt: skip
    if not args.no_random and RANDOM not in methods:
        methods.append(RANDOM)
    try:
        ks = sorted({int(k) for k in args.k.split(",") if k.strip()})
        options = parse_options(args.option or [])
        if args.view == "document":
            items = read_items(args.documents, args.n)
        else:
            prompts = read_prompts(args.prompts, args.n)
    except ValueError as error:
        parser.error(str(error))
    if not ks or ks[0] < 1:
        parser.error("--k takes integers >= 1, comma-separated")
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = load_causal_lm(model_dir)
    name = (args.model or [model_dir.parent.name if model_dir.name == "model" else model_dir.name])[0]
    command = "explain-eval " + " ".join(argv if argv is not None else sys.argv[1:])
    started = time.perf_counter()

    def save(partial: GenerationFaithfulness) -> None:
        write_results(partial, args.out, command, options)

    try:
        if args.view == "document":
            result = evaluate_documents(
                model, tokenizer, items, methods, name=name, new_tokens=args.new_tokens or 48, ks=ks, seed=args.seed,
                options=options, on_method=save,
            )  # fmt: skip
        else:
            result = evaluate_generation(
                model, tokenizer, prompts, methods, name=name, new_tokens=args.new_tokens or DEFAULT_NEW_TOKENS, ks=ks,
                seed=args.seed, batch_size=args.batch_size, progress=not args.no_progress, options=options,
                on_method=save, view=args.view,
            )  # fmt: skip
    except ExplainError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    result.seconds["total"] = round(time.perf_counter() - started, 1)
    write_results(result, args.out, command, options)
    print(markdown_table(result))
    print(f"wrote {args.out.with_suffix('.md')}, {args.out.with_suffix('.json')} ({result.seconds['total']:.0f} s)")
    return 0
