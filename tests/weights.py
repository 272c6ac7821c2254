"""The one weight perturbation of the tests' tiny models.

A freshly built Hugging Face model has near-zero weights (std 0.02), so every class gets about the same logit and
every explanation looks alike. :func:`perturb` draws weights from a seeded generator, large enough for distinct,
confident outputs, so that a test comparing two computations can tell them apart.
"""

from __future__ import annotations

from typing import Any

import torch


def perturb(model: Any, seed: int, *, unit_embeddings: str | None = "embed") -> Any:
    """Replace ``model``'s parameters in place by seeded noise, and return the model.

    Norm weights become ``1 + 0.2·N(0, 1)``; matrices ``N(0, 1)·1.5/√fan_in``; vectors (biases, norm biases)
    ``0.1·N(0, 1)``. Embedding tables — the 2-D parameters whose name contains ``unit_embeddings`` — are drawn at unit
    scale so that different tokens start far apart (``None``: scaled like every other matrix). The callers' choices of
    ``unit_embeddings`` differ and are kept, because each set of tests was written against its own weights.

    Args:
        model: Any ``torch.nn.Module``.
        seed: Seed of the generator; parameters are drawn in ``named_parameters`` order.
        unit_embeddings: Substring naming the embedding tables drawn at unit scale.
    """
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype)
            if "norm" in name.lower() and name.endswith("weight"):
                parameter.copy_(1.0 + 0.2 * noise)
            elif unit_embeddings is not None and unit_embeddings in name and parameter.dim() == 2:
                parameter.copy_(noise)
            elif parameter.dim() >= 2:
                fan_in = parameter[0].numel()
                parameter.copy_(noise * 1.5 / fan_in**0.5)
            else:
                parameter.copy_(0.1 * noise)
    return model
