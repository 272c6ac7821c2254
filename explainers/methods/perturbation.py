"""The perturbation methods: leave-one-out occlusion, forwards only (no gradients) over copies of the inputs with one
input embedding erased, and the unchanged prefix's key/value cache that a causal LM's copies reuse.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from ..architectures.description import Architecture
from ..capture import forward_pass
from ..inputs import batch_size, input_grid, model_device
from .registry import (
    INTERNAL_BATCH,
    Cost,
    Footprint,
    ForwardInputs,
    ForwardScores,
    Memory,
    Option,
    copies_per_pass,
    register_forwards,
)


def _vocabulary(arch: Architecture) -> int:
    """Rows of a text model's word-embedding table (0 for an image model: no token replaces a patch)."""
    return int(getattr(arch.input_embeddings, "num_embeddings", 0)) if arch.modality == "text" else 0


@register_forwards(
    "occlusion",
    summary="leave-one-out occlusion (Li et al. 2017): the target's drop when one input embedding is erased",
    class_specific=True,
    memory=Memory(eager=Footprint(maps=0.0, transient=2.0, activations=0.0), fused=Footprint(0.0, 0.0, 0.0)),
    gradients=False,
    rows_per_pass=lambda rows, options: rows * copies_per_pass(rows, options),
    cost=Cost.copies(1.0, lambda options, length: length + 1),
    options=(
        Option(
            "baseline_token_id",
            "token whose word embedding replaces the erased one (-1: zeros; text only)",
            default=lambda arch: -1,
            minimum=lambda arch: -1,
            maximum=lambda arch: _vocabulary(arch) - 1,
        ),
        INTERNAL_BATCH,
    ),
)
def _occlusion(run: ForwardInputs) -> ForwardScores:
    """Leave-one-out erasure: for each input embedding (token or patch), the objective minus the objective with that
    embedding replaced by zeros (or by the word embedding of ``baseline_token_id``), for every round.

    Forwards only, without gradients: the batch repeated once per erased position plus once unchanged, copy-major,
    ``internal_batch_size`` rows per forward, on the model's fused attention where it has one.

    A causal LM's copies that erase position ``i`` see the unchanged positions ``< i`` exactly as the unchanged copy
    does, so for inputs of at least :data:`OCCLUSION_CACHE_MIN_TOKENS` columns the copies reuse its key/value cache
    (:func:`occluded_objectives` with ``prefix_cache=True``): one clean forward fills the cache, then each chunk of
    consecutive erased positions ``[i₀, i₁)`` (``internal_batch_size`` rows) recomputes only the columns ``≥ i₀`` on
    the first ``i₀`` cached ones (their logits are the unchanged copy's). The threshold is where
    ``python -m bench.occlusion`` measured the cache faster (docs/SERVING.md, "The founding papers' baselines"); the
    cache is also left out when one chunk holds every copy (nothing to reuse: only an extra forward). Otherwise, and
    for every other model, each copy runs the whole input. Both give the same scores (tests/test_occlusion_cache.py).
    No pass holds more than an uncached one: a chunk's cache holds its copies' first ``i₀`` positions, where the
    uncached forward holds all of them.
    """
    columns = int(run.inputs["input_ids"].shape[1]) if run.arch.modality == "text" else 0
    copies = copies_per_pass(batch_size(run.arch, run.inputs), run.options)
    cached = run.arch.task == "causal_lm" and columns >= OCCLUSION_CACHE_MIN_TOKENS and columns > copies
    every = occluded_objectives(run, prefix_cache=cached)  # (K, 1 + positions, B)
    return ForwardScores((every[:, :1] - every[:, 1:]).permute(0, 2, 1))


#: The shortest causal-LM input (columns of the padded batch) whose occlusion reuses the unchanged prefix's key/value
#: cache (when its copies take more than one forward), from ``python -m bench.occlusion`` (docs/SERVING.md, "The
#: founding papers' baselines"): on one CPU thread a random 4-layer Llama-shaped LM took 1.17x-1.39x less time with
#: the cache wherever the copies took two forwards or more (16 to 256 tokens, 1 to 8 rows), the same (0.97x, 0.98x)
#: where one forward held nearly all of them; nothing shorter than 16 tokens was measured.
OCCLUSION_CACHE_MIN_TOKENS = 16


@dataclass(frozen=True)
class _Erasure:
    """What occlusion's copies are made of.

    Attributes:
        batch: ``B``, the rows explained.
        positions: the input embeddings of a row (tokens, or an image's patches), each erased in turn.
        baseline: what replaces the erased embedding (zeros, or the word embedding of ``baseline_token_id``).
        per_pass: copies of the batch one forward holds.
    """

    batch: int
    positions: int
    baseline: Tensor
    per_pass: int

    @classmethod
    def of(cls, run: ForwardInputs) -> _Erasure:
        """The erasure ``run``'s inputs and options ask for."""
        device = model_device(run.model)
        if run.arch.modality == "text":
            positions = int(run.inputs["input_ids"].shape[1])
        else:
            grid_h, grid_w = input_grid(run.arch, run.inputs)
            positions = grid_h * grid_w
        token = int(run.options["baseline_token_id"])
        baseline = torch.zeros((), device=device)
        if token >= 0:
            with torch.no_grad():
                baseline = run.arch.input_embeddings(torch.tensor([token], device=device))[0]
        batch = batch_size(run.arch, run.inputs)
        return cls(batch, positions, baseline, copies_per_pass(batch, run.options))

    def erasing(self, chosen: Tensor, first: int) -> Callable[[Tensor], Tensor]:
        """Erase, in copy ``c`` of the batch, the embedding at column ``chosen[c]`` (the embeddings given start at
        column ``first``; ``-1``: erase nothing)."""

        def erase(embeddings: Tensor) -> Tensor:
            where = torch.arange(first, first + embeddings.shape[1], device=embeddings.device)
            hit = (where.view(1, -1) == chosen.view(-1, 1)).repeat_interleave(self.batch, dim=0).unsqueeze(-1)
            return torch.where(hit, self.baseline.to(embeddings.dtype), embeddings)

        return erase


def _repeated(inputs: Mapping[str, Tensor], copies: int) -> dict[str, Tensor]:
    """The batch ``inputs`` repeated ``copies`` times, copy-major."""
    return {key: value.repeat(copies, *([1] * (value.dim() - 1))) for key, value in inputs.items()}


def occluded_objectives(run: ForwardInputs, prefix_cache: bool) -> Tensor:
    """``(K, 1 + positions, B)``: each round's objective of each row unchanged (index 0), then with each input
    embedding erased in turn (occlusion's forwards, see :func:`_occlusion`).

    Args:
        run: the method's forward inputs.
        prefix_cache: reuse the unchanged copy's key/value cache for the positions before each chunk's first erased
            one (causal LMs only: their position ``t`` depends on positions ``≤ t`` alone).

    Raises:
        ValueError: ``prefix_cache`` for a model that is not a causal LM.
    """
    erasure = _Erasure.of(run)
    if not prefix_cache:
        return _uncached_objectives(run, erasure)
    if run.arch.task != "causal_lm":
        raise ValueError(f"occlusion reuses a prefix cache for causal LMs only, not a {run.arch.task} model")
    return _cached_objectives(run, erasure)


def _uncached_objectives(run: ForwardInputs, erasure: _Erasure) -> Tensor:
    """:func:`occluded_objectives` with each copy running the whole input."""
    device = model_device(run.model)
    rounds, batch, per_pass = run.objective.rounds, erasure.batch, erasure.per_pass
    values: list[Tensor] = []
    erased = list(range(-1, erasure.positions))  # -1: the unchanged copy
    for start in range(0, len(erased), per_pass):
        run.check_deadline(f"the occluded copies {start + 1}-{min(start + per_pass, len(erased))} of {len(erased)}")
        chosen = torch.tensor(erased[start : start + per_pass], device=device)
        steps = chosen.shape[0]
        forward = forward_pass(
            run.model, run.arch, _repeated(run.inputs, steps), frozenset(), embeddings=erasure.erasing(chosen, 0),
            fused=run.fused,
        )  # fmt: skip
        values.append(run.objective.values(forward.logits).view(rounds, steps, batch))
    return torch.cat(values, dim=1).to(run.dtype)


def _cached_objectives(run: ForwardInputs, erasure: _Erasure) -> Tensor:
    """:func:`occluded_objectives` of a causal LM with the unchanged copy's key/value cache: one clean forward fills
    it, then each chunk of erased positions ``[i₀, i₁)`` recomputes only the columns ``≥ i₀`` on the first ``i₀``
    cached ones (falling back to :func:`_uncached_objectives` for a model whose cache keeps no per-position keys and
    values)."""
    from transformers import DynamicCache

    device = model_device(run.model)
    rounds, batch, per_pass, positions = run.objective.rounds, erasure.batch, erasure.per_pass, erasure.positions
    # Every layer keeps every position (no config: no sliding-window trimming), so any prefix can be cut from it.
    cache = DynamicCache()
    clean = forward_pass(run.model, run.arch, run.inputs, frozenset(), fused=run.fused, cache=cache)
    states: list[tuple[Tensor, Tensor]] = []
    for layer in cache.layers:
        keys, kept = getattr(layer, "keys", None), getattr(layer, "values", None)
        if not (isinstance(keys, Tensor) and isinstance(kept, Tensor) and keys.shape[-2] == positions):
            # a layer that keeps no per-position keys and values (linear attention, shared or trimmed caches)
            return _uncached_objectives(run, erasure)
        states.append((keys, kept))
    values = [run.objective.values(clean.logits).view(rounds, 1, batch)]
    for start in range(0, positions, per_pass):
        run.check_deadline(f"the occluded positions {start + 1}-{min(start + per_pass, positions)} of {positions}")
        chosen = torch.arange(start, min(start + per_pass, positions), device=device)
        steps = chosen.shape[0]
        suffix = {key: value if key == "attention_mask" else value[:, start:] for key, value in run.inputs.items()}
        prefix = None
        if start > 0:
            prefix = DynamicCache(
                [(keys[:, :, :start].repeat(steps, 1, 1, 1), kept[:, :, :start].repeat(steps, 1, 1, 1))
                 for keys, kept in states]
            )  # fmt: skip
        forward = forward_pass(
            run.model, run.arch, _repeated(suffix, steps), frozenset(), embeddings=erasure.erasing(chosen, start),
            fused=run.fused, cache=prefix,
        )  # fmt: skip
        logits = forward.logits
        if start > 0:  # the columns before the chunk are the unchanged copy's
            logits = torch.cat([clean.logits[:, :start].repeat(steps, 1, 1), logits], dim=1)
        values.append(run.objective.values(logits).view(rounds, steps, batch))
        del prefix, forward, logits
    return torch.cat(values, dim=1).to(run.dtype)
