"""The methods of layer-wise relevance propagation: Chefer et al.'s LRP rules (``relevance``, their CVPR 2021 method,
and their baselines ``partial_lrp`` and ``lrp``), and AttnLRP's and CP-LRP's rules as modified gradients
(``attnlrp``, ``cp_lrp``).

Chefer et al.'s methods run one LRP pass per batch (:func:`~explainers.methods.lrp_pass.lrp_relevances`, the rules of
:mod:`explainers.rules.lrp`) on the activations the capture pass records, and read its relevances as each method says.
AttnLRP and CP-LRP compute what ``grad_x_input`` computes
(:func:`~explainers.methods.gradients.embedding_times_gradient`), under the rule hooks of
:func:`~explainers.architectures.rule_hooks.attach_rules`, which modify the gradient the capture pass records: one
compute function, declared three times with different ``rules`` (and the memory and time those take).
"""

from __future__ import annotations

from functools import partial

from torch import Tensor

from ..architectures.rule_hooks import attach_rules
from ..capture import ACTIVATIONS, ATTENTION_GRADIENTS, ATTENTIONS, EMBEDDING_GRADIENTS
from ..rules import maps
from ..rules.lrp import add_relprop as lrp_add_relprop
from .attention import START_LAYER
from .gradients import embedding_times_gradient
from .lrp_pass import lrp_relevances
from .registry import Cost, Footprint, Memory, MethodInputs, gradient_memory, register, scored_tokens

#: The memory shape of Chefer et al.'s LRP methods: the probabilities and their gradients, their relevances and what
#: the rules read (fitted as the note above :func:`~explainers.methods.registry.gradient_memory` says).
_LRP = Memory(Footprint(maps=4.0, transient=3.0, activations=8.0))

#: The costs (forward equivalents per row, :class:`~explainers.methods.registry.Cost`) of a gradient pass under
#: modified-gradient rules (``attnlrp``, ``cp_lrp``, whose hooks add to the backward), and of one with Chefer et al.'s
#: LRP rules and their kernels (``relevance``, ``lrp``, ``partial_lrp``). Checked against measured times with
#: ``bench/timing.py``.
RULES_PASS = 4.0
LRP_PASS = 6.0


@register(
    "relevance",
    summary="LRP relevance x attention gradients, rolled out (Chefer, Gur & Wolf, CVPR 2021)",
    class_specific=True,
    needs=frozenset({ATTENTIONS, ATTENTION_GRADIENTS, ACTIVATIONS}),
    memory=_LRP,
    cost=Cost.fixed(LRP_PASS),
    options=(START_LAYER,),
)
def _relevance(ctx: MethodInputs) -> Tensor:
    assert ctx.capture.attention_gradients is not None
    start_layer = int(ctx.options["start_layer"])
    relevances = lrp_relevances(ctx.capture, ctx.arch, ctx.terms, start_layer).attention
    return maps.relevance_scores(
        relevances, ctx.capture.attention_gradients, ctx.mask, start_layer, ctx.readout, ctx.read_tokens
    )


@register(
    "partial_lrp",
    summary="partial LRP: last layer's attention relevance, mean over heads (Voita et al. 2019; Chefer et al.'s "
    "generate_LRP_last_layer)",
    class_specific=True,
    needs=frozenset({ATTENTIONS, ACTIVATIONS}),
    memory=_LRP,
    cost=Cost.fixed(LRP_PASS),
)
def _partial_lrp(ctx: MethodInputs) -> Tensor:
    """Chefer et al.'s LRP down to the last block's attention probabilities only; their positive part, averaged over
    heads, the explained row with the tokens the head reads set to 0."""
    last = ctx.arch.num_layers - 1
    relevance = lrp_relevances(ctx.capture, ctx.arch, ctx.terms, last).attention[last]
    assert relevance is not None
    return maps.partial_lrp_scores(relevance, scored_tokens(ctx), ctx.readout, ctx.read_tokens)


@register(
    "lrp",
    summary="full LRP to the input of the first block, summed over hidden (Chefer et al.'s generate_full_lrp)",
    class_specific=True,
    needs=frozenset({ATTENTIONS, ACTIVATIONS}),
    memory=_LRP,
    cost=Cost.fixed(LRP_PASS),
)
def _lrp(ctx: MethodInputs) -> Tensor:
    """Chefer et al.'s LRP rules through every block to the first block's input, summed over the hidden dimension; for
    images the input's relevance is split between the patch (and prefix) embeddings and the position embeddings
    with the skip-connection rule first, as the authors' ViT code does. The tokens the head reads get 0."""
    below = lrp_relevances(ctx.capture, ctx.arch, ctx.terms, 0, to_input=True).below
    assert below is not None and ctx.capture.activations is not None
    if ctx.arch.input_positions is not None:
        hidden = ctx.capture.activations[0].hidden
        positions = ctx.arch.input_positions.detach().to(hidden.dtype).expand_as(hidden)
        below, _ = lrp_add_relprop(hidden - positions, positions, below)
    return maps.zero_read_tokens(below.sum(dim=-1), ctx.read_tokens) * scored_tokens(ctx)


register(
    "attnlrp",
    summary="AttnLRP (Achtibat et al., ICML 2024): LRP for attention as a modified gradient x input embedding",
    class_specific=True,
    needs=frozenset({EMBEDDING_GRADIENTS}),
    memory=gradient_memory(activations=5.2),
    cost=Cost.fixed(RULES_PASS),
    rules=partial(attach_rules, variant="attnlrp"),
)(embedding_times_gradient)

register(
    "cp_lrp",
    summary="CP-LRP (Ali et al. 2022): AttnLRP's rules with no relevance through the attention weights (conserves)",
    class_specific=True,
    needs=frozenset({EMBEDDING_GRADIENTS}),
    memory=gradient_memory(activations=3.7),
    cost=Cost.fixed(RULES_PASS),
    rules=partial(attach_rules, variant="cp_lrp"),
)(embedding_times_gradient)
