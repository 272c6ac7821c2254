"""The methods that read attention maps: one layer's map, rollout and attention flow (class-agnostic), and the maps
weighted by their gradients (Chefer et al.'s GAE, and GradCAM on the last layer as their baseline).

All of them run on the architecture's eager attention (their needs include :data:`~explainers.capture.ATTENTIONS`);
the kernels are :mod:`explainers.rules.maps` and :mod:`explainers.rules.flow`.
"""

from __future__ import annotations

from torch import Tensor

from ..capture import ATTENTION_GRADIENTS, ATTENTIONS
from ..rules import maps
from ..rules.flow import attention_flow_scores
from .registry import Cost, Footprint, LengthLimit, Memory, MethodInputs, Option, register, scored_tokens

# ``rollout``, ``attention`` and ``attention_flow`` keep one head mean per layer; ``gae`` and ``gradcam`` keep the
# probabilities and their gradients (part of the activations are freed by then); fitted as the note above
# :func:`~explainers.methods.registry.gradient_memory` says.
_HEAD_MEAN = Memory(Footprint(maps=0.0, transient=2.0, activations=0.0, head_means=1.0))
_MAPS_AND_GRADIENTS = Memory(Footprint(maps=1.35, transient=2.0, activations=5.7))

#: The cost (forward equivalents per row, :class:`~explainers.methods.registry.Cost`) of the methods computed from a
#: gradient pass on eager attention with the maps' gradients (``gae``, ``gradcam``). Checked against measured times
#: with ``bench/timing.py``.
MAPS_GRADIENT_PASS = 4.0

#: The first block a rollout includes: ``rollout``'s option, and ``gae``'s and ``relevance``'s.
START_LAYER = Option(
    "start_layer",
    "first block included in the rollout (0 = all blocks)",
    default=lambda arch: 0,
    minimum=lambda arch: 0,
    maximum=lambda arch: arch.num_layers - 1,
)


@register(
    "attention",
    summary="attention of the explained row in one layer, mean over heads (cheap, class-agnostic, not faithful)",
    class_specific=False,
    needs=frozenset({ATTENTIONS}),
    memory=_HEAD_MEAN,
    cost=Cost.fixed(1.0),
    options=(
        Option(
            "layer",
            "block whose attention is shown; negative counts from the last (-1 = last)",
            default=lambda arch: -1,
            minimum=lambda arch: -arch.num_layers,
            maximum=lambda arch: arch.num_layers - 1,
        ),
    ),
)
def _attention(ctx: MethodInputs) -> Tensor:
    assert ctx.capture.attentions is not None
    return maps.raw_attention(ctx.capture.attentions[int(ctx.options["layer"])], ctx.readout) * ctx.mask


@register(
    "rollout",
    summary="attention rollout (Abnar & Zuidema 2020), class-agnostic",
    class_specific=False,
    needs=frozenset({ATTENTIONS}),
    memory=_HEAD_MEAN,
    cost=Cost.fixed(1.0),
    options=(START_LAYER,),
)
def _rollout(ctx: MethodInputs) -> Tensor:
    assert ctx.capture.attentions is not None
    return maps.rollout_scores(ctx.capture.attentions, int(ctx.options["start_layer"]), ctx.readout) * ctx.mask


#: Attention flow's longest input, chosen from ``python -m bench.attention_flow`` (docs/SERVING.md, "The founding
#: papers' baselines"): a full batch of 8 rows of 128 tokens takes ~21 s on one core, inside the archives' 60 s
#: responseTimeout; 256 tokens take ~13.5 s a row, 8 rows ~108 s.
FLOW_MAX_TOKENS = 128


#: Attention flow's solver time for a row of 128 tokens through one layer, in reference jobs (fitted with
#: ``python -m bench.timing``, which compares it with the measured time).
FLOW_JOBS_PER_LAYER = 40.0


def _flow_seconds(length: int, layers: int) -> float:
    """Attention flow's maximum flows for a row of ``length`` tokens through ``layers`` blocks, in reference jobs:
    one flow per token over a graph of ``layers × n²`` edges (~2.6 s at 128 tokens, 13.5 s at 256 on one core for the
    sentiment model: the time grows as ``n^2.4``)."""
    relative = length / 128
    return FLOW_JOBS_PER_LAYER * layers * max(relative**2.4, relative)  # short rows: one flow per token dominates


@register(
    "attention_flow",
    summary="attention flow (Abnar & Zuidema 2020): exact max-flow through rollout's layer graph, sums to 1",
    class_specific=False,
    needs=frozenset({ATTENTIONS}),
    memory=_HEAD_MEAN,
    cost=Cost(lambda options, length: 1.0, solver=_flow_seconds),
    length_limit=LengthLimit(
        FLOW_MAX_TOKENS,
        "attention flow solves one exact maximum flow per token over a graph of layers x n^2 edges (about 2.6 s a "
        "row at 128 tokens, 13.5 s at 256 on one core: docs/SERVING.md, 'The founding papers' baselines'); use "
        "rollout, which it refines, or a shorter input",
    ),
    packages={"scipy": "scipy>=1.11"},
)
def _attention_flow(ctx: MethodInputs) -> Tensor:
    assert ctx.capture.attentions is not None
    return attention_flow_scores(ctx.capture.attentions, ctx.mask, ctx.readout) * ctx.mask


@register(
    "gae",
    summary="gradient-weighted attention rollout (Chefer, Gur & Wolf, ICCV 2021)",
    class_specific=True,
    needs=frozenset({ATTENTIONS, ATTENTION_GRADIENTS}),
    memory=_MAPS_AND_GRADIENTS,
    cost=Cost.fixed(MAPS_GRADIENT_PASS),
    options=(START_LAYER,),
)
def _gae(ctx: MethodInputs) -> Tensor:
    assert ctx.capture.attentions is not None and ctx.capture.attention_gradients is not None
    return maps.gae_scores(
        ctx.capture.attentions,
        ctx.capture.attention_gradients,
        ctx.mask,
        int(ctx.options["start_layer"]),
        ctx.readout,
        ctx.read_tokens,
    )


@register(
    "gradcam",
    summary="GradCAM on the last layer's attention, as Chefer et al.'s baseline (their generate_attn_gradcam)",
    class_specific=True,
    needs=frozenset({ATTENTIONS, ATTENTION_GRADIENTS}),
    memory=_MAPS_AND_GRADIENTS,
    cost=Cost.fixed(MAPS_GRADIENT_PASS),
)
def _gradcam(ctx: MethodInputs) -> Tensor:
    """Each head's last-layer map times the mean of its gradient, averaged over heads, negative part dropped, rescaled
    to [0, 1]: over the whole map for text (the authors' BERT code), over the explained row's patches for images
    (their ViT code)."""
    capture = ctx.capture
    assert capture.attentions is not None and capture.attention_gradients is not None
    text = ctx.arch.modality == "text"
    return maps.gradcam_scores(
        capture.attentions[-1],
        capture.attention_gradients[-1],
        scored_tokens(ctx),
        ctx.readout,
        ctx.read_tokens,
        whole_map=text,
    )
