"""The typed handler configuration, read once from the ``handler:`` section of an archive's ``model-config.yaml``."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from explainers import DEFAULT_METHOD, available_methods

from .registry import TASKS as TASKS_FACTS
from .registry import is_task, task_facts, task_names

#: Multi-label threshold when neither the user nor the checkpoint's config sets one.
DEFAULT_THRESHOLD = 0.5
#: The environment variable that sets the default method of every model a process serves (``explain-serve
#: --default-method``); it takes precedence over each model's ``handler.default_method``. Unset: each model's setting,
#: else the library's :data:`explainers.DEFAULT_METHOD` (``attnlrp``), re-exported here as :data:`DEFAULT_METHOD`.
DEFAULT_METHOD_ENV = "EXPLAIN_DEFAULT_METHOD"

#: The registered handler tasks (:data:`serving_core.registry.TASKS`, whose records say what each takes). A
#: ``handler.task`` may also be the ``module:attribute`` of a task record defined elsewhere
#: (:func:`serving_core.registry.task_facts`).
TASKS = task_names()

#: Keys the ``handler:`` section may hold.
_KNOWN_KEYS = frozenset(
    {
        "task",
        "model_dir",
        "default_method",
        "max_length",
        "max_text_chars",
        "labels",
        "device",
        "autocast_bf16",
        "image_size",
        "max_image_bytes",
        "max_image_pixels",
        "threads",
        "threshold",
        "pad_token_id",
        "max_new_tokens",
        "default_new_tokens",
        "explain_below",
        "memory_budget_mib",
        "time_budget_s",
        "chat_template",
        "max_messages",
        "max_documents",
        "records",
        "model_version",
        "monitor",
    }
)


class ConfigError(ValueError):
    """The ``handler:`` section of ``model-config.yaml`` is missing or invalid (the model fails to load)."""


@dataclass(frozen=True)
class HandlerConfig:
    """Settings of one served model.

    Attributes:
        task: the task's name (:data:`TASKS`) or its record's ``module:attribute``.
        model_dir: The Hugging Face checkpoint folder, relative to the archive.
        default_method: Method used when a request asks for an explanation without naming one:
            ``$EXPLAIN_DEFAULT_METHOD`` where set (every model of the deployment), else ``handler.default_method``, else
            :data:`explainers.DEFAULT_METHOD` (``attnlrp``). Checked against the model's family when it loads
            (:func:`serving_core.loading.check_default_method`).
        labels: Class names in index order.
        max_length: Text: tokens per input (special tokens included); longer texts are truncated and the response
            says ``truncated: true``.
        max_text_chars: Text: longest accepted text in characters (a bound on tokenization work); longer is 413.
        device: ``auto`` (CUDA when present), ``cpu`` or ``cuda``.
        autocast_bf16: Run the forward under bfloat16 autocast.
        image_size: Image: ``(height, width)`` of the model input.
        max_image_bytes: Image: largest accepted encoded image in bytes; larger is 413.
        max_image_pixels: Image: largest accepted decoded image (width × height); larger is 413.
        threads: torch intra-op threads of the worker (``None``: torch's default, one per core). Set 1 when
            several workers or other processes share few cores: oversubscribed OpenMP threads spin and stall.
        threshold: Multi-label heads: probability at or above which a label is predicted (``None``: 0.5).
        pad_token_id: Text: the token id batches are padded with, set on the tokenizer and ``config.pad_token_id``
            at load (``None``: the checkpoint's own, unchanged). Written by ``model_store.package`` for checkpoints
            without a pad token (it then pads with EOS).
        max_new_tokens: Generation: the most new tokens a request may ask for (more is ``too_many_tokens``).
        default_new_tokens: Generation: new tokens written when a request names none.
        explain_below: Explain when unsure, by default: a request that asks for an explanation without saying when
            gets it only if the prediction's confidence is below this probability in (0, 1] (``None``: always).
            A request overrides it (``"below": 0.9``, or ``"below": null`` for always).
        memory_budget_mib: Per-request memory budget in MiB: a row whose explanation is estimated to need more (at its
            own length; :mod:`explainers.memory`) is refused with ``over_memory_budget`` (413) before anything is
            allocated, instead of taking the worker down (``None``: no budget). A batch needs at most the sum of its
            rows' estimates: set it so that ``batchSize × memory_budget_mib`` fits beside the loaded model. Text and
            image tasks only (a token classification or generation model with it fails to load).
        time_budget_s: Per-batch time budget in seconds: before a batch runs, each explained row's time is estimated
            from its method, options and length and the model's speed measured at load (:mod:`explainers.timing`);
            a row over the budget alone, or beside the rows already admitted to its batch, is refused with
            ``over_time_budget`` (413) instead of running past TorchServe's ``responseTimeout`` (which kills the
            worker). Default: half the archive's ``responseTimeout`` (TorchServe's 120 s when the yaml sets none),
            :func:`default_time_budget`. A token classifier's row is estimated for each entity it explains, a
            generation row for the tokens it may write and the steps it explains.
        records: The model's ``records:`` section (:mod:`records.settings`: a store URL, off, or a mapping of store,
            payload, retention_days and on_store_error), None when absent: the deployment's ``EXPLAIN_RECORDS`` and
            ``EXPLAIN_RECORDS_PAYLOAD`` environment then decides (:meth:`records.recorder.Recorder.open`).
        model_version: The model's version as its records name it: the archive's fingerprint, written into the
            ``handler:`` section by :func:`model_store.package.package` (None: an archive packaged elsewhere).
        monitor: The model's ``monitor:`` value (:mod:`monitoring.config`; None when absent: on with the defaults;
            ``false``: off). Checked when the model loads (:func:`monitoring.serving.start_monitor`).

    The ``generation`` task (causal LMs) has no labels; ``max_length`` bounds its prompts in tokens (a longer prompt
    is ``too_many_tokens``: a truncated prompt would change what is generated).
    """

    task: str
    labels: tuple[str, ...]
    model_dir: str = "model"
    default_method: str = DEFAULT_METHOD
    max_length: int = 128
    max_text_chars: int = 20_000
    device: Literal["auto", "cpu", "cuda"] = "auto"
    autocast_bf16: bool = False
    image_size: tuple[int, int] | None = None
    max_image_bytes: int = 2_000_000
    max_image_pixels: int = 16_000_000
    threads: int | None = None
    threshold: float | None = None
    pad_token_id: int | None = None
    max_new_tokens: int = 64
    default_new_tokens: int = 16
    explain_below: float | None = None
    memory_budget_mib: int | None = None
    time_budget_s: float | None = None
    chat_template: str | None = None
    max_messages: int = 64
    max_documents: int = 16
    records: Mapping[str, Any] | str | bool | None = field(default=None, hash=False)  # a mapping: not part of the hash
    model_version: str | None = None
    monitor: Any = field(default=None, hash=False)

    @classmethod
    def from_model_yaml(
        cls, model_yaml: Mapping[str, Any] | None, environ: Mapping[str, str] | None = None
    ) -> HandlerConfig:
        """Build the config from the parsed ``model-config.yaml`` (``context.model_yaml_config``).

        Args:
            model_yaml: the parsed ``model-config.yaml``.
            environ: the environment :data:`DEFAULT_METHOD_ENV` is read from (default: this process's).

        Raises:
            ConfigError: naming the key that is missing or wrong and what it should be.
        """
        section = (model_yaml or {}).get("handler")
        if not isinstance(section, Mapping):
            raise ConfigError("model-config.yaml has no `handler:` section (task, labels, ... ); rebuild the archive")
        unknown = sorted(set(section) - _KNOWN_KEYS)
        if unknown:
            raise ConfigError(f"unknown handler key(s) {unknown}; known: {sorted(_KNOWN_KEYS)}")
        task = section.get("task")
        if not is_task(task):
            raise ConfigError(
                f"handler.task must be one of {', '.join(TASKS)} (or a task record's module:attribute), got {task!r}"
            )
        assert isinstance(task, str)
        facts = task_facts(task)
        labels = section.get("labels", None if facts.labelled else [])
        if not facts.labelled and labels:
            raise ConfigError(f"handler.labels: a {facts.name} model has no labels (its outputs are not classes)")
        valid_labels = isinstance(labels, list) and all(isinstance(label, str) for label in labels)
        if facts.labelled and not (valid_labels and labels):
            raise ConfigError("handler.labels must be a non-empty list of class names")
        assert isinstance(labels, list)
        if len(set(labels)) != len(labels):
            raise ConfigError(f"handler.labels must be distinct, got {labels}")
        default_method = default_method_setting(section, os.environ if environ is None else environ)
        device = section.get("device", "auto")
        if device not in ("auto", "cpu", "cuda"):
            raise ConfigError(f"handler.device must be auto, cpu or cuda, got {device!r}")
        image_size: tuple[int, int] | None = None
        if facts.input_kind == "image":
            size = section.get("image_size")
            if not (isinstance(size, list) and len(size) == 2 and all(_positive_int(v) for v in size)):
                raise ConfigError(f"handler.image_size must be [height, width] for an image model, got {size!r}")
            image_size = (int(size[0]), int(size[1]))
        config = cls(
            task=task,
            labels=tuple(labels),
            model_dir=str(section.get("model_dir", "model")),
            default_method=default_method,
            max_length=_int_key(section, "max_length", 128),
            max_text_chars=_int_key(section, "max_text_chars", 20_000),
            device=device,
            autocast_bf16=bool(section.get("autocast_bf16", False)),
            image_size=image_size,
            max_image_bytes=_int_key(section, "max_image_bytes", 2_000_000),
            max_image_pixels=_int_key(section, "max_image_pixels", 16_000_000),
            threads=_int_key(section, "threads", 1) if section.get("threads") is not None else None,
            threshold=_threshold(section.get("threshold")),
            pad_token_id=_pad_token_id(section.get("pad_token_id")),
            max_new_tokens=_int_key(section, "max_new_tokens", 64),
            default_new_tokens=_int_key(section, "default_new_tokens", 16),
            explain_below=_explain_below(section.get("explain_below")),
            memory_budget_mib=(
                _int_key(section, "memory_budget_mib", 1) if section.get("memory_budget_mib") is not None else None
            ),
            time_budget_s=_time_budget(section, facts.time_budget, model_yaml or {}),
            chat_template=_chat_template(section.get("chat_template")),
            max_messages=_int_key(section, "max_messages", 64),
            max_documents=_int_key(section, "max_documents", 16),
            records=_records_section(section.get("records")),
            model_version=_model_version(section.get("model_version")),
            monitor=section.get("monitor"),
        )
        if config.max_length < 3 and facts.labelled:
            raise ConfigError(f"handler.max_length must be at least 3, got {config.max_length}")
        if config.memory_budget_mib is not None and not facts.memory_budget:
            budgeted = [name for name, record in TASKS_FACTS.items() if record.memory_budget]
            raise ConfigError(f"handler.memory_budget_mib applies to the {' and '.join(budgeted)} tasks only, not to "
                              f"{task!r}")  # fmt: skip
        chat_keys = sorted(key for key in ("chat_template", "max_messages", "max_documents") if key in section)
        if chat_keys and not facts.chat:
            chatting = [name for name, record in TASKS_FACTS.items() if record.chat]
            raise ConfigError(f"handler.{chat_keys[0]} applies to the {' and '.join(chatting)} task only, not to "
                              f"{task!r}")  # fmt: skip
        if config.default_new_tokens > config.max_new_tokens:
            raise ConfigError(
                f"handler.default_new_tokens ({config.default_new_tokens}) exceeds max_new_tokens "
                f"({config.max_new_tokens})"
            )
        return config

    @property
    def input_kind(self) -> Literal["text", "image"]:
        """What a request carries: ``image`` or ``text`` (:attr:`serving_core.registry.TaskFacts.input_kind`)."""
        return "image" if task_facts(self.task).input_kind == "image" else "text"


def default_method_setting(section: Mapping[str, Any], environ: Mapping[str, str]) -> str:
    """The default method a model's ``handler:`` section and the environment give (see
    :attr:`HandlerConfig.default_method`).

    Raises:
        ConfigError: if it is not a registered method (naming where it was set and the registered ones).
    """
    from_env = environ.get(DEFAULT_METHOD_ENV, "").strip()
    method, where = (from_env, DEFAULT_METHOD_ENV) if from_env else (
        section.get("default_method", DEFAULT_METHOD), "handler.default_method"
    )  # fmt: skip
    if method not in available_methods():
        raise ConfigError(f"{where} {method!r} is not a method; choose one of {', '.join(available_methods())}")
    return str(method)


#: TorchServe's ``responseTimeout`` (s) for an archive whose ``model-config.yaml`` sets none.
TORCHSERVE_RESPONSE_TIMEOUT = 120
#: The share of ``responseTimeout`` a batch's estimated time may take by default: the estimates err high, and the
#: rest is margin for the batch's decoding, encoding and a machine busier than when the speed was measured.
TIME_BUDGET_SHARE = 0.5
#: The tasks whose rows are estimated against a time budget (every registered task whose record says so).
TIME_BUDGET_TASKS = tuple(name for name, facts in TASKS_FACTS.items() if facts.time_budget)


def default_time_budget(model_yaml: Mapping[str, Any]) -> float:
    """The default ``time_budget_s``: :data:`TIME_BUDGET_SHARE` of the archive's ``responseTimeout``."""
    timeout = model_yaml.get("responseTimeout", TORCHSERVE_RESPONSE_TIMEOUT)
    if not _positive_int(timeout):
        raise ConfigError(f"responseTimeout must be a positive integer (seconds), got {timeout!r}")
    return TIME_BUDGET_SHARE * float(timeout)


def _time_budget(section: Mapping[str, Any], applies: bool, model_yaml: Mapping[str, Any]) -> float | None:
    """``handler.time_budget_s`` (a positive number of seconds), its default where a time budget ``applies`` to the
    task (:attr:`serving_core.registry.TaskFacts.time_budget`), else ``None``."""
    value = section.get("time_budget_s")
    if value is None:
        return default_time_budget(model_yaml) if applies else None
    if not applies:
        raise ConfigError(f"handler.time_budget_s applies to the tasks {TIME_BUDGET_TASKS} only")
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ConfigError(f"handler.time_budget_s must be a positive number of seconds, got {value!r}")
    return float(value)


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _threshold(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1:
        raise ConfigError(f"handler.threshold must be a probability in (0, 1), got {value!r}")
    return float(value)


def _explain_below(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
        raise ConfigError(f"handler.explain_below must be a probability in (0, 1], got {value!r}")
    return float(value)


def _chat_template(value: Any) -> str | None:
    """A chat template: a non-empty string that parses as a Jinja template."""
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"handler.chat_template must be a Jinja chat template (a non-empty string), got {value!r}")
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    try:
        environment.parse(value)
    except jinja2.TemplateSyntaxError as error:
        if "generation" not in str(error):  # transformers' own {% generation %} tag is not plain Jinja
            raise ConfigError(
                f"handler.chat_template is not a valid Jinja template: {error} (line {error.lineno})"
            ) from None
    return value


def _records_section(value: Any) -> Mapping[str, Any] | str | bool | None:
    """``handler.records``: a mapping, a store URL, or off (``false``/``off``); None when absent. Its values are
    checked by :func:`records.settings.records_settings` when the model loads (they may come from the environment)."""
    if value is None or value is False or isinstance(value, str):
        return value
    if not isinstance(value, Mapping):
        raise ConfigError(f"handler.records must be a store URL, a mapping (store, payload, ...) or off, got {value!r}")
    return dict(value)


def _model_version(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"handler.model_version must be a non-empty string, got {value!r}")
    return value


def _pad_token_id(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"handler.pad_token_id must be a token id (an integer >= 0), got {value!r}")
    return value


def _int_key(section: Mapping[str, Any], key: str, default: int) -> int:
    value = section.get(key, default)
    if not _positive_int(value):
        raise ConfigError(f"handler.{key} must be a positive integer, got {value!r}")
    return int(value)
