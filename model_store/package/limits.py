"""How long a served input may be: a text model's ``max_length`` (never beyond its positions), a causal LM's default
``max_length`` (its positions beside ``max_new_tokens``, bounded by what the memory budget holds of a batch's
explanations) and an image model's input size, each with the reason the packager logs."""

from __future__ import annotations

from typing import Any

from model_store.package.settings import PackageError, Settings

#: Model types whose position ids start after the pad id (``max_position_embeddings`` counts those offsets).
_OFFSET_POSITIONS = frozenset({"roberta", "xlm-roberta", "camembert"})
DEFAULT_MAX_LENGTH = 128
#: The memory a causal LM's full batch of explanations (``batch_size`` rows of prompt and answer, its default method
#: on the eager attention it is served with; :func:`explainers.memory.estimate_bytes`) may take above the model when
#: its ``max_length`` is chosen by default (``--max-length`` sets it instead).
GENERATION_MEMORY_BUDGET_MIB = 16384


def _position_limit(config: Any) -> int | None:
    """The input positions a model has (``None``: no absolute position embeddings: relative positions)."""
    positions = getattr(config, "max_position_embeddings", None)
    if not isinstance(positions, int) or not getattr(config, "position_biased_input", True):
        return None  # no absolute position embeddings (relative positions)
    if config.model_type in _OFFSET_POSITIONS:
        return positions - int(getattr(config, "pad_token_id", 1) or 1) - 1
    return positions


def generation_max_length(
    config: Any, skeleton: Any, requested: int | None, settings: Settings, method: str
) -> tuple[int, str]:
    """A causal LM's prompt tokens and why: ``requested``, else its positions beside ``max_new_tokens``, bounded by
    what :data:`GENERATION_MEMORY_BUDGET_MIB` holds of ``batch_size`` rows explained with ``method`` (never below
    :data:`DEFAULT_MAX_LENGTH` for the memory: today's default).

    Raises:
        PackageError: if ``requested`` exceeds the model's positions, or ``max_new_tokens`` leaves no prompt room.
    """
    from dataclasses import replace

    from explainers import describe, get_method, position_limit
    from explainers.memory import ModelSize, estimate_bytes

    new_tokens = settings.max_new_tokens
    positions = position_limit(skeleton)
    if requested is not None:
        length = checked_max_length(config, requested, new_tokens, positions)
        return length, f"max_length {length}: as given (--max-length or the models file)"
    if positions is None:
        return DEFAULT_MAX_LENGTH, (
            f"max_length {DEFAULT_MAX_LENGTH}: the model's config gives no position limit (max_position_embeddings), "
            f"so the default {DEFAULT_MAX_LENGTH}; pass --max-length to serve longer prompts"
        )
    limit = checked_max_length(config, positions - new_tokens, new_tokens, positions)
    arch = describe(skeleton)
    size = replace(ModelSize.of(skeleton, arch), fused=False)  # served on eager attention
    options = get_method(method).resolve_options({}, arch)
    budget = GENERATION_MEMORY_BUDGET_MIB * 2**20
    rows = settings.batch_size

    def fits(length: int) -> bool:
        return estimate_bytes(size, method, rows, length + new_tokens, options) <= budget

    if fits(limit):
        return limit, (
            f"max_length {limit}: the model's {positions} positions less max_new_tokens {new_tokens}; a batch of "
            f"{rows} such rows explained with {method} fits {GENERATION_MEMORY_BUDGET_MIB} MiB"
        )
    good, bad = 0, limit
    while bad - good > 1:
        middle = (good + bad) // 2
        good, bad = (middle, bad) if fits(middle) else (good, middle)
    length = max(good, min(DEFAULT_MAX_LENGTH, limit))
    return length, (
        f"max_length {length} of the model's {positions} positions (less max_new_tokens {new_tokens}: {limit}): what "
        f"a memory budget of {GENERATION_MEMORY_BUDGET_MIB} MiB holds of a batch of {rows} rows explained with "
        f"{method} (explainers.memory's estimate); pass --max-length (up to {limit}) to serve longer prompts, or a "
        "smaller --batch-size"
    )


def checked_max_length(config: Any, requested: int | None, new_tokens: int = 0, positions: int | None = None) -> int:
    """Tokens per input: ``requested``, else 128, never more than the model has positions for (``positions``, else
    its absolute position embeddings) beside the ``new_tokens`` a generation model may write after its prompt.

    Raises:
        PackageError: if ``requested`` exceeds the model's positions.
    """
    limit = positions if positions is not None else _position_limit(config)
    if limit is not None and new_tokens:
        if limit - new_tokens < 1:
            raise PackageError(
                f"max_new_tokens {new_tokens} leaves no room for a prompt in the {limit} positions of this "
                f"{config.model_type} model: pass --max-new-tokens {limit // 2} or less"
            )
        limit -= new_tokens
    if requested is None:
        return min(DEFAULT_MAX_LENGTH, limit) if limit is not None else DEFAULT_MAX_LENGTH
    if limit is not None and requested > limit:
        beside = f" beside max_new_tokens {new_tokens}" if new_tokens else ""
        raise PackageError(
            f"max_length {requested} exceeds the {limit + new_tokens} positions of this {config.model_type} "
            f"model{beside}: pass --max-length {limit} or less"
        )
    return requested


def config_image_size(config: Any) -> tuple[int, int]:
    size = getattr(config, "image_size", None)
    if isinstance(size, int) and size > 0:
        return size, size
    if isinstance(size, list | tuple) and len(size) == 2 and all(isinstance(v, int) and v > 0 for v in size):
        return int(size[0]), int(size[1])
    raise PackageError(f"config.json's image_size is {size!r}: set it to the model's input size (an int or [h, w])")
