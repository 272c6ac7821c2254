"""The attribution methods: a registry of what each declares it needs, and the methods, by family.

- :mod:`~explainers.methods.registry`: the registry (:func:`register`, :func:`get_method`,
  :func:`available_methods`) and the declaration types (:class:`Method`, :class:`Option`, :class:`Memory`,
  :class:`Cost`, the inputs and results of a method's compute or forwards).
- :mod:`~explainers.methods.attention`: the methods that read attention maps: ``attention``, ``rollout``,
  ``attention_flow``, and the maps weighted by their gradients, ``gae`` and ``gradcam``.
- :mod:`~explainers.methods.lrp`: layer-wise relevance propagation: Chefer et al.'s ``relevance``, ``partial_lrp``
  and ``lrp``, and ``attnlrp`` and ``cp_lrp`` as modified gradients.
- :mod:`~explainers.methods.lrp_pass`: Chefer et al.'s LRP pass from each row's target, for every head (a sequence
  head's class, a token-level target's terms).
- :mod:`~explainers.methods.gradients`: gradients with respect to the input embeddings: ``grad_x_input``,
  ``gradient``, ``integrated_gradients``, ``smoothgrad``.
- :mod:`~explainers.methods.perturbation`: ``occlusion``, and the prefix cache a causal LM's occluded copies reuse.

Importing this package registers every method. It re-exports the names the rest of the project imports from it.
"""

from . import attention, gradients, lrp, perturbation
from .attention import FLOW_MAX_TOKENS
from .gradients import SMOOTHGRAD_MAX_STDEV, SMOOTHGRAD_STDEV
from .perturbation import occluded_objectives
from .registry import (
    COPIES_PER_PASS,
    Cost,
    Footprint,
    ForwardInputs,
    ForwardScores,
    Memory,
    Method,
    MethodInputs,
    Objective,
    Option,
    OptionValue,
    Rules,
    available_methods,
    get_method,
    register,
    register_forwards,
)

__all__ = [
    "COPIES_PER_PASS",
    "FLOW_MAX_TOKENS",
    "SMOOTHGRAD_MAX_STDEV",
    "SMOOTHGRAD_STDEV",
    "Cost",
    "Footprint",
    "ForwardInputs",
    "ForwardScores",
    "Memory",
    "Method",
    "MethodInputs",
    "Objective",
    "Option",
    "OptionValue",
    "Rules",
    "attention",
    "available_methods",
    "get_method",
    "gradients",
    "lrp",
    "occluded_objectives",
    "perturbation",
    "register",
    "register_forwards",
]
