"""The task registry: each servable task's name (a model's ``handler.task``) and where its
:class:`~serving_core.task.Task` lives.

The entries are import paths, imported when a task is first asked for (a task module imports its own service and its
model classes; config validation needs only the names); every door, the config validation and the docs read this
one table.
"""

from __future__ import annotations

import importlib
from typing import Any

from .task import Task

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


def get_task(name: str) -> Task[Any, Any]:
    """The task registered under ``name``.

    Raises:
        KeyError: naming the registered tasks, if ``name`` is not one.
        TypeError: if the entry does not name a task of that name (a broken registry entry).
    """
    if name not in TASKS:
        raise KeyError(f"unknown task {name!r}; tasks: {', '.join(TASKS)}")
    module_name, _, attribute = TASKS[name].partition(":")
    task = getattr(importlib.import_module(module_name), attribute)
    if not isinstance(task, Task) or task.name != name:
        raise TypeError(f"registry entry {TASKS[name]!r} is not the Task named {name!r}")
    return task
