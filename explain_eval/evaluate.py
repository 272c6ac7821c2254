"""``explain-eval``: which explanation method is faithful on our models? The perturbation test of Chefer et al.
(:mod:`explain_eval.faithfulness`) on the held-out split of each default model, run **in-process** (the model
folder that the served archive was built from, loaded like the handler does, explanations batched with
:func:`explainers.explain`; the served model computes the same numbers, see tests/integration).

Examples::

    explain-eval --model sentiment --methods attention,rollout,relevance,gae,grad_x_input,attnlrp --n 500
    explain-eval --model sentiment --model digits --out docs/faithfulness

Writes ``<out>.json`` (curves, AUCs, settings), ``<out>.md`` (the AUC table) and ``<out>.png`` (the curves).
The held-out split is the model build's own test split (``model_store.data``, with the seed and fractions of the
build's ``metrics.json``), never trained on; ``--n`` draws a label-stratified subsample of it. A ``random`` ranking
(seeded) is added as a reference unless ``--no-random``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from tqdm.auto import tqdm

from .faithfulness import (
    FRACTIONS,
    PerturbationOutcome,
    area_under_curve,
    delete_tokens,
    mask_tokens,
    perturbation_outcome,
    zero_patches,
)
from .results import RANDOM

logger = logging.getLogger(__name__)

DEFAULT_METHODS = ("attention", "rollout", "relevance", "gae", "grad_x_input", "attnlrp", "cp_lrp")
Removal = Literal["mask", "delete"]
REMOVAL_TEXT = {
    "mask": "text tokens replaced by the tokenizer's [MASK] token (length kept)",
    "delete": "text tokens deleted (the rest packed left)",
}
IMAGE_REMOVAL = "image patches set to 0 in the normalised pixel values (the processor's mean colour)"


@dataclass
class Dataset:
    """Held-out inputs of one model: texts or uint8 grey images, with gold labels."""

    task: Literal["text", "image"]
    labels: list[int]
    texts: list[str] = field(default_factory=list)
    images: list[Any] = field(default_factory=list)

    def __len__(self) -> int:
        """Number of examples."""
        return len(self.labels)


@dataclass
class ModelResult:
    """Curves and AUCs of one model: ``curves[method][direction][metric]`` = one value per fraction."""

    model: str
    task: str
    n: int
    unperturbed_accuracy: float
    removal: str
    curves: dict[str, dict[str, dict[str, list[float]]]]

    def aucs(self) -> dict[str, dict[str, float]]:
        """``{method: {"positive_accuracy": …, "negative_accuracy": …, "positive_probability": …, …}}`` (percent)."""
        table: dict[str, dict[str, float]] = {}
        for method, directions in self.curves.items():
            table[method] = {
                f"{direction}_{metric}": 100.0 * area_under_curve(values)
                for direction, metrics in directions.items()
                for metric, values in metrics.items()
            }
        return table

    @classmethod
    def from_dict(cls, document: dict[str, Any]) -> ModelResult:
        """Read back :meth:`to_dict`'s output (e.g. to redraw the plot)."""
        return cls(
            document["model"],
            document["task"],
            int(document["n"]),
            float(document["unperturbed_accuracy"]),
            document["removal"],
            document["curves"],
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {
            "model": self.model,
            "task": self.task,
            "n": self.n,
            "unperturbed_accuracy": self.unperturbed_accuracy,
            "removal": self.removal,
            "fractions": list(FRACTIONS),
            "auc_percent": self.aucs(),
            "curves": self.curves,
        }


def build_recipe(model_root: Path) -> dict[str, Any]:
    """The recipe a model was built with (its ``metrics.json``): at least the held-out split's ``seed`` and
    ``test_fraction``.

    Raises:
        FileNotFoundError: if the model has no ``metrics.json`` (not built).
        ValueError: if it names no split.
    """
    metrics_file = model_root / "metrics.json"
    if not metrics_file.is_file():
        raise FileNotFoundError(f"{metrics_file} not found: build the model first (python -m model_store.build)")
    metrics = json.loads(metrics_file.read_text(encoding="utf-8"))
    recipe = metrics.get("recipe")
    if not isinstance(recipe, dict) or "seed" not in recipe or "test_fraction" not in recipe:
        raise ValueError(f"{metrics_file} has no recipe with the split's seed and test_fraction")
    return recipe


def held_out(task: str, model_root: Path, n: int) -> Dataset:
    """The build's held-out test split (label-stratified subsample of ``n``; all of it if smaller).

    Args:
        task: ``text`` (the tweet corpus) or ``image`` (scikit-learn digits).
        model_root: the model's build folder (``metrics.json`` gives the split's seed and fractions).
        n: how many examples.
    """
    from model_store.data import (
        load_digit_images,
        load_tweets,
        split_tweets,
        stratified_split_indices,
        stratified_subsample,
    )

    recipe = build_recipe(model_root)
    seed = int(recipe["seed"])
    if task == "text":
        splits = split_tweets(load_tweets(), float(recipe["test_fraction"]), float(recipe.get("val_fraction", 0)), seed)
        # Shortest first: batches of similar lengths need less padding (the results are means, order-free).
        examples = sorted(stratified_subsample(splits.test, n, seed), key=lambda example: len(example.text))
        return Dataset("text", [example.label for example in examples], texts=[example.text for example in examples])
    images, labels = load_digit_images()
    _, test_idx = stratified_split_indices(labels, float(recipe["test_fraction"]), seed)
    if n < len(test_idx):
        from sklearn.model_selection import train_test_split

        chosen, _ = train_test_split(test_idx, train_size=n, random_state=seed, stratify=labels[test_idx])
        test_idx = np.sort(chosen)
    return Dataset("image", [int(labels[i]) for i in test_idx], images=[images[i] for i in test_idx])


class Evaluator:
    """One model loaded like the handler loads it, and the perturbation test over batches of its inputs."""

    def __init__(self, model_dir: Path, removal: Removal = "mask", max_length: int = 128, chunk: int = 256) -> None:
        """Load the checkpoint (eager attention, eval mode) and its tokenizer or image processor."""
        from transformers import (
            AutoConfig,
            AutoImageProcessor,
            AutoModelForImageClassification,
            AutoModelForSequenceClassification,
            AutoTokenizer,
        )

        config = AutoConfig.from_pretrained(str(model_dir))
        self.task: Literal["text", "image"] = "image" if config.model_type == "vit" else "text"
        auto = AutoModelForImageClassification if self.task == "image" else AutoModelForSequenceClassification
        self.model = auto.from_pretrained(str(model_dir), attn_implementation="eager").eval()
        # The perturbed inputs only need predictions: fused attention computes the same logits faster.
        self.predictor = auto.from_pretrained(str(model_dir), attn_implementation="sdpa").eval()
        self.removal = removal
        self.max_length = max_length
        self.chunk = chunk
        self.tokenizer: Any = None
        self.processor: Any = None
        if self.task == "text":
            self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
            self.tokenizer.padding_side = "right"
            if removal == "mask" and self.tokenizer.mask_token_id is None:
                raise ValueError("the tokenizer has no mask token: use --removal delete")
        else:
            self.processor = AutoImageProcessor.from_pretrained(str(model_dir))

    def inputs(self, dataset: Dataset, rows: slice) -> dict[str, torch.Tensor]:
        """Model inputs of ``dataset[rows]`` (tokenized like the handler: right padding, truncation)."""
        if self.task == "text":
            encoded = self.tokenizer(
                dataset.texts[rows], padding=True, truncation=True, max_length=self.max_length, return_tensors="pt"
            )
            return dict(encoded)
        from PIL import Image

        pictures = [Image.fromarray(image, mode="L").convert("RGB") for image in dataset.images[rows]]
        return {"pixel_values": self.processor(images=pictures, return_tensors="pt")["pixel_values"]}

    def score_shape(self, inputs: dict[str, torch.Tensor]) -> tuple[int, ...]:
        """The shape of an explanation's scores: text ``(batch, length)``, images ``(batch, grid_h, grid_w)``."""
        if self.task == "text":
            return tuple(inputs["input_ids"].shape)
        config: Any = self.model.config
        size, patch = config.image_size, config.patch_size
        height, width = (size, size) if isinstance(size, int) else size
        return (inputs["pixel_values"].shape[0], height // patch, width // patch)

    def candidates(self, inputs: dict[str, torch.Tensor], grid_size: int) -> torch.Tensor:
        """Removable positions: text = real non-special tokens; images = every patch."""
        if self.task == "image":
            return torch.ones(inputs["pixel_values"].shape[0], grid_size, dtype=torch.bool)
        special = torch.zeros_like(inputs["input_ids"], dtype=torch.bool)
        for token_id in self.tokenizer.all_special_ids:
            special |= inputs["input_ids"] == token_id
        return inputs["attention_mask"].bool() & ~special

    @torch.inference_mode()
    def probabilities(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """Class probabilities ``(rows, classes)``, computed in chunks of ``chunk`` rows."""
        rows = next(iter(inputs.values())).shape[0]
        parts = []
        for start in range(0, rows, self.chunk):
            chunk = {key: value[start : start + self.chunk] for key, value in inputs.items()}
            if "attention_mask" in chunk:  # trim trailing all-padding columns (deletion shortens rows)
                width = int(chunk["attention_mask"].sum(dim=-1).max())
                chunk = {key: value[:, :width] for key, value in chunk.items()}
            parts.append(self.predictor(**chunk).logits.float().softmax(dim=-1))
        return torch.cat(parts)

    def predict_removed(self, inputs: dict[str, torch.Tensor], grid: tuple[int, int] | None) -> Any:
        """The ``predict_removed`` callback of :func:`perturbation_outcome` for one batch of inputs."""

        def predict(remove: torch.Tensor) -> torch.Tensor:
            repeats = remove.shape[0] // next(iter(inputs.values())).shape[0]
            tiled = {key: value.repeat(repeats, *([1] * (value.dim() - 1))) for key, value in inputs.items()}
            if self.task == "image":
                assert grid is not None
                tiled["pixel_values"] = zero_patches(tiled["pixel_values"], remove.reshape(-1, *grid))
            elif self.removal == "mask":
                tiled["input_ids"] = mask_tokens(tiled["input_ids"], remove, int(self.tokenizer.mask_token_id))
            else:
                pad = int(self.tokenizer.pad_token_id or 0)
                ids, mask = delete_tokens(tiled["input_ids"], tiled["attention_mask"], remove, pad)
                tiled = {"input_ids": ids, "attention_mask": mask}
                if "token_type_ids" in inputs:
                    tiled["token_type_ids"] = torch.zeros_like(ids)
            return self.probabilities(tiled)

        return predict


Sums = dict[str, dict[str, dict[str, torch.Tensor]]]


def empty_sums(methods: Sequence[str]) -> Sums:
    """Per method, direction and metric (``accuracy``, ``probability``): a zero sum per fraction."""
    return {
        method: {
            direction: {
                metric: torch.zeros(len(FRACTIONS), dtype=torch.float64) for metric in ("accuracy", "probability")
            }
            for direction in ("positive", "negative")
        }
        for method in methods
    }


def accumulate(
    sums: dict[str, torch.Tensor],
    outcome: PerturbationOutcome,
    predicted: torch.Tensor,
    labels: torch.Tensor,
    unperturbed: torch.Tensor,
) -> None:
    """Add one batch's outcome (fractions ``FRACTIONS[1:]``) and its unperturbed point (fraction 0, computed once
    and shared by every method and direction) to one direction's sums."""
    sums["accuracy"][0] += (predicted == labels).double().sum()
    sums["accuracy"][1:] += outcome.correct.double().sum(dim=1)
    sums["probability"][0] += unperturbed.gather(-1, predicted[:, None]).double().sum()
    sums["probability"][1:] += outcome.target_probability.double().sum(dim=1)


def finish_curves(sums: Sums, count: int) -> dict[str, dict[str, dict[str, list[float]]]]:
    """Sums → mean curves."""
    return {
        method: {
            direction: {metric: (total / count).tolist() for metric, total in metrics.items()}
            for direction, metrics in directions.items()
        }
        for method, directions in sums.items()
    }


def evaluate(
    name: str,
    model_dir: Path,
    dataset: Dataset,
    methods: Sequence[str],
    removal: Removal = "mask",
    batch_size: int = 32,
    seed: int = 0,
    progress: bool = True,
) -> ModelResult:
    """Run the positive and negative perturbation tests of every method on ``dataset``.

    Args:
        name: the model's display name.
        model_dir: the Hugging Face checkpoint folder.
        dataset: held-out examples (see :func:`held_out`).
        methods: registry names; ``random`` = a seeded random ranking.
        removal: text removal rule (``mask`` or ``delete``); images always zero patches.
        batch_size: examples explained together.
        seed: seed of the ``random`` ranking.
        progress: show a tqdm progress bar.

    Returns:
        The curves (means over the examples) and AUCs.
    """
    from explainers import explain

    evaluator = Evaluator(model_dir, removal)
    if evaluator.task != dataset.task:
        raise ValueError(f"{model_dir} is a {evaluator.task} model but the data are {dataset.task}")
    generator = torch.Generator().manual_seed(seed)
    sums = empty_sums(methods)
    correct_unperturbed = 0
    bar = tqdm(total=len(dataset) * len(methods), desc=f"{name}: perturbation", unit="ex", disable=not progress)
    for start in range(0, len(dataset), batch_size):
        rows = slice(start, start + batch_size)
        inputs = evaluator.inputs(dataset, rows)
        labels = torch.tensor(dataset.labels[rows])
        unperturbed = evaluator.probabilities(inputs)
        predicted = unperturbed.argmax(dim=-1)
        correct_unperturbed += int((predicted == labels).sum())
        for method in methods:
            if method == RANDOM:
                scores = torch.rand(evaluator.score_shape(inputs), generator=generator)
            else:
                attribution = explain(evaluator.model, inputs, method=method, target=predicted)
                scores = attribution.scores.detach().float()
            grid = (int(scores.shape[1]), int(scores.shape[2])) if scores.dim() == 3 else None
            flat = scores.reshape(scores.shape[0], -1)
            candidates = evaluator.candidates(inputs, flat.shape[1])
            predict = evaluator.predict_removed(inputs, grid)
            for direction in ("positive", "negative"):
                outcome = perturbation_outcome(
                    flat, candidates, predict, predicted, labels, direction == "positive", FRACTIONS[1:]
                )
                accumulate(sums[method][direction], outcome, predicted, labels, unperturbed)
            bar.update(len(labels))
    bar.close()
    curves = finish_curves(sums, len(dataset))
    removal_text = REMOVAL_TEXT[removal] if evaluator.task == "text" else IMAGE_REMOVAL
    return ModelResult(name, evaluator.task, len(dataset), correct_unperturbed / len(dataset), removal_text, curves)


def markdown_table(result: ModelResult) -> str:
    """The AUC table of one model (percent; positive: lower is better, negative: higher is better)."""
    aucs = result.aucs()
    lines = [
        f"**{result.model}** ({result.task}, n = {result.n} held-out, unperturbed accuracy "
        f"{100 * result.unperturbed_accuracy:.1f}%; {result.removal})",
        "",
        "| method | positive AUC, accuracy ↓ | negative AUC, accuracy ↑ "
        "| positive AUC, prob. ↓ | negative AUC, prob. ↑ |",
        "|---|---:|---:|---:|---:|",
    ]
    ranked = sorted(aucs.items(), key=lambda item: item[1]["positive_accuracy"])
    for method, row in ranked:
        lines.append(
            f"| {method} | {row['positive_accuracy']:.1f} | {row['negative_accuracy']:.1f} "
            f"| {row['positive_probability']:.1f} | {row['negative_probability']:.1f} |"
        )
    return "\n".join(lines)


def plot(results: Sequence[ModelResult], path: Path) -> None:
    """One row per model, positive and negative perturbation side by side, accuracy vs removed fraction."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(len(results), 2, figsize=(11, 3.6 * len(results)), squeeze=False)
    percent = [100 * fraction for fraction in FRACTIONS]
    for row, result in enumerate(results):
        aucs = result.aucs()
        for column, direction in enumerate(("positive", "negative")):
            axis = axes[row][column]
            for method, directions in result.curves.items():
                style = "--" if method == RANDOM else "-"
                auc = aucs[method][f"{direction}_accuracy"]
                values = [100 * value for value in directions[direction]["accuracy"]]
                axis.plot(percent, values, style, marker="o", markersize=3, label=f"{method} (AUC {auc:.1f})")
            better = "lower" if direction == "positive" else "higher"
            first = "most" if direction == "positive" else "least"
            axis.set_title(
                f"{result.model}: {direction} perturbation\n({first} relevant removed first; {better} is better)"
            )
            axis.set_xlabel("removed tokens (%)" if result.task == "text" else "removed patches (%)")
            axis.set_ylabel("accuracy (%)")
            axis.grid(alpha=0.3)
            axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
