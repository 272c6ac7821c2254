"""Validation of the model inputs every entry point shares: keys, shapes, padding side, the device.

:func:`validate_inputs` is called once per call by :func:`explainers.explain`, :func:`explainers.explain_batch`
and :func:`explainers.tasks.targets.explain_targets`, so the three accept and refuse the same batches.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from .architectures.description import Architecture, model_config
from .errors import InvalidInputError


def model_device(model: nn.Module) -> torch.device:
    """The device of ``model``'s first parameter (CPU for a model without parameters)."""
    for parameter in model.parameters():
        return parameter.device
    return torch.device("cpu")


def validate_inputs(arch: Architecture, model: nn.Module, inputs: Mapping[str, Any]) -> dict[str, Tensor]:
    """Check a tokenizer's (or image processor's) batch against ``arch`` and move it to the model's device.

    Fills in an all-ones ``attention_mask`` when absent and, for models that accept left padding (decoders),
    ``position_ids`` that count real tokens only, so a row means the same left- or right-padded, batched or alone.

    Raises:
        InvalidInputError: naming what is wrong (keys, shapes, dtypes, padding side, segment ids).
    """
    if not isinstance(inputs, Mapping):
        raise InvalidInputError(f"inputs must be a mapping such as a tokenizer's output, got {type(inputs).__name__}")
    keys = set(inputs)
    missing = sorted(arch.required_keys - keys)
    unexpected = sorted(keys - arch.input_keys)
    if missing or unexpected:
        problems = [f"missing {', '.join(missing)}"] if missing else []
        problems += [f"unexpected {', '.join(unexpected)}"] if unexpected else []
        raise InvalidInputError(
            f"wrong input keys for a {arch.model_type} model ({'; '.join(problems)}); "
            f"accepted keys: {', '.join(sorted(arch.input_keys))}"
        )
    for key, value in inputs.items():
        if not isinstance(value, Tensor):
            raise InvalidInputError(f"inputs[{key!r}] must be a torch.Tensor, got {type(value).__name__}")
    device = model_device(model)
    validated = {key: value.to(device) for key, value in inputs.items()}
    if arch.modality == "image":
        pixels = validated["pixel_values"]
        config = model_config(model)
        if pixels.dim() != 4 or pixels.shape[0] == 0 or not pixels.is_floating_point():
            raise InvalidInputError(
                f"pixel_values must be a non-empty float tensor (batch, {config.num_channels}, height, width), "
                f"got {tuple(pixels.shape)} {pixels.dtype}"
            )
        return validated
    ids = validated["input_ids"]
    if ids.dim() != 2 or ids.shape[0] == 0 or ids.shape[1] == 0 or ids.is_floating_point():
        raise InvalidInputError(
            f"input_ids must be a non-empty integer tensor (batch, seq_len), got {tuple(ids.shape)}"
        )
    for key in ("attention_mask", "token_type_ids"):
        if key in validated and validated[key].shape != ids.shape:
            raise InvalidInputError(
                f"{key} must have the shape of input_ids {tuple(ids.shape)}, got {tuple(validated[key].shape)}"
            )
    types = validated.get("token_type_ids")
    type_count = getattr(model_config(model), "type_vocab_size", None)
    if not isinstance(type_count, int) or type_count <= 0:
        types = None  # the model has no segment embeddings (DeBERTa-v2 with type_vocab_size 0 ignores them)
    if types is not None and isinstance(type_count, int) and bool(((types < 0) | (types >= type_count)).any()):
        raise InvalidInputError(
            f"token_type_ids of a {arch.model_type} model must be in [0, {type_count - 1}] (its type_vocab_size "
            f"is {type_count}); a sentence pair for a model with one segment type needs no token_type_ids"
        )
    mask = validated.setdefault("attention_mask", torch.ones_like(ids))
    if not bool(((mask == 0) | (mask == 1)).all()):
        raise InvalidInputError("attention_mask must hold only 0 and 1")
    right = bool((mask[:, 0] == 1).all()) and bool((mask[:, 1:] <= mask[:, :-1]).all())
    if "left" in arch.padding:
        left = bool((mask[:, -1] == 1).all()) and bool((mask[:, 1:] >= mask[:, :-1]).all())
        if not (right or left):
            raise InvalidInputError(
                f"attention_mask of a {arch.model_type} batch must be left-padded (0s then 1s) or right-padded "
                "(1s then 0s), the same side for every row, with at least one real token per row"
            )
        # The head reads the last real token whatever the side; positions count real tokens only, so a row
        # means the same left- or right-padded (and batched or alone).
        validated.setdefault("position_ids", (mask.cumsum(dim=-1) - 1).clamp(min=0))
    elif not right:
        raise InvalidInputError(
            f"attention_mask of a {arch.model_type} batch must be right-padded (1s then 0s, first token real): "
            f"{arch.model_type} models read {_READS.get(arch.pooled, 'the first token')} and take positions from the "
            "left; "
            "tokenize with padding_side='right'"
        )
    return validated


_READS = {
    "first": "the first token",
    "mean": "the mean of the real tokens",
    "last": "the last real token",
    "each": "every token at its own position",
}


def token_mask(arch: Architecture, inputs: Mapping[str, Tensor], model: nn.Module) -> Tensor:
    """``(batch, n)`` 1 for the real tokens: the attention mask for text, every token (prefix, patches) for images."""
    if arch.modality == "text":
        return inputs["attention_mask"]
    grid = input_grid(arch, inputs)
    batch = inputs["pixel_values"].shape[0]
    length = arch.prefix_tokens + grid[0] * grid[1]
    return torch.ones(batch, length, dtype=torch.long, device=model_device(model))


def batch_size(arch: Architecture, inputs: Mapping[str, Tensor]) -> int:
    """Rows in ``inputs``."""
    return inputs["pixel_values" if arch.modality == "image" else "input_ids"].shape[0]


def full_precision(device: torch.device) -> torch.autocast:
    """Attribution kernels run outside any caller's autocast: products of attention maps need float32 or more."""
    return torch.autocast(device_type=device.type, enabled=False)


def input_grid(arch: Architecture, inputs: Mapping[str, Tensor]) -> tuple[int, int]:
    """The patch grid of the images in ``inputs`` (the configured grid unless the input has another size)."""
    assert arch.grid is not None and arch.patch is not None
    height, width = inputs["pixel_values"].shape[-2:]
    return int(height) // arch.patch[0], int(width) // arch.patch[1]
