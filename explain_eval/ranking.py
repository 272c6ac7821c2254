"""``explain-eval --all``: one faithfulness table that ranks every registered method on every default model.

For each model (the default ``sentiment``, ``digits`` and ``entities`` builds and the demo ``writer``), each seed
draws ``n`` held-out examples, and each method that applies explains them; a seeded ``random`` ranking is the
reference. One target probability ``p`` per example is then measured under removals ordered by the explanation:

- Chefer et al.'s **positive / negative perturbation AUC** (MoRF / LeRF, 0-90% of the candidates removed;
  :mod:`explain_eval.faithfulness`), on ``p`` rather than accuracy (the token-level and generation targets have no
  gold label to be accurate against);
- **ABPC**, the area between those two curves (AttnLRP), ERASER's **comprehensiveness** and **sufficiency** over
  the bins 1, 5, 10, 20, 50% (:mod:`explain_eval.erasure`);
- the method's **cost**: wall seconds of its explanation per example, measured in the same run, on the same batches.

Each seed gives each metric's mean over its examples; the table gives the mean over seeds ± its standard error. A
seed draws the sample, the random ranking and the methods' own ``seed`` option (SmoothGrad's noise). A method that a
model's family or task refuses, or that refuses its inputs, is listed as ``n/a`` with the library's reason.

The targets and removals, per model (also written into the output):

- ``sentiment`` (text classifier): the predicted class; tokens replaced by ``[MASK]`` (length kept);
- ``digits`` (image classifier): the predicted class; patches set to 0 in the normalised pixels;
- ``entities`` (token classifier): the label predicted at the **first token of the first predicted entity** of the
  sentence (sentences without a predicted entity are not drawn), read at that token; tokens replaced by ``[MASK]``;
- ``writer`` (causal LM): the **greedy next token** after the prompt (:mod:`explain_eval.generation`'s first step),
  its probability teacher-forced after the prompt with tokens **deleted** (positions counted again).

Example::

    explain-eval --all --n 100 --writer-n 12 --seeds 0,1,2 --out docs/faithfulness-all
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import math
import random
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from .erasure import (
    ERASER_BINS,
    abpc,
    comprehensiveness_masks,
    curve_areas,
    erasure_score,
    sufficiency_masks,
)
from .faithfulness import FRACTIONS, removal_masks
from .provenance import machine
from .results import RANDOM, mean_and_stderr

logger = logging.getLogger(__name__)

MODELS = ("sentiment", "digits", "entities", "writer")
#: The metrics of the table, their column titles and whether higher is better.
METRICS: dict[str, tuple[str, bool]] = {
    "abpc": ("ABPC ↑", True),
    "positive_auc": ("positive AUC ↓", False),
    "negative_auc": ("negative AUC ↑", True),
    "comprehensiveness": ("comprehensiveness ↑", True),
    "sufficiency": ("sufficiency ↓", False),
}


class Subject:
    """One model under test: its held-out pool, its explanations and its target probability under removals.

    Subclasses define the task; :func:`evaluate_subject` runs the same protocol on each.
    """

    name: str
    task: str
    target: str
    removal: str
    model_type: str
    registry_task: str

    def pool_size(self) -> int:
        """How many held-out examples can be drawn."""
        raise NotImplementedError

    def order(self, indices: list[int]) -> list[int]:
        """The drawn examples in the order they are batched (similar lengths together)."""
        return sorted(indices)

    def batch(self, indices: Sequence[int]) -> Any:
        """The model inputs of some drawn examples."""
        raise NotImplementedError

    def explain(self, batch: Any, method: str, options: Mapping[str, Any]) -> Tensor:
        """``(rows, positions)`` scores of the batch's targets (images: the patch grid flattened row-major)."""
        raise NotImplementedError

    def candidates(self, batch: Any) -> Tensor:
        """``(rows, positions)`` bool, the removable positions."""
        raise NotImplementedError

    def full_probability(self, batch: Any) -> Tensor:
        """``(rows,)`` the target probability of the unperturbed inputs."""
        raise NotImplementedError

    def removed_probability(self, batch: Any, rows: Tensor, removed: Tensor) -> Tensor:
        """``(k,)`` the target probability of example ``rows[i]`` of the batch after the removal ``removed[i]``
        (``rows``: ``(k,)`` long; ``removed``: ``(k, positions)`` bool)."""
        raise NotImplementedError

    def refusal(self, method: str) -> str | None:
        """Why the model's family or task refuses ``method`` (``None``: it applies)."""
        from explainers.architectures.support import refusal

        return refusal(self.model_type, method, self.registry_task)


def _loaded_recipe(model_root: Path) -> dict[str, Any]:
    from .evaluate import _recipe

    return _recipe(model_root)


class ClassifierSubject(Subject):
    """``sentiment`` or ``digits``: :class:`explain_eval.evaluate.Evaluator` on the build's held-out split."""

    registry_task = "sequence_classification"

    def __init__(self, name: str, model_dir: Path) -> None:
        """Load the model and its whole held-out split."""
        from .evaluate import Evaluator, held_out

        self.name = name
        # small chunks: the removals come grouped by example, so a chunk is padded to few lengths
        self.evaluator = Evaluator(model_dir, "mask", chunk=32)
        self.model_type = str(self.evaluator.model.config.model_type)
        self.task = "image classification" if self.evaluator.task == "image" else "text classification"
        self.pool = held_out(self.evaluator.task, model_dir.parent, 5000)
        self.target = "the predicted class"
        if self.evaluator.task == "image":
            self.removal = "patches set to 0 in the normalised pixel values"
        else:
            self.removal = "tokens replaced by the tokenizer's [MASK] token (length kept)"

    def pool_size(self) -> int:
        """The held-out split's size."""
        return len(self.pool)

    def order(self, indices: list[int]) -> list[int]:
        """Text: shortest first (less padding); images: index order."""
        if self.pool.task == "text":
            return sorted(indices, key=lambda index: (len(self.pool.texts[index]), index))
        return sorted(indices)

    def batch(self, indices: Sequence[int]) -> dict[str, Any]:
        """Inputs, predictions and grid of the examples."""
        from .evaluate import Dataset

        chosen = Dataset(
            self.pool.task,
            [self.pool.labels[i] for i in indices],
            texts=[self.pool.texts[i] for i in indices] if self.pool.texts else [],
            images=[self.pool.images[i] for i in indices] if self.pool.images else [],
        )
        inputs = self.evaluator.inputs(chosen, slice(None))
        probabilities = self.evaluator.probabilities(inputs)
        shape = self.evaluator.score_shape(inputs)
        grid = (shape[1], shape[2]) if len(shape) == 3 else None
        return {"inputs": inputs, "probabilities": probabilities, "targets": probabilities.argmax(-1), "grid": grid}

    def explain(self, batch: Any, method: str, options: Mapping[str, Any]) -> Tensor:
        """:func:`explainers.explain` on the predicted classes."""
        from explainers import explain

        attribution = explain(self.evaluator.model, batch["inputs"], method=method, target=batch["targets"], **options)
        scores = attribution.scores.detach().double()
        return scores.reshape(scores.shape[0], -1)

    def candidates(self, batch: Any) -> Tensor:
        """Real non-special tokens, or every patch."""
        grid = batch["grid"]
        size = grid[0] * grid[1] if grid else 0
        return self.evaluator.candidates(batch["inputs"], size)

    def full_probability(self, batch: Any) -> Tensor:
        """The predicted class's probability."""
        return batch["probabilities"].gather(-1, batch["targets"][:, None])[:, 0].double()

    def removed_probability(self, batch: Any, rows: Tensor, removed: Tensor) -> Tensor:
        """The predicted class's probability after the removals (as :meth:`Evaluator.predict_removed` removes)."""
        from .faithfulness import mask_tokens, zero_patches

        picked = {key: value[rows] for key, value in batch["inputs"].items()}
        if batch["grid"] is not None:
            picked["pixel_values"] = zero_patches(picked["pixel_values"], removed.reshape(-1, *batch["grid"]))
        else:
            picked["input_ids"] = mask_tokens(picked["input_ids"], removed, int(self.evaluator.tokenizer.mask_token_id))
        probabilities = self.evaluator.probabilities(picked)
        return probabilities.gather(-1, batch["targets"][rows][:, None])[:, 0].double()


class EntitySubject(Subject):
    """``entities``: the label predicted at the first token of each sentence's first predicted entity."""

    registry_task = "token_classification"

    def __init__(self, name: str, model_dir: Path, batch_size: int = 64) -> None:
        """Load the tagger, tokenize the build's held-out tweets and keep those with a predicted entity."""
        from transformers import AutoModelForTokenClassification, AutoTokenizer

        from explainers import predict_tokens
        from model_store.ner_data import load_ner_corpus, split_sentences

        self.name = name
        self.task = "token classification"
        self.target = (
            "the label predicted at the first token of the sentence's first predicted entity (sentences without one "
            "are not drawn), its probability at that token"
        )
        self.removal = "tokens replaced by the tokenizer's [MASK] token (length kept); the entity's token included"
        self.model = AutoModelForTokenClassification.from_pretrained(str(model_dir), attn_implementation="eager").eval()
        self.predictor = AutoModelForTokenClassification.from_pretrained(
            str(model_dir), attn_implementation="sdpa"
        ).eval()
        self.model_type = str(self.model.config.model_type)
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        self.tokenizer.padding_side = "right"
        if self.tokenizer.mask_token_id is None:
            raise ValueError(f"{model_dir}: the tokenizer has no mask token")
        recipe = _loaded_recipe(model_dir.parent)
        self.max_length = int(recipe.get("max_length", 64))
        _, test = split_sentences(load_ner_corpus(), float(recipe["test_fraction"]), int(recipe["seed"]))
        if recipe.get("max_eval_examples"):
            test = test[: int(recipe["max_eval_examples"])]
        self.sentences = [list(sentence.words) for sentence in test]
        self.pool: list[tuple[int, int, int]] = []  # (sentence, token position, label)
        for start in range(0, len(self.sentences), batch_size):
            rows = list(range(start, min(start + batch_size, len(self.sentences))))
            prediction = predict_tokens(self.model, self._encode(rows))
            for row, spans in zip(rows, prediction.spans, strict=True):
                if spans:
                    first = min(spans)
                    self.pool.append((row, int(first[0]), int(first[2])))

    def _encode(self, rows: Sequence[int]) -> dict[str, Tensor]:
        encoded = self.tokenizer(
            [self.sentences[row] for row in rows],
            is_split_into_words=True,
            truncation=True,
            max_length=self.max_length,
            padding=True,
            return_special_tokens_mask=True,
            return_tensors="pt",
        )
        return dict(encoded)

    def pool_size(self) -> int:
        """The held-out sentences with a predicted entity."""
        return len(self.pool)

    def order(self, indices: list[int]) -> list[int]:
        """Shortest sentences first."""
        return sorted(indices, key=lambda index: (len(self.sentences[self.pool[index][0]]), index))

    def batch(self, indices: Sequence[int]) -> dict[str, Any]:
        """Inputs and targets (position, label) of the drawn sentences."""
        encoded = self._encode([self.pool[index][0] for index in indices])
        special = encoded.pop("special_tokens_mask")
        positions = torch.tensor([self.pool[index][1] for index in indices])
        labels = torch.tensor([self.pool[index][2] for index in indices])
        batch = {"inputs": encoded, "special": special, "positions": positions, "labels": labels}
        batch["full"] = self._probability(encoded, positions, labels)
        return batch

    @torch.inference_mode()
    def _probability(self, inputs: Mapping[str, Tensor], positions: Tensor, labels: Tensor, chunk: int = 256) -> Tensor:
        rows = inputs["input_ids"].shape[0]
        parts = []
        for start in range(0, rows, chunk):
            part = {key: value[start : start + chunk] for key, value in inputs.items()}
            logits = self.predictor(**part).logits.float()
            picked = torch.arange(logits.shape[0])
            at = logits[picked, positions[start : start + chunk]].softmax(dim=-1)
            parts.append(at.gather(-1, labels[start : start + chunk, None])[:, 0])
        return torch.cat(parts).double()

    def explain(self, batch: Any, method: str, options: Mapping[str, Any]) -> Tensor:
        """:func:`explainers.explain_tokens` on each row's one-token span."""
        from explainers import explain_tokens

        spans = [
            [(int(position), int(position) + 1, int(label))]
            for position, label in zip(batch["positions"], batch["labels"], strict=True)
        ]
        inputs = {**batch["inputs"], "special_tokens_mask": batch["special"]}
        explanation = explain_tokens(self.model, inputs, method=method, positions=spans, **options)
        return explanation.scores[:, 0].detach().double()

    def candidates(self, batch: Any) -> Tensor:
        """Real non-special tokens."""
        return batch["inputs"]["attention_mask"].bool() & ~batch["special"].bool()

    def full_probability(self, batch: Any) -> Tensor:
        """The target label's probability at the entity's first token."""
        return batch["full"]

    def removed_probability(self, batch: Any, rows: Tensor, removed: Tensor) -> Tensor:
        """The same after masking the removed tokens."""
        picked = {key: value[rows] for key, value in batch["inputs"].items()}
        picked["input_ids"] = picked["input_ids"].masked_fill(removed.bool(), int(self.tokenizer.mask_token_id))
        return self._probability(picked, batch["positions"][rows], batch["labels"][rows])


class WriterSubject(Subject):
    """``writer``: the greedy next token after each prompt (:mod:`explain_eval.generation`, one step)."""

    registry_task = "causal_lm"

    def __init__(self, name: str, model_dir: Path, prompts: Sequence[str], batch_size: int = 64) -> None:
        """Load the causal LM as the generation handler does."""
        from .generation import load_causal_lm

        self.name = name
        self.task = "generation"
        self.target = "the greedy next token after the prompt, its probability teacher-forced"
        self.removal = "prompt tokens deleted (the rest packed, positions counted from 0)"
        self.model, self.tokenizer = load_causal_lm(model_dir)
        loaded: Any = self.model
        self.model_type = str(loaded.config.model_type)
        self.prompts = list(prompts)
        self.batch_size = batch_size

    def pool_size(self) -> int:
        """The prompts."""
        return len(self.prompts)

    def order(self, indices: list[int]) -> list[int]:
        """Shortest prompts first."""
        return sorted(indices, key=lambda index: (len(self.prompts[index]), index))

    def batch(self, indices: Sequence[int]) -> dict[str, Any]:
        """The prompts and their greedy next token."""
        from explainers.tasks.continuation import generate_continuation, pad_token

        from .generation import step_log_probabilities

        encoded = self.tokenizer([self.prompts[index] for index in indices], padding=True, return_tensors="pt")
        made = generate_continuation(self.model, dict(encoded), 1)
        special = torch.tensor(sorted(set(self.tokenizer.all_special_ids)), dtype=torch.long)
        candidates = made.prompt_mask.bool() & ~torch.isin(made.prompt_ids, special)
        pad_id = pad_token(self.model)
        empty = torch.zeros(made.prompt_width, dtype=torch.bool)
        rows = range(made.prompt_ids.shape[0])
        full = step_log_probabilities(
            self.model, made.prompt_ids, made.prompt_mask, made.tokens, [(row, 0, empty) for row in rows], pad_id,
            self.batch_size,
        )  # fmt: skip
        return {"made": made, "candidates": candidates, "pad_id": pad_id, "full": torch.tensor(full).exp()}

    def explain(self, batch: Any, method: str, options: Mapping[str, Any]) -> Tensor:
        """:func:`explainers.tasks.generation.explain_continuation` of the one step, over the prompt."""
        from explainers.tasks.generation import explain_continuation

        made = batch["made"]
        explanation = explain_continuation(self.model, made, method=method, steps=None, contrast=None, options=options)
        return explanation.scores[:, 0, : made.prompt_width].detach().double()

    def candidates(self, batch: Any) -> Tensor:
        """The prompts' real non-special tokens."""
        return batch["candidates"]

    def full_probability(self, batch: Any) -> Tensor:
        """The greedy token's probability."""
        return batch["full"].double()

    def removed_probability(self, batch: Any, rows: Tensor, removed: Tensor) -> Tensor:
        """The greedy token's probability after deleting the removed prompt tokens."""
        from .generation import step_log_probabilities

        made = batch["made"]
        queries = [(int(row), 0, mask) for row, mask in zip(rows, removed, strict=True)]
        values = step_log_probabilities(
            self.model, made.prompt_ids, made.prompt_mask, made.tokens, queries, batch["pad_id"], self.batch_size
        )
        return torch.tensor(values, dtype=torch.float64).exp()


@dataclass
class MethodResult:
    """One method on one model: each seed's metric means and cost, or why it does not apply."""

    per_seed: dict[str, list[float]] = field(default_factory=lambda: {metric: [] for metric in METRICS})
    seconds_per_example: list[float] = field(default_factory=list)
    not_applicable: str | None = None

    def summary(self) -> dict[str, Any]:
        """JSON-ready: per metric ``{"mean", "stderr", "per_seed"}``, the cost, or ``not_applicable``."""
        if self.not_applicable is not None:
            return {"not_applicable": self.not_applicable}
        document: dict[str, Any] = {}
        for metric, values in self.per_seed.items():
            mean, stderr = mean_and_stderr(values)
            document[metric] = {"mean": mean, "stderr": stderr, "per_seed": values}
        mean, stderr = mean_and_stderr(self.seconds_per_example)
        document["seconds_per_example"] = {"mean": mean, "stderr": stderr, "per_seed": self.seconds_per_example}
        return document


def batch_metrics(
    scores: Tensor, candidates: Tensor, full: Tensor, removed: Callable[[Tensor, Tensor], Tensor]
) -> dict[str, Tensor]:
    """Every metric of one batch under one ranking, per example, from one call of ``removed``.

    The removals of the four tests overlap (ERASER's top k is a MoRF step; keeping only the top k is a LeRF step;
    short inputs repeat counts): each distinct removal of an example is asked for once, and removing nothing is the
    unperturbed probability.

    Args:
        scores: ``(batch, positions)`` the ranking's scores.
        candidates: ``(batch, positions)`` bool.
        full: ``(batch,)`` the unperturbed target probability.
        removed: maps ``rows`` ``(k,)`` and removal masks ``(k, positions)`` to the target probabilities ``(k,)``
            (see :meth:`Subject.removed_probability`).

    Returns:
        ``{metric: (batch,) float64}`` for each metric of :data:`METRICS`, in probability units (0-1).
    """
    fractions = FRACTIONS[1:]
    masks = torch.cat(
        [
            removal_masks(scores, candidates, True, fractions),
            removal_masks(scores, candidates, False, fractions),
            comprehensiveness_masks(scores, candidates, ERASER_BINS),
            sufficiency_masks(scores, candidates, ERASER_BINS),
        ]
    )
    full = full.double()
    probabilities = distinct_removals(masks, full, removed)
    cut = len(fractions)
    most_first = torch.cat([full[None], probabilities[:cut]])
    least_first = torch.cat([full[None], probabilities[cut : 2 * cut]])
    bins = len(ERASER_BINS)
    return {
        "abpc": abpc(most_first, least_first, FRACTIONS),
        "positive_auc": curve_areas(most_first, FRACTIONS),
        "negative_auc": curve_areas(least_first, FRACTIONS),
        "comprehensiveness": erasure_score(full, probabilities[2 * cut : 2 * cut + bins]),
        "sufficiency": erasure_score(full, probabilities[2 * cut + bins :]),
    }


def distinct_removals(masks: Tensor, full: Tensor, removed: Callable[[Tensor, Tensor], Tensor]) -> Tensor:
    """``(steps, batch)`` the probabilities of ``masks`` ``(steps, batch, positions)``, asking ``removed`` once per
    distinct (example, mask) and not at all for an empty mask (``full`` of that example)."""
    steps, batch, positions = masks.shape
    keyed = torch.cat([torch.arange(batch)[None, :, None].expand(steps, batch, 1), masks.long()], dim=-1)
    unique, inverse = torch.unique(keyed.reshape(steps * batch, positions + 1), dim=0, return_inverse=True)
    rows, unique_masks = unique[:, 0], unique[:, 1:].bool()
    values = full[rows].clone()
    needed = unique_masks.any(dim=-1)
    if bool(needed.any()):
        values[needed] = removed(rows[needed], unique_masks[needed]).double()
    return values[inverse].reshape(steps, batch)


def evaluate_subject(
    subject: Subject,
    methods: Sequence[str],
    n: int,
    seeds: Sequence[int],
    batch_size: int,
    on_seed: Callable[[dict[str, MethodResult], int], None] | None = None,
    full_means: list[float] | None = None,
    options: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, MethodResult]:
    """Run every method (and ``random``) on ``n`` drawn examples per seed; see the module docstring.

    Args:
        subject: the model under test.
        methods: registry names and/or ``random``.
        n: examples drawn per seed (all of the pool if it is smaller).
        seeds: one sample, random ranking and method seed each.
        batch_size: examples explained together.
        on_seed: called with the results so far after each seed.
        full_means: if given, receives each seed's mean unperturbed target probability.
        options: each method's options (``{"integrated_gradients": {"n_steps": 16}}``); others take their defaults.

    Returns:
        ``{method: MethodResult}`` in the order of ``methods``.
    """
    from explainers import ExplainError, get_method

    results = {method: MethodResult() for method in methods}
    for method in methods:
        if method != RANDOM:
            results[method].not_applicable = subject.refusal(method)
    if subject.pool_size() == 0:
        raise ValueError(f"{subject.name}: no held-out example to draw")
    for seed in seeds:
        count = min(n, subject.pool_size())
        drawn = subject.order(random.Random(seed).sample(range(subject.pool_size()), count))
        generator = torch.Generator().manual_seed(seed)
        sums: dict[str, dict[str, float]] = {method: dict.fromkeys(METRICS, 0.0) for method in methods}
        seconds = dict.fromkeys(methods, 0.0)
        full_sum = 0.0
        started = time.perf_counter()
        for start in range(0, count, batch_size):
            batch = subject.batch(drawn[start : start + batch_size])
            candidates = subject.candidates(batch)
            full = subject.full_probability(batch)
            full_sum += float(full.sum())
            for method in methods:
                if results[method].not_applicable is not None:
                    continue
                clock = time.perf_counter()
                if method == RANDOM:
                    scores = torch.rand(candidates.shape, generator=generator, dtype=torch.float64)
                else:
                    names = {option.name for option in get_method(method).options}
                    chosen = dict((options or {}).get(method, {}))
                    if "seed" in names:
                        chosen["seed"] = seed
                    try:
                        scores = subject.explain(batch, method, chosen)
                    except ExplainError as error:
                        results[method].not_applicable = str(error)
                        logger.info("%s: %s does not apply: %s", subject.name, method, error)
                        continue
                seconds[method] += time.perf_counter() - clock
                values = batch_metrics(scores, candidates, full, partial(subject.removed_probability, batch))
                for metric, tensor in values.items():
                    sums[method][metric] += float(tensor.sum())
            logger.info(
                "%s seed %d: %d/%d examples (%.0f s)", subject.name, seed, min(start + batch_size, count), count,
                time.perf_counter() - started,
            )  # fmt: skip
        for method in methods:
            if results[method].not_applicable is None:
                for metric in METRICS:
                    results[method].per_seed[metric].append(sums[method][metric] / count)
                results[method].seconds_per_example.append(seconds[method] / count)
        if full_means is not None:
            full_means.append(full_sum / count)
        if on_seed is not None:
            on_seed(results, seed)
    return results


def _cell(summary: Mapping[str, Any], metric: str, scale: float = 100.0, digits: int = 1) -> str:
    value = summary[metric]
    mean, stderr = value["mean"] * scale, value["stderr"] * scale
    if math.isnan(stderr):
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {stderr:.{digits}f}"


def _seconds(value: float) -> str:
    return f"{value:.4f}" if value < 0.01 else f"{value:.3f}" if value < 1 else f"{value:.2f}"


def ranked(document: Mapping[str, Any]) -> list[str]:
    """The applicable methods of one model's results, by mean ABPC, highest first (ties: by name)."""
    applicable = [name for name, summary in document["methods"].items() if "not_applicable" not in summary]
    return sorted(applicable, key=lambda name: (-document["methods"][name]["abpc"]["mean"], name))


def model_table(document: Mapping[str, Any]) -> str:
    """One model's table (probabilities in percent; methods ranked by ABPC; ``n/a`` rows last)."""
    header = (
        f"### {document['model']}\n\n{document['task']}, `{document['model_type']}`; target: {document['target']}; "
        f"removal: {document['removal']}; n = {document['n']} examples per seed, drawn from {document['pool']} "
        "held-out ones, "
        f"seeds {', '.join(str(seed) for seed in document['seeds'])}; mean target probability "
        f"{100 * document['mean_full_probability']:.1f}%.\n"
    )
    columns = [title for title, _ in METRICS.values()]
    lines = [
        header,
        "| rank | method | " + " | ".join(columns) + " | seconds / example |",
        "|---:|---|" + "---:|" * (len(columns) + 1),
    ]
    for rank, name in enumerate(ranked(document), start=1):
        summary = document["methods"][name]
        cells = [_cell(summary, metric) for metric in METRICS]
        cost = "-" if name == RANDOM else _seconds(summary["seconds_per_example"]["mean"])
        lines.append(f"| {rank} | {name} | " + " | ".join(cells) + f" | {cost} |")
    for name, summary in document["methods"].items():
        if "not_applicable" in summary:
            reason = summary["not_applicable"].replace("|", "/")
            lines.append(f"| - | {name} | n/a ({reason}) |" + " |" * len(columns))
    return "\n".join(lines)


def rank_table(documents: Sequence[Mapping[str, Any]], methods: Sequence[str]) -> str:
    """Every method's ABPC rank on each model (``n/a`` where it does not apply), the methods in registry order."""
    ranks = {
        document["model"]: {name: index + 1 for index, name in enumerate(ranked(document))} for document in documents
    }
    lines = [
        "| method | " + " | ".join(document["model"] for document in documents) + " |",
        "|---|" + "---:|" * len(documents),
    ]
    for name in methods:
        cells = [
            str(ranks[document["model"]][name]) if name in ranks[document["model"]] else "n/a" for document in documents
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


#: The ordering Chefer et al. (CVPR 2021) report on ViT and BERT: their relevance above these baselines.
CHEFER_BASELINES = ("rollout", "gradcam", "partial_lrp", "attention")


def comparison(first: Mapping[str, Any], second: Mapping[str, Any], metric: str) -> str:
    """Whether ``first`` beats ``second`` on ``metric`` (by :data:`METRICS`' direction): ``holds`` or ``reversed``
    when the means differ by more than twice the combined standard error over seeds (and by more than 0.05 points),
    else ``tie``."""
    higher = METRICS[metric][1]
    a, b = first[metric], second[metric]
    difference = (a["mean"] - b["mean"]) if higher else (b["mean"] - a["mean"])
    error = math.sqrt(a["stderr"] ** 2 + b["stderr"] ** 2)
    if math.isnan(error) or abs(difference) <= max(2 * error, 5e-4):
        return f"tie ({100 * difference:+.1f})"
    return f"{'holds' if difference > 0 else 'reversed'} ({100 * difference:+.1f})"


def chefer_table(documents: Sequence[Mapping[str, Any]]) -> str:
    """Chefer et al.'s ordering (relevance above :data:`CHEFER_BASELINES`) held against each model where both apply:
    per metric, ``holds``, ``reversed`` or ``tie`` and relevance's advantage in points."""
    lines = [
        "| model | relevance vs | ABPC | positive AUC | negative AUC | comprehensiveness | sufficiency |",
        "|---|---|---|---|---|---|---|",
    ]
    for document in documents:
        methods = document["methods"]
        if "not_applicable" in methods.get("relevance", {"not_applicable": ""}):
            continue
        for baseline in CHEFER_BASELINES:
            if "not_applicable" in methods.get(baseline, {"not_applicable": ""}):
                continue
            cells = [comparison(methods["relevance"], methods[baseline], metric) for metric in METRICS]
            lines.append(f"| {document['model']} | {baseline} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


NOTE = """\
Every registered method on every default model, ranked by the area between the perturbation curves (ABPC), with
Chefer et al.'s perturbation AUCs, ERASER's comprehensiveness and sufficiency, and each method's cost, all measured in
one run of the command below (explain_eval/ranking.py). All scores are in percent of the target's probability
(`p`): **positive AUC** = mean level of `p` while 0-90% of the candidates are removed most relevant first (lower is
better), **negative AUC** = the same, least relevant first (higher is better), **ABPC** = negative AUC minus
positive AUC (higher is better; a random ranking scores about 0), **comprehensiveness** = `p` lost when the top
k% are removed, **sufficiency** = `p` lost when only the top k% are kept (lower is better), both averaged over
k in 1, 5, 10, 20, 50% (the top k% of n candidates is ceil(k·n) of them). Each cell is the mean over seeds of the
per-seed mean over the drawn examples, ± its standard error over seeds; a seed draws the examples, the `random`
ranking and the methods' own seed (SmoothGrad's noise). Methods run with their default options unless the command
sets some (`--option`). **seconds / example** is the explanation's wall time per
example in the same run (batched; the perturbation forwards are not included), on the machine named below, with
other work sharing its cores: compare methods within one model, not across runs."""


def write_outputs(out: Path, header: Mapping[str, Any], documents: Sequence[Mapping[str, Any]]) -> None:
    """``<out>.json`` (everything) and ``<out>.md`` (the note, the rank overview and one table per model)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {**header, "models": list(documents)}
    out.with_suffix(".json").write_text(json.dumps(payload, indent=1), encoding="utf-8")
    parts = [
        "# Faithfulness of every method on every default model\n",
        NOTE,
        "",
        provenance(header),
        "",
        "## Ranks by ABPC\n",
        rank_table(documents, header["methods"]),
        "",
        "## Chefer et al.'s ordering\n",
        "Chefer et al. report their relevance above rollout, GradCAM, partial LRP and raw attention on ViT and BERT. "
        "Per model where relevance applies: `holds` when relevance is better by more than twice the combined standard "
        "error over seeds, `reversed` when worse by as much, else `tie`; in brackets relevance's advantage in points "
        "(positive = better).\n",
        chefer_table(documents),
        "",
        "## Per model\n",
        "\n\n".join(model_table(document) for document in documents),
        "",
    ]
    out.with_suffix(".md").write_text("\n".join(parts), encoding="utf-8")


def provenance(header: Mapping[str, Any]) -> str:
    """The date, command, machine and wall time of a run, or of each run a merged table is made of."""
    lines = [f"- date: {header['date']}", f"- command: `{header['command']}`"]
    for run in header.get("runs", []):
        lines.append(
            f"- run of {', '.join(run['models'])}: `{run['command']}` ({run['date']}, {run.get('seconds', 0):.0f} s)"
        )
    lines.append(f"- machine: {header['machine']}")
    if "runs" not in header:
        lines.append(f"- wall time: {header.get('seconds', 0):.0f} s")
    return "\n".join(lines)


def merge(paths: Sequence[Path], out: Path, command: str) -> None:
    """One table from the ``.json`` outputs of several ``--all`` runs (e.g. models run side by side), each model
    from one run; the runs' commands, dates and machines are kept.

    Raises:
        ValueError: for a model found in two files, or runs with different methods or machines.
    """
    runs = [json.loads(Path(path).read_text(encoding="utf-8")) for path in paths]
    documents: list[dict[str, Any]] = []
    for run in runs:
        if any(run.get(key) != runs[0].get(key) for key in ("methods", "machine", "options")):
            raise ValueError(f"{paths[0]} and another file differ in methods, options or machine; merge like runs")
        for document in run["models"]:
            if any(document["model"] == seen["model"] for seen in documents):
                raise ValueError(f"model {document['model']!r} is in more than one file")
            documents.append(document)
    header = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": command,
        "machine": runs[0]["machine"],
        "methods": runs[0]["methods"],
        "fractions": runs[0]["fractions"],
        "eraser_bins": runs[0]["eraser_bins"],
        "options": runs[0].get("options", {}),
        "runs": [
            {key: run.get(key) for key in ("command", "date", "seconds")}
            | {"models": [document["model"] for document in run["models"]]}
            for run in runs
        ],
    }
    write_outputs(out, header, documents)


def subject_document(
    subject: Subject, results: Mapping[str, MethodResult], n: int, seeds: Sequence[int], full_means: Sequence[float]
) -> dict[str, Any]:
    """One model's JSON document (``full_means``: each seed's mean unperturbed target probability)."""
    return {
        "model": subject.name,
        "task": subject.task,
        "model_type": subject.model_type,
        "target": subject.target,
        "removal": subject.removal,
        "n": min(n, subject.pool_size()),
        "pool": subject.pool_size(),
        "seeds": list(seeds),
        "mean_full_probability": mean_and_stderr(full_means)[0],
        "methods": {method: result.summary() for method, result in results.items()},
    }


def model_folder(name: str, args: argparse.Namespace) -> Path:
    """The checkpoint folder of a default model name (``--writer-dir``, else under ``--build-dir``)."""
    if name == "writer" and args.writer_dir is not None:
        return Path(args.writer_dir)
    return Path(args.build_dir) / name / "model"


def make_subject(name: str, args: argparse.Namespace) -> Subject:
    """The :class:`Subject` of a default model name."""
    from .generation import read_prompts

    model_dir = model_folder(name, args)
    if name == "writer":
        return WriterSubject(name, model_dir, read_prompts(args.prompts, 10**6))
    if name == "entities":
        return EntitySubject(name, model_dir)
    return ClassifierSubject(name, model_dir)


def run_cli(args: argparse.Namespace, argv: Sequence[str] | None, parser: argparse.ArgumentParser) -> int:
    """``explain-eval --all`` (the arguments of :func:`explain_eval.cli.build_parser`); returns the exit status.
    The outputs are rewritten after each model and seed, so a run cut short keeps what it measured; a model that is
    not built stops the run when its turn comes (status 2), the models before it written."""
    from explainers import available_methods

    from .generation import parse_options

    command = "explain-eval " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.merge:
        try:
            merge(args.merge, args.out, command)
        except (OSError, ValueError, KeyError) as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        print(f"wrote {args.out.with_suffix('.md')}, {args.out.with_suffix('.json')}")
        return 0
    models = args.model or list(MODELS)
    unknown_models = sorted(set(models) - set(MODELS))
    if unknown_models:
        parser.error(f"--all runs the default models {', '.join(MODELS)}; unknown: {unknown_models}")
    methods = (
        [name.strip() for name in args.methods.split(",") if name.strip()] if args.methods else available_methods()
    )
    unknown = sorted(set(methods) - set(available_methods()) - {RANDOM})
    if unknown:
        parser.error(f"unknown method(s) {unknown}; available: {', '.join(available_methods())}, {RANDOM}")
    if not args.no_random and RANDOM not in methods:
        methods.append(RANDOM)
    try:
        seeds = [int(seed) for seed in args.seeds.split(",") if seed.strip()]
    except ValueError:
        parser.error("--seeds takes integers, comma-separated")
    if not seeds or len(set(seeds)) != len(seeds):
        parser.error("--seeds takes distinct integers, comma-separated")
    try:
        options = parse_options(args.option or [])
    except ValueError as error:
        parser.error(str(error))
    header_options = {"options": options}
    n = 100 if args.n is None else args.n
    if not 1 <= n <= 5000 or not 1 <= args.writer_n <= 5000:
        parser.error("--n and --writer-n must be between 1 and 5000")
    if args.threads:
        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    header: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": command,
        "machine": machine(),
        "methods": methods,
        "fractions": list(FRACTIONS),
        "eraser_bins": list(ERASER_BINS),
        **header_options,
    }
    documents: list[dict[str, Any]] = []
    for name in models:
        folder = model_folder(name, args)
        if not (folder / "config.json").is_file():
            hint = "make writer or --writer-dir" if name == "writer" else "make models or --build-dir"
            print(f"error: {folder} has no config.json: build {name} first ({hint})", file=sys.stderr)
            return 2
        subject = make_subject(name, args)
        count = args.writer_n if name == "writer" else n
        full_means: list[float] = []
        logger.info("%s: %d held-out examples to draw from, %d per seed", name, subject.pool_size(), count)

        def save(
            results: Mapping[str, MethodResult], seed: int, subject: Subject = subject, count: int = count,
            full_means: list[float] = full_means,
        ) -> None:  # fmt: skip
            done = seeds[: seeds.index(seed) + 1]
            header["seconds"] = time.perf_counter() - started
            write_outputs(args.out, header, [*documents, subject_document(subject, results, count, done, full_means)])

        results = evaluate_subject(subject, methods, count, seeds, args.batch_size, save, full_means, options)
        documents.append(subject_document(subject, results, count, seeds, full_means))
        header["seconds"] = time.perf_counter() - started
        write_outputs(args.out, header, documents)
    print(rank_table(documents, methods))
    print(
        f"wrote {args.out.with_suffix('.md')}, {args.out.with_suffix('.json')} ({time.perf_counter() - started:.0f} s)"
    )
    return 0
