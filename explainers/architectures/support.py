"""The support matrix: which methods each architecture family and each task refuses, and why.

The families are the records of :mod:`explainers.architectures.families` (:data:`FAMILIES`); a method not listed in
a family's ``refused`` works on it, and a refused one has the reason there, in one sentence. This module asks those
records, for :func:`explainers.describe` and the explainers' entry points (:func:`check_method`), for the refusal
message of :class:`~explainers.errors.UnsupportedMethodError`, for the README table (:func:`support_table`) and for
the generated test matrix (:func:`support_matrix`).

A family's classes come in three tasks (:data:`TASKS`): sequence classifiers (one label per input, explained by
:func:`explainers.explain` / :func:`explainers.explain_batch`), token classifiers (a label per token, explained by
:func:`explainers.explain_tokens`) and causal language models (a token per step, explained by
:func:`explainers.explain_generation`). The token-level tasks are explained through :mod:`explainers.tasks.targets`;
a task may refuse a method for all its families (:attr:`Task.refused`), with the reason here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..defaults import DEFAULT_METHOD
from ..errors import UnsupportedMethodError
from .families import FAMILIES, TaskName


@dataclass(frozen=True)
class Task:
    """What a model class predicts, and where it is explained.

    Attributes:
        name: ``sequence_classification``, ``token_classification`` or ``causal_lm``.
        title: how the docs name it.
        entry_point: the public function that explains models of this task.
        refused: method name → why the method is refused for every model of this task.
    """

    name: TaskName
    title: str
    entry_point: str
    refused: Mapping[str, str] = field(default_factory=dict)


TASKS: dict[str, Task] = {
    task.name: task
    for task in (
        Task("sequence_classification", "sequence classifier", "explainers.explain / explainers.explain_batch"),
        Task("token_classification", "token classifier", "explainers.explain_tokens"),
        Task("causal_lm", "causal language model", "explainers.explain_generation"),
    )
}


def refusal(model_type: str, method: str, task: str = "sequence_classification") -> str | None:
    """Why ``method`` is refused on ``model_type`` for ``task`` (``None`` if it works there or the type is unknown).

    A family's own refusal comes first (it holds for every task of the family), then the task's.
    """
    known = FAMILIES.get(model_type)
    if known is None:
        return None
    reason = known.refused.get(method)
    if reason is None and task in TASKS:
        reason = TASKS[task].refused.get(method)
    return reason


def working_methods(model_type: str, methods: Sequence[str], task: str = "sequence_classification") -> list[str]:
    """The methods among ``methods`` that work on ``model_type`` for ``task``, in the given order.

    :func:`explainers.supported_methods` is the public question over every registered method.
    """
    return [method for method in methods if refusal(model_type, method, task) is None]


def check_method(model_type: str, method: str, methods: Sequence[str], task: str = "sequence_classification") -> None:
    """Raise :class:`UnsupportedMethodError` if ``method`` is refused on ``model_type`` for ``task``.

    Args:
        model_type: ``config.model_type``.
        method: a registered method name.
        methods: every registered method name (to list the ones that work).
        task: the model's task (:data:`TASKS`).
    """
    reason = refusal(model_type, method, task)
    if reason is not None:
        working = ", ".join(working_methods(model_type, methods, task))
        if task == "sequence_classification":
            where, there = f"model type {model_type!r}", repr(model_type)
        else:
            where = there = f"{model_type!r} {TASKS[task].title}s"
        named = f"method {method!r}" + (" (the default method)" if method == DEFAULT_METHOD else "")
        raise UnsupportedMethodError(
            f"{named} is not supported for {where}: {reason}; methods that work on {there}: {working}"
        )


def support_matrix(methods: Sequence[str]) -> list[tuple[str, str, str | None]]:
    """Every (model type, method, refusal reason or ``None``) cell, model types sorted, methods in order."""
    return [(model_type, method, refusal(model_type, method)) for model_type in FAMILIES for method in methods]


def support_table(methods: Sequence[str]) -> str:
    """The support matrix as a Markdown table (the README's), with the refusal reasons as footnotes."""
    header = "| model type | family | " + " | ".join(f"`{method}`" for method in methods) + " |"
    lines = [header, "|" + "---|" * (len(methods) + 2)]
    reasons: dict[str, int] = {}
    for model_type, known in FAMILIES.items():
        cells = []
        for method in methods:
            reason = known.refused.get(method)
            if reason is None:
                cells.append("yes")
            else:
                number = reasons.setdefault(reason, len(reasons) + 1)
                cells.append(f"refused ({number})")
        lines.append(f"| `{model_type}` | {known.title} | " + " | ".join(cells) + " |")
    lines.append("")
    lines += [f"- ({number}) {reason}." for reason, number in reasons.items()]
    return "\n".join(lines)
