"""What the explainers know of Hugging Face models, read from the model's own modules and config.

- :mod:`~explainers.architectures.families`: one :class:`~explainers.architectures.families.Family` record per
  supported ``config.model_type``, holding every fact the library knows of the family (its classes per task, where
  its classifiers pool, whether it takes segments, its LRP blocks, what it refuses).
- :mod:`~explainers.architectures.support`: the tasks, and the questions asked of the records: which methods a
  family refuses and why, the support table.
- :mod:`~explainers.architectures.description`: :class:`~explainers.architectures.description.Architecture`, one
  model described by references to its own modules (:func:`~explainers.architectures.description.describe`).
- :mod:`~explainers.architectures.blocks`: the modules Chefer et al.'s LRP reads, found by the family's description.
- :mod:`~explainers.architectures.heads`: what a head reads (the explained position) and what it outputs.
- :mod:`~explainers.architectures.attention`: the capture of every attention call through transformers'
  ``AttentionInterface``, eager or fused.
- :mod:`~explainers.architectures.rule_hooks`: AttnLRP's and CP-LRP's rules attached to a model's modules for one
  pass.
"""
