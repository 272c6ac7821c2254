"""The methods computed from gradients with respect to the input embeddings: gradient x input (and the helper
AttnLRP and CP-LRP share with it, under their modified gradients), the plain gradient's norm, integrated gradients and
SmoothGrad.

``grad_x_input`` and ``gradient`` read the embedding gradients of the capture pass; integrated gradients and
SmoothGrad run forwards of their own over copies of the input embeddings (path points, noisy copies) and differentiate
them (:func:`_gradient_times_input`), on the model's fused attention where it has one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import torch
from torch import Tensor

from ..capture import EMBEDDING_GRADIENTS, batched_gradients, forward_pass, rounds_per_call
from ..inputs import batch_size, full_precision, model_device
from .registry import (
    COPY_GRADIENT_PASS,
    GRADIENT_PASS,
    INTERNAL_BATCH,
    Cost,
    ForwardInputs,
    ForwardScores,
    MethodInputs,
    Option,
    OptionValue,
    align_to_tokens,
    copies_per_pass,
    gradient_memory,
    register,
    register_forwards,
)


def embedding_times_gradient(ctx: MethodInputs) -> Tensor:
    """Each input embedding (token or patch) times the gradient of the target with respect to it, summed over the
    hidden dimension: ``grad_x_input`` under true gradients, and AttnLRP's and CP-LRP's relevance under the rules
    their pass runs (:attr:`~explainers.methods.registry.Method.rules`: the capture records the modified gradient).

    Args:
        ctx: what the method reads (the capture's input embeddings and their gradients).

    Returns:
        ``(batch, n)`` the scores on the model's tokens (an image's prefix tokens and padding get 0).
    """
    capture = ctx.capture
    assert capture.embeddings is not None and capture.embedding_gradients is not None
    return align_to_tokens((capture.embeddings * capture.embedding_gradients).sum(dim=-1), ctx)


register(
    "grad_x_input",
    summary="gradient x input embedding, summed over the hidden dimension (saliency baseline)",
    class_specific=True,
    needs=frozenset({EMBEDDING_GRADIENTS}),
    memory=gradient_memory(activations=5.7),
    cost=Cost.fixed(GRADIENT_PASS),
)(embedding_times_gradient)


@register(
    "gradient",
    summary="L2 norm over the hidden dimension of the gradient w.r.t. each input embedding (Li et al. 2016)",
    class_specific=True,
    needs=frozenset({EMBEDDING_GRADIENTS}),
    memory=gradient_memory(activations=5.7),
    cost=Cost.fixed(GRADIENT_PASS),
)
def _gradient(ctx: MethodInputs) -> Tensor:
    """Plain gradient saliency: ``‖∂ target / ∂ e_i‖₂`` of each token's word (patch) embedding ``e_i``."""
    assert ctx.capture.embedding_gradients is not None
    return align_to_tokens(torch.linalg.vector_norm(ctx.capture.embedding_gradients, dim=-1), ctx)


#: Integrated gradients' defaults: points on the path, and rows per forward while integrating.
IG_STEPS = 50
IG_INTERNAL_BATCH = 64


def _path_rows(rows: int, options: Mapping[str, OptionValue]) -> int:
    """Rows of one integrated-gradients forward: ``rows`` times the path points one forward holds."""
    steps = max(1, int(options.get("internal_batch_size", IG_INTERNAL_BATCH)) // rows)
    return rows * min(steps, int(options.get("n_steps", IG_STEPS)))


def _scaled(scale: Tensor) -> Callable[[Tensor], Tensor]:
    """Each row's input embeddings multiplied by its ``scale`` (a point on the straight path from zero)."""
    return lambda embeddings: embeddings * scale.view(-1, 1, 1)


def _gradient_times_input(
    run: ForwardInputs, chunks: list[tuple[int, Callable[[Tensor], Tensor]]], times_changed: bool
) -> tuple[Tensor, float]:
    """``Σ`` over copies of the inputs of ``Σ_hidden input · ∂ objective / ∂ changed input``, for every round and row:
    the shared loop of the methods that differentiate copies of the input embeddings.

    Args:
        run: the method's forward inputs.
        chunks: per forward, ``(copies, change)``: the batch repeated ``copies`` times (copy-major), its input
            embeddings changed by ``change`` (integrated gradients' path scaling, SmoothGrad's noise).
        times_changed: multiply each copy's gradient by its changed embeddings (SmoothGrad), or by the unchanged ones
            (integrated gradients, whose gradients are summed over the copies first).

    Returns:
        ``(K, B, n)`` the sums, and the seconds the gradient calls took. One batched vector-Jacobian product per chunk
        of rounds follows each forward (on the model's fused attention where it has one); the score is linear in the
        gradient, so each chunk adds its share directly (the per-round gradients are never all kept).
    """
    rounds = run.objective.rounds
    batch = batch_size(run.arch, run.inputs)
    device = model_device(run.model)
    scores: Tensor | None = None
    backward = 0.0
    for number, (steps, change) in enumerate(chunks):
        run.check_deadline(f"forward {number + 1} of {len(chunks)} over copies of the input")
        repeated = {key: value.repeat(steps, *([1] * (value.dim() - 1))) for key, value in run.inputs.items()}
        forward = forward_pass(
            run.model, run.arch, repeated, frozenset({EMBEDDING_GRADIENTS}), embeddings=change, fused=run.fused
        )
        assert forward.leaf is not None and forward.leaf.original is not None and forward.leaf.leaf is not None
        original = forward.leaf.original[:batch]  # (B, n, hidden): the same for every copy
        changed = forward.leaf.leaf.detach()  # (steps·B, n, hidden)
        if scores is None:
            scores = torch.zeros((rounds, batch, original.shape[1]), dtype=run.dtype, device=device)
        sums = run.objective.values(forward.logits).sum(dim=1)  # (K,): rows do not interact
        wrt = forward.gradient_inputs
        chunk = rounds_per_call(wrt, rounds, run.chunk_bytes, maps=False)
        for first in range(0, rounds, chunk):
            last = min(first + chunk, rounds)
            began = time.perf_counter()
            (gradient,) = batched_gradients(sums[first:last], wrt, retain=last < rounds)
            backward += time.perf_counter() - began
            with full_precision(device):
                if times_changed:
                    products = (gradient * changed.unsqueeze(0)).sum(dim=-1)  # (rounds, steps·B, n)
                    contribution = products.view(last - first, steps, batch, -1).sum(dim=1)
                else:
                    per_step = gradient.view(last - first, steps, batch, *gradient.shape[2:])
                    contribution = (per_step.sum(dim=1) * original.unsqueeze(0)).sum(dim=-1)
            scores[first:last] += contribution.to(scores.dtype)
    assert scores is not None
    return scores, backward


@register_forwards(
    "integrated_gradients",
    summary="integrated gradients on the input embeddings from a zero baseline, midpoint rule (saliency baseline)",
    class_specific=True,
    memory=gradient_memory(activations=5.7),
    gradients=True,
    rows_per_pass=_path_rows,
    cost=Cost.copies(COPY_GRADIENT_PASS, lambda options, length: int(options.get("n_steps", IG_STEPS))),
    options=(
        Option(
            "n_steps",
            "points on the path",
            default=lambda arch: IG_STEPS,
            minimum=lambda arch: 1,
            maximum=lambda arch: 1024,
        ),
        Option(
            "internal_batch_size",
            "rows per forward pass while integrating (bounds memory)",
            default=lambda arch: IG_INTERNAL_BATCH,
            minimum=lambda arch: 1,
            maximum=lambda arch: 4096,
        ),
    ),
)
def _integrated_gradients(run: ForwardInputs) -> ForwardScores:
    """Integrated gradients (Sundararajan et al. 2017) along ``t·x``, ``t`` at the midpoints of ``n_steps`` bins, for
    every round of the objective.

    The baseline is the zero input embedding (word embedding for text, with position and segment embeddings still
    added by the model; patch embedding for images). Each chunk of path points is one forward of the repeated batch
    (``internal_batch_size`` rows at a time, so memory stays bounded whatever ``n_steps`` is), on the model's fused
    attention when it has one, followed by one batched vector-Jacobian product per chunk of rounds. The score is
    linear in the gradient, so each chunk adds its share to the scores directly (the per-round gradients are never
    all kept).
    """
    n_steps = int(run.options["n_steps"])
    batch = batch_size(run.arch, run.inputs)
    device = model_device(run.model)
    steps_per_pass = max(1, int(run.options["internal_batch_size"]) // batch)
    chunks: list[tuple[int, Callable[[Tensor], Tensor]]] = []
    for start in range(0, n_steps, steps_per_pass):
        points = torch.arange(start, min(start + steps_per_pass, n_steps), dtype=run.dtype, device=device) + 0.5
        chunks.append((points.shape[0], _scaled((points / n_steps).repeat_interleave(batch))))
    scores, backward = _gradient_times_input(run, chunks, times_changed=False)
    return ForwardScores(scores / n_steps, backward)


#: SmoothGrad's defaults: noisy copies, noise as a fraction of the embeddings' deviation (Smilkov et al.'s 10-20%),
#: and its largest accepted value.
SMOOTHGRAD_SAMPLES = 16
SMOOTHGRAD_STDEV = 0.15
SMOOTHGRAD_MAX_STDEV = 10.0


def _embedding_mask(run: ForwardInputs, like: Tensor) -> Tensor:
    """``(B, n)`` bool: the input embeddings of real tokens (every patch of an image)."""
    if run.arch.modality == "image":
        return torch.ones(like.shape[:2], dtype=torch.bool, device=like.device)
    return run.inputs["attention_mask"].to(like.device).bool()


class _RowNoise:
    """SmoothGrad's noise: each row's own generator (seeded with ``seed``) draws ``(samples, real tokens, hidden)``
    standard normals at once, scaled by ``stdev`` times the standard deviation of the row's real input embeddings, so
    a row gets the same noise batched or alone (padding gets none)."""

    def __init__(self, samples: int, stdev: float, seed: int) -> None:
        self.samples, self.stdev, self.seed = samples, stdev, seed
        self.noise: Tensor | None = None  # (samples, B, n, hidden), drawn at the first forward

    def draw(self, embeddings: Tensor, mask: Tensor) -> Tensor:
        if self.noise is None:
            noise = torch.zeros((self.samples, *embeddings.shape), dtype=embeddings.dtype, device=embeddings.device)
            for row in range(embeddings.shape[0]):
                real = embeddings[row][mask[row]]
                generator = torch.Generator().manual_seed(self.seed)
                draws = torch.randn((self.samples, *real.shape), generator=generator, dtype=embeddings.dtype)
                scale = real.std() * self.stdev
                noise[:, row, mask[row]] = draws.to(embeddings.device) * scale
            self.noise = noise
        return self.noise


@register_forwards(
    "smoothgrad",
    summary="SmoothGrad (Smilkov et al. 2017) of gradient x input: mean over noisy copies of the input embeddings",
    class_specific=True,
    memory=gradient_memory(activations=5.7),
    gradients=True,
    rows_per_pass=lambda rows, options: (
        rows * min(copies_per_pass(rows, options), int(options.get("n_samples", SMOOTHGRAD_SAMPLES)))
    ),
    cost=Cost.copies(COPY_GRADIENT_PASS, lambda options, length: int(options.get("n_samples", SMOOTHGRAD_SAMPLES))),
    options=(
        Option.fixed("n_samples", "noisy copies of each row", SMOOTHGRAD_SAMPLES, 1, 256),
        Option.fixed_float(
            "stdev",
            "noise standard deviation, as a fraction of the row's input-embedding standard deviation (0: grad_x_input)",
            SMOOTHGRAD_STDEV,
            0.0,
            SMOOTHGRAD_MAX_STDEV,
        ),
        Option.fixed("seed", "seed of each row's noise", 0, 0, 2**31 - 1),
        INTERNAL_BATCH,
    ),
)
def _smoothgrad(run: ForwardInputs) -> ForwardScores:
    """SmoothGrad of gradient × input, as Captum's ``NoiseTunnel(InputXGradient)`` computes it: the mean over
    ``n_samples`` noisy copies ``x + ε`` of ``Σ_hidden (x + ε) · ∂ objective / ∂(x + ε)``, for every round.

    The copies run ``internal_batch_size`` rows per forward (copy-major, on the model's fused attention where it
    has one), each followed by one batched vector-Jacobian product per chunk of rounds, as integrated gradients'
    path points do.
    """
    samples = int(run.options["n_samples"])
    batch = batch_size(run.arch, run.inputs)
    per_pass = copies_per_pass(batch, run.options)
    noise = _RowNoise(samples, float(run.options["stdev"]), int(run.options["seed"]))
    chunks: list[tuple[int, Callable[[Tensor], Tensor]]] = []
    for start in range(0, samples, per_pass):
        stop = min(start + per_pass, samples)

        def noisy(embeddings: Tensor, start: int = start, stop: int = stop) -> Tensor:
            original = embeddings[:batch]
            drawn = noise.draw(original, _embedding_mask(run, original))[start:stop]
            return embeddings + drawn.reshape(embeddings.shape)

        chunks.append((stop - start, noisy))
    scores, backward = _gradient_times_input(run, chunks, times_changed=True)
    return ForwardScores(scores / samples, backward)
