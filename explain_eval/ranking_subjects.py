r"""The default models of ``explain-eval --all`` as subjects (:class:`explain_eval.ranking.Subject`): what is drawn,
explained and removed on each (the module docstring of :mod:`explain_eval.ranking` states the targets and removals),
and which subject a default model name makes.

- :class:`ClassifierSubject`: ``sentiment`` and ``digits``, on the build's held-out split;
- :class:`EntitySubject`: ``entities``, the first predicted entity of each held-out sentence;
- :class:`WriterSubject`: ``writer``, the greedy next token after each prompt.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from .evaluate import Dataset, Evaluator, build_recipe, held_out
from .faithfulness import mask_tokens, zero_patches
from .generation import load_causal_lm, read_prompts, step_log_probabilities
from .ranking import Subject

#: The default models, in the order they run.
MODELS = ("sentiment", "digits", "entities", "writer")


class ClassifierSubject(Subject):
    """``sentiment`` or ``digits``: :class:`explain_eval.evaluate.Evaluator` on the build's held-out split."""

    registry_task = "sequence_classification"

    def __init__(self, name: str, model_dir: Path) -> None:
        """Load the model and its whole held-out split."""
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
        recipe = build_recipe(model_dir.parent)
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

        made = batch["made"]
        queries = [(int(row), 0, mask) for row, mask in zip(rows, removed, strict=True)]
        values = step_log_probabilities(
            self.model, made.prompt_ids, made.prompt_mask, made.tokens, queries, batch["pad_id"], self.batch_size
        )
        return torch.tensor(values, dtype=torch.float64).exp()


def model_folder(name: str, args: argparse.Namespace) -> Path:
    """The checkpoint folder of a default model name (``--writer-dir``, else under ``--build-dir``)."""
    if name == "writer" and args.writer_dir is not None:
        return Path(args.writer_dir)
    return Path(args.build_dir) / name / "model"


def make_subject(name: str, args: argparse.Namespace) -> Subject:
    """The :class:`Subject` of a default model name."""
    model_dir = model_folder(name, args)
    if name == "writer":
        return WriterSubject(name, model_dir, read_prompts(args.prompts, 10**6))
    if name == "entities":
        return EntitySubject(name, model_dir)
    return ClassifierSubject(name, model_dir)
