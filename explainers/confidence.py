"""Explain when unsure: a row may ask for its explanation only when the prediction's confidence is below a threshold
(``RowRequest.below``), which is how managed explainability services keep the cost of explanations down.

:func:`explainers.explain_batch` decides after the shared forward, from its logits: a confident row gets a
:class:`RowSkipped` in place of its explanation, and no backward. The confidence of a prediction:

- single-label heads: the probability of the predicted class (the largest softmax probability);
- multi-label heads: how sure the least sure label decision is, ``min over labels of max(p, 1 - p)`` (a label at
  p = 0.5 makes the row as unsure as it gets);
- regression heads have no probability: ``below`` is refused for them.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from .architectures.heads import head_probabilities
from .errors import InvalidOptionError

#: The one reason a row is not explained (so far): its confidence was not below the threshold.
CONFIDENT = "confident"


@dataclass(frozen=True)
class RowSkipped:
    """A row of :func:`explainers.explain_batch` that asked for an explanation only when unsure and was not.

    Attributes:
        method: the method that would have run.
        confidence: the prediction's confidence (module docstring).
        below: the threshold it was not below.
        reason: why it was not explained (:data:`CONFIDENT`).
    """

    method: str
    confidence: float
    below: float
    reason: str = CONFIDENT

    @property
    def message(self) -> str:
        """One sentence for the caller."""
        return (
            f"not explained: the prediction's confidence {self.confidence:.4g} is not below {self.below:g} "
            "(ask without 'below', or with a higher one, to explain it)"
        )


def prediction_confidence(logits: Tensor, head_type: str) -> Tensor:
    """``(batch,)`` confidence of each row's prediction (module docstring).

    Args:
        logits: ``(batch, num_labels)`` the model's logits.
        head_type: ``single_label`` (the largest softmax probability) or ``multi_label`` (the least sure label's
            ``max(p, 1 - p)``); ``regression`` is refused.

    Raises:
        InvalidOptionError: for a regression head, which has no probability.
    """
    if head_type == "regression":
        raise InvalidOptionError(
            "'below' needs class probabilities, and a regression head has none: ask without 'below'"
        )
    probabilities = head_probabilities(logits.float(), head_type)
    if head_type == "multi_label":
        return probabilities.maximum(1 - probabilities).min(dim=-1).values
    return probabilities.max(dim=-1).values


def check_below(below: float | None) -> float | None:
    """``below`` if it is None or a probability in (0, 1].

    Raises:
        InvalidOptionError: naming the allowed range.
    """
    if below is None:
        return None
    if isinstance(below, bool) or not isinstance(below, int | float) or not 0 < below <= 1:
        raise InvalidOptionError(
            f"'below' must be a probability in (0, 1] (explain only when the prediction's confidence is below it), "
            f"got {below!r}"
        )
    return float(below)
