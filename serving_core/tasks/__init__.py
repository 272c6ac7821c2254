"""The served tasks, one :class:`~serving_core.task.Task` each, registered in :data:`serving_core.registry.TASKS`:

- :mod:`~serving_core.tasks.classification` (``text``, ``image``): ``classify_schema`` (rows, answer),
  ``classify_service`` (the classifier);
- :mod:`~serving_core.tasks.token_classification`: ``token_schema`` (entities), ``token_service``;
- :mod:`~serving_core.tasks.generation`: ``generation_schema`` (prompts, steps), ``generation_service`` (the
  service: generating the answers and filling them) over ``generation_prompts`` (rendering and checking prompts),
  ``generation_admission`` (time estimates), ``generation_stopping`` (stop sequences, deadlines),
  ``generation_logprobs`` (log-probabilities and their bytes) and ``generation_explanation`` (the planner's groups
  explained).
"""
