"""The task registry: each servable task's name (a model's ``handler.task``) and where its
:class:`~serving_core.task.Task` lives.

The entries are import paths, imported when a task is first asked for (:func:`serving_core.task.get_task`; a task
module imports its own service and its model classes, while config validation needs only the names); every door,
the config validation and the docs read this one table.
"""

from __future__ import annotations

#: Task name → ``module:attribute`` of its :class:`~serving_core.task.Task` instance. One entry per task.
TASKS: dict[str, str] = {
    "text": "serving_core.tasks.classification:TEXT",
    "image": "serving_core.tasks.classification:IMAGE",
    "token_classification": "serving_core.tasks.token_classification:TOKEN_CLASSIFICATION",
    "generation": "serving_core.tasks.generation:GENERATION",
}


def task_names() -> tuple[str, ...]:
    """The registered task names, in registry order."""
    return tuple(TASKS)
