"""Helpers shared by the text and image recipes: seeding, learning-rate schedule, metrics, checkpoint checks."""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from sklearn.metrics import accuracy_score, confusion_matrix, f1_score, precision_recall_fscore_support

from model_store.files import make_readable


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's generators so that a recipe gives the same model on every run."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def linear_warmup_decay(optimizer: torch.optim.Optimizer, total_steps: int, warmup_fraction: float) -> Any:
    """Return a scheduler that raises the learning rate linearly over the warm-up steps, then lowers it to 0.

    Args:
        optimizer: The optimizer whose learning rates are scaled.
        total_steps: Number of optimizer steps of the whole run.
        warmup_fraction: Fraction of ``total_steps`` spent warming up.

    Returns:
        A ``torch.optim.lr_scheduler.LambdaLR``; call ``step()`` after each optimizer step.
    """
    warmup = max(1, round(total_steps * warmup_fraction))

    def scale(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, scale)


def classification_metrics(y_true: Sequence[int], y_pred: Sequence[int], labels: Sequence[str]) -> dict[str, Any]:
    """Compute accuracy, macro-F1, per-class precision/recall/F1/support and the confusion matrix.

    Args:
        y_true: True class indices.
        y_pred: Predicted class indices.
        labels: Class names in index order.

    Returns:
        A JSON-serialisable dict; ``confusion_matrix[i][j]`` counts items of true class ``i`` predicted as ``j``.
    """
    indices = list(range(len(labels)))
    precision, recall, f1, support = precision_recall_fscore_support(y_true, y_pred, labels=indices, zero_division=0)
    return {
        "n": len(y_true),
        "accuracy": float(accuracy_score(y_true, y_pred)),
        "macro_f1": float(f1_score(y_true, y_pred, labels=indices, average="macro", zero_division=0)),
        "per_class": {
            name: {
                "precision": float(precision[i]),
                "recall": float(recall[i]),
                "f1": float(f1[i]),
                "support": int(support[i]),
            }
            for i, name in enumerate(labels)
        },
        "confusion_matrix": confusion_matrix(y_true, y_pred, labels=indices).tolist(),
    }


def check_safetensors_only(model_dir: Path) -> None:
    """Raise ``RuntimeError`` unless the checkpoint folder holds weights as safetensors and no pickle weights."""
    pickled = [p.name for p in model_dir.iterdir() if p.suffix in {".bin", ".pt", ".pth", ".pkl"}]
    if pickled or not any(p.suffix == ".safetensors" for p in model_dir.iterdir()):
        raise RuntimeError(f"{model_dir}: expected safetensors weights only, found {sorted(os.listdir(model_dir))}.")


def save_checkpoint(name: str, model_dir: Path, model: Any, preprocessor: Any, test_metrics: dict[str, Any]) -> None:
    """Save a trained model and its tokenizer/image processor as a safetensors checkpoint folder and log its score.

    Raises:
        FileExistsError: if ``model_dir`` exists (a build never overwrites a checkpoint in place).
        RuntimeError: if anything but safetensors weights ended up in the folder.
    """
    model_dir.mkdir(parents=True, exist_ok=False)
    model.save_pretrained(model_dir)
    preprocessor.save_pretrained(model_dir)
    check_safetensors_only(model_dir)
    make_readable(model_dir)
    logging.getLogger(__name__).info(
        "%s: test accuracy %.4f, macro-F1 %.4f (n=%d)",
        name,
        test_metrics["accuracy"],
        test_metrics["macro_f1"],
        test_metrics["n"],
    )
