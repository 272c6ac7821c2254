"""Pure tensor maths of the attribution methods: tensors in, tensors out, no model, no hooks.

- :mod:`~explainers.rules.maps`: attention maps (and their gradients or relevances) to token scores: raw attention,
  rollout, GAE, and the rollout of Chefer et al.'s relevance.
- :mod:`~explainers.rules.lrp`: Chefer et al.'s LRP rules through a Transformer block and a classification head.
- :mod:`~explainers.rules.attnlrp`: AttnLRP's rules as value-preserving modifications of the gradient.
"""
