"""What the explainers know of Hugging Face models, read from the model's own modules and config.

- :mod:`~explainers.architectures.support`: the families and tasks supported, and the methods each one refuses.
- :mod:`~explainers.architectures.description`: :class:`~explainers.architectures.description.Architecture`, one
  model described by references to its own modules (:func:`~explainers.architectures.description.describe`).
- :mod:`~explainers.architectures.blocks`: where each family keeps the linear layers Chefer et al.'s LRP reads.
- :mod:`~explainers.architectures.heads`: what a head reads (the explained position) and what it outputs.
- :mod:`~explainers.architectures.attention`: the capture of every attention call through transformers'
  ``AttentionInterface``, eager or fused.
- :mod:`~explainers.architectures.rule_hooks`: AttnLRP's and CP-LRP's rules attached to a model's modules for one
  pass.
"""
