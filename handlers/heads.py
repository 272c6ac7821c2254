"""What a classifier's head outputs, read from its Hugging Face config, and how its logits become a served answer.

Three head types, as transformers' ``problem_type`` names them:

- ``single_label`` (``single_label_classification``, or unset with ``num_labels > 1``): softmax over the labels,
  one predicted label;
- ``multi_label`` (``multi_label_classification``): an independent sigmoid per label, every label whose
  probability reaches the threshold is predicted;
- ``regression`` (``regression``, or unset with ``num_labels == 1``): the raw output is the value.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import Tensor

HeadType = Literal["single_label", "multi_label", "regression"]
HEAD_TYPES: tuple[HeadType, ...] = ("single_label", "multi_label", "regression")
#: Multi-label threshold when neither the user nor the checkpoint's config sets one.
DEFAULT_THRESHOLD = 0.5
_PROBLEM_TYPES: dict[str, HeadType] = {
    "single_label_classification": "single_label",
    "multi_label_classification": "multi_label",
    "regression": "regression",
}


def head_type_of(problem_type: str | None, num_labels: int) -> HeadType:
    """The head type of a config's ``problem_type`` and ``num_labels`` (transformers' own rule when it is unset).

    Raises:
        ValueError: for a ``problem_type`` transformers does not define.
    """
    if problem_type is None:
        return "regression" if num_labels == 1 else "single_label"
    if problem_type not in _PROBLEM_TYPES:
        raise ValueError(f"problem_type {problem_type!r} is not one of {sorted(_PROBLEM_TYPES)}")
    return _PROBLEM_TYPES[problem_type]


def model_head_type(config: Any) -> HeadType:
    """The head type of a loaded model's ``config``."""
    return head_type_of(getattr(config, "problem_type", None), int(config.num_labels))


def scores_of(logits: Tensor, head_type: HeadType) -> Tensor:
    """``(batch, num_labels)`` logits → what the response reports per label: softmax probabilities (single label),
    sigmoid probabilities (multi label) or the raw values (regression), as float32."""
    logits = logits.float()
    if head_type == "single_label":
        return logits.softmax(dim=-1)
    if head_type == "multi_label":
        return torch.sigmoid(logits)
    return logits
