"""Models whose head has an output at every position, explained for many targets from one forward.

- :mod:`~explainers.tasks.targets`: the many-target core: ``K`` rounds of targets over a batch, one forward, batched
  vector-Jacobian products (:func:`~explainers.tasks.targets.explain_targets`).
- :mod:`~explainers.tasks.token_classification`: token classifiers (NER, PII): every entity of a batch explained.
- :mod:`~explainers.tasks.tagging`: the tagging scheme read from ``id2label`` (BIO, BIOES, IO), tags grouped into
  spans.
- :mod:`~explainers.tasks.generation`: causal language models: every generated token explained.
- :mod:`~explainers.tasks.continuation`: what a causal LM wrote after each prompt, generated here or given.
- :mod:`~explainers.tasks.citations`: spans of an answer (its sentences) explained as summed objectives from one
  forward, and the documents each one rests on.
"""
