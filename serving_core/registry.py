"""The task registry: each servable task's name (a model's ``handler.task``) and its record, :class:`TaskFacts`.

A task's record carries every fact about it that the packager, the config validation, the loaders and the doors need:
the library task it is explained as, the model class and the head-class suffixes of its checkpoints, its TorchServe
entry file, whether a time budget applies, and the example requests the doors' usage lines show. The
records are plain data (no torch): the heavy :class:`~serving_core.task.Task` a record names is imported when a task
is first asked for (:func:`serving_core.task.get_task`).

``handler.task`` is one of the names of :data:`TASKS` or, for a task defined outside this project (a test's, a
plugin's), the import path ``module:attribute`` of its :class:`TaskFacts` (:func:`task_facts`): archives are trusted
code already, and the module must be importable by the serving processes.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

#: The TorchServe entry file of a task that names none of its own (``doors/torchserve/``): its handler reads the task
#: from the archive's ``handler.task``.
GENERIC_ENTRY_FILE = "entry.py"


@dataclass(frozen=True)
class TorchServeCall:
    """One example call of a TorchServe REST route, as the door's usage lines show it.

    Attributes:
        route: ``predictions`` or ``explanations``.
        data: curl's body argument, e.g. ``-d '{"text": "..."}'`` or ``--data-binary @picture.png``.
        content_type: the request's ``Content-Type``.
        comment: what the call shows (``""``: nothing to add).
    """

    route: str
    data: str
    content_type: str = "application/json"
    comment: str = ""


@dataclass(frozen=True)
class Examples:
    """A task's example requests, for the doors' usage lines and the docs.

    Attributes:
        torchserve: TorchServe REST calls (the body of each).
        oip: an OIP v2 ``infer`` request body (the explain extension's parameters included).
        v1: a KServe v1 ``:explain`` request body.
    """

    torchserve: tuple[TorchServeCall, ...]
    oip: str
    v1: str


@dataclass(frozen=True)
class TaskFacts:
    """What is known about a task without importing it (no torch).

    Attributes:
        name: the task's name (its ``handler.task`` when registered in :data:`TASKS`).
        task: ``module:attribute`` of its :class:`~serving_core.task.Task` instance.
        explained_as: the library task (:data:`explainers.TASKS`) its models are explained as:
            ``sequence_classification``, ``token_classification`` or ``causal_lm``.
        model_class: the ``transformers`` Auto class its checkpoints are loaded with when ``config.architectures``
            names no class the explainers accept.
        head_suffixes: how the class names of its checkpoints (``config.architectures[0]``) end: the packager finds a
            checkpoint's task by them.
        examples: its example requests.
        labelled: its models have class names (``handler.labels``); else they have none.
        input_kind: what a request carries: ``text`` or ``image``.
        time_budget: its batches are estimated against ``handler.time_budget_s``.
        memory_budget: ``handler.memory_budget_mib`` applies to it.
        entry_file: its TorchServe entry file in ``doors/torchserve/`` (:data:`GENERIC_ENTRY_FILE`: the generic one).
        chat: its models take chat messages (``chat_template``, ``max_messages``, ``max_documents``) and answer the
            OpenAI API (chat/completions) on the doors that have one.
    """

    name: str
    task: str
    explained_as: str
    model_class: str
    head_suffixes: tuple[str, ...]
    examples: Examples
    labelled: bool = True
    input_kind: str = "text"
    time_budget: bool = True
    memory_budget: bool = False
    entry_file: str = GENERIC_ENTRY_FILE
    chat: bool = False


_TEXT_CALL = '-d \'{"text": "what a lovely day"}\''

#: Task name → its record. One entry per task.
TASKS: dict[str, TaskFacts] = {
    facts.name: facts
    for facts in (
        TaskFacts(
            name="text",
            task="serving_core.tasks.classification:TEXT",
            explained_as="sequence_classification",
            model_class="AutoModelForSequenceClassification",
            head_suffixes=("ForSequenceClassification",),
            examples=Examples(
                torchserve=(
                    TorchServeCall("predictions", _TEXT_CALL),
                    TorchServeCall("explanations", _TEXT_CALL, comment="the default method"),
                    TorchServeCall(
                        "predictions",
                        '-d \'{"text": "what a lovely day", "explain": {"below": 0.8}}\'',
                        comment="explained only if unsure",
                    ),
                ),
                oip='{"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["what a lovely day"]}], '
                '"parameters": {"explain_method": "default"}}',
                v1='{"instances": ["what a lovely day"]}',
            ),
            memory_budget=True,
            entry_file="text_handler.py",
        ),
        TaskFacts(
            name="image",
            task="serving_core.tasks.classification:IMAGE",
            explained_as="sequence_classification",
            model_class="AutoModelForImageClassification",
            head_suffixes=("ForImageClassification", "ForImageClassificationWithTeacher"),
            examples=Examples(
                torchserve=(TorchServeCall("explanations", "--data-binary @picture.png", "image/png"),),
                oip='{"inputs": [{"name": "image", "datatype": "BYTES", "shape": [1], "data": ["<base64 PNG>"]}], '
                '"parameters": {"explain_method": "default"}}',
                v1='{"instances": [{"image": {"b64": "<base64 PNG>"}}]}',
            ),
            input_kind="image",
            memory_budget=True,
            entry_file="image_handler.py",
        ),
        TaskFacts(
            name="token_classification",
            task="serving_core.tasks.token_classification:TOKEN_CLASSIFICATION",
            explained_as="token_classification",
            model_class="AutoModelForTokenClassification",
            head_suffixes=("ForTokenClassification",),
            examples=Examples(
                torchserve=(
                    TorchServeCall(
                        "predictions", '-d \'{"text": "Ada Lovelace lived in London", "explain": {"method": "gae"}}\''
                    ),
                ),
                oip='{"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": '
                '["Ada Lovelace lived in London"]}], "parameters": {"explain_method": "default"}}',
                v1='{"instances": [{"text": "Ada Lovelace lived in London"}]}',
            ),
            entry_file="token_handler.py",
        ),
        TaskFacts(
            name="generation",
            task="serving_core.tasks.generation:GENERATION",
            explained_as="causal_lm",
            model_class="AutoModelForCausalLM",
            head_suffixes=("ForCausalLM", "LMHeadModel"),
            examples=Examples(
                torchserve=(
                    TorchServeCall(
                        "predictions",
                        '-d \'{"prompt": "the flight was", "max_new_tokens": 8, "explain": {"method": "attnlrp"}}\'',
                        comment="each generated token explained",
                    ),
                ),
                oip='{"inputs": [{"name": "prompt", "datatype": "BYTES", "shape": [1], "data": '
                '["The capital of France is"]}], "parameters": {"max_new_tokens": 8, "explain_method": "default"}}',
                v1='{"instances": [{"prompt": "The capital of France is", "max_new_tokens": 8}]}',
            ),
            labelled=False,
            entry_file="generation_handler.py",
            chat=True,
        ),
    )
}


def task_names() -> tuple[str, ...]:
    """The registered task names, in registry order."""
    return tuple(TASKS)


def is_task(name: object) -> bool:
    """Whether ``name`` is a registered task's name or the ``module:attribute`` import path of a :class:`TaskFacts`."""
    if not isinstance(name, str):
        return False
    try:
        task_facts(name)
    except (KeyError, TypeError):
        return False
    return True


def task_facts(name: str) -> TaskFacts:
    """The record of the task ``name``: a registered name, or the ``module:attribute`` import path of a record.

    Raises:
        KeyError: naming the registered tasks, if ``name`` is neither (or its module cannot be imported).
        TypeError: if the import path names something else than a :class:`TaskFacts`.
    """
    if name in TASKS:
        return TASKS[name]
    module_name, colon, attribute = name.partition(":")
    if not colon or not module_name or not attribute:
        raise KeyError(f"unknown task {name!r}; tasks: {', '.join(TASKS)} (or a TaskFacts' module:attribute)")
    try:
        facts = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as error:
        raise KeyError(f"task {name!r}: cannot import its record ({error})") from None
    if not isinstance(facts, TaskFacts):
        raise TypeError(f"task {name!r} names a {type(facts).__name__}, not a TaskFacts record")
    return facts


def task_of_architecture(architecture: str) -> TaskFacts | None:
    """The registered task whose head-class suffixes end ``architecture`` (a checkpoint's ``architectures[0]``);
    ``None``: no registered task serves it."""
    for facts in TASKS.values():
        if architecture.endswith(facts.head_suffixes):
            return facts
    return None
