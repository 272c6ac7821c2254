"""Validation of a checkpoint folder before anything is written: :func:`validate` returns a :class:`Checkpoint` (what
the archive will say about the model) or raises the first problem found as a :class:`PackageError` whose message names
the problem and the fix.

Refused: not a local folder or no ``config.json``; an architecture the explainers do not support; a head that is not
a sequence or image classifier, or whose weights are missing or of the wrong shape; weights only as pickle or
unreadable safetensors; bad ``id2label`` or ``problem_type``; no tokenizer / image processor; no way to pad a batch;
a default method the architecture refuses; ``max_length`` beyond the model's positions; an unsafe archive name.
Generic labels (``LABEL_0``...) and a substituted pad token are served, with a warning. Only the config, the
safetensors headers and the tokenizer or image processor are read; the model is built on ``meta`` (no weights).
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from model_store.package.checkpoint_files import (
    conversion_command,
    is_vocabulary,
    read_config,
    safetensors_shapes,
    select_files,
)
from model_store.package.limits import (
    checked_max_length,
    config_image_size,
    generation_max_length,
)
from model_store.package.monitor_files import ARCHIVE_NAMES, check_baseline_fits, monitor_files
from model_store.package.settings import PackageError, Settings, Task, check_name
from serving_core.registry import TASKS, task_of_architecture

_GENERIC_LABEL = re.compile(r"LABEL_\d+")
_PROBLEM_TYPES = (None, "single_label_classification", "multi_label_classification", "regression")


@dataclass(frozen=True)
class Checkpoint:
    """A validated checkpoint folder: what the archive will say about it.

    Attributes:
        path: The folder as given.
        files: The top-level files copied into the archive, by name, resolved (symbolic links followed).
        task: the registered task that serves it (:data:`serving_core.registry.TASKS`).
        model_type: ``config.model_type``.
        architecture: The classifier class (``config.architectures[0]``).
        head_type: ``single_label``, ``multi_label`` or ``regression``.
        labels: Label names in index order.
        default_method: The method served when a request names none (one that works on this architecture).
        max_length: Text models: tokens per input served.
        max_length_reason: Why ``max_length`` is what it is (which limit applied), said by the packager and written
            into the archive's ``model-config.yaml``.
        threshold: Multi-label heads: the threshold served.
        image_size: Image models: ``(height, width)``.
        pad_token_id: Text models: the pad token the handler sets on the tokenizer and ``config.pad_token_id``
            (``None``: both already agree).
        chat_template: Generation models: the chat template setting to serve (``None``: the checkpoint's own).
        warnings: What is served but worth fixing (generic labels, a substituted pad token).
        left_out: Files of the folder not copied (pickle weights, code, sub-folders).
        monitor_files: The monitor's baseline and canary files, validated, by their names in the archive
            (:mod:`model_store.package.monitor_files`).
    """

    path: Path
    files: Mapping[str, Path]
    task: Task
    model_type: str
    architecture: str
    head_type: str
    labels: tuple[str, ...]
    default_method: str = "attnlrp"
    max_length: int | None = None
    max_length_reason: str | None = None
    threshold: float | None = None
    image_size: tuple[int, int] | None = None
    pad_token_id: int | None = None
    chat_template: str | None = None
    warnings: tuple[str, ...] = ()
    left_out: tuple[str, ...] = field(default_factory=tuple)
    monitor_files: Mapping[str, Path] = field(default_factory=dict)


def _task_of(architecture: str) -> Task | None:
    """The registered task whose head-class suffixes end ``architecture`` (:attr:`TaskFacts.head_suffixes
    <serving_core.registry.TaskFacts.head_suffixes>`)."""
    facts = task_of_architecture(architecture)
    return None if facts is None else facts.name


def _check_head(model: Any, shapes: Mapping[str, list[int]], architecture: str) -> None:
    """Every parameter outside the base model (the classification head) must be in the weights, with its shape."""
    prefix = f"{model.base_model_prefix}."
    expected = {key: list(value.shape) for key, value in model.state_dict().items() if not key.startswith(prefix)}
    missing = sorted(key for key in expected if key not in shapes)
    if missing:
        raise PackageError(
            f"the weights have no trained classification head ({', '.join(missing)} missing): this looks like a base "
            f"model; fine-tune a {architecture} and save it with save_pretrained before serving it"
        )
    for key, shape in expected.items():
        if shapes[key] != shape:
            raise PackageError(
                f"{key} has shape {shapes[key]} in the weights but config.json implies {shape}: make num_labels / "
                "id2label in config.json match the trained head"
            )


def _check_lm_head(model: Any, shapes: Mapping[str, list[int]], architecture: str) -> None:
    """The LM head must be in the weights with its shape, or tied to the input embeddings."""
    head = model.get_output_embeddings()
    weight = getattr(head, "weight", None)
    tied = bool(getattr(model.config.get_text_config(), "tie_word_embeddings", False))
    names = [key for key, value in model.named_parameters() if value is weight]
    if weight is None or (not tied and not any(name in shapes for name in names)):
        raise PackageError(
            f"the weights have no LM head ({', '.join(names) or 'lm_head.weight'} missing) and config.json does not "
            f"tie it to the embeddings: save the whole {architecture} with save_pretrained"
        )
    for name in names:
        if name in shapes and shapes[name] != list(weight.shape):
            raise PackageError(
                f"{name} has shape {shapes[name]} in the weights but config.json implies {list(weight.shape)}: make "
                "vocab_size in config.json match the trained model"
            )


def _labels(config: Any, head_type: str) -> tuple[tuple[str, ...], list[str]]:
    id2label = {int(key): str(value) for key, value in (config.id2label or {}).items()}
    count = int(config.num_labels)
    if sorted(id2label) != list(range(count)):
        raise PackageError(
            f"config.json's id2label has ids {sorted(id2label)} but the head has {count} outputs: write id2label as "
            '{"0": "first label", "1": ...} with one name per output'
        )
    labels = tuple(id2label[index] for index in range(count))
    if len(set(labels)) != len(labels):
        raise PackageError(f"config.json's id2label has repeated names {list(labels)}: give each output its own name")
    warnings: list[str] = []
    if head_type != "regression" and all(_GENERIC_LABEL.fullmatch(label) for label in labels):
        warnings.append(
            f"the labels are generic ({', '.join(labels[:3])}{', ...' if count > 3 else ''}): responses will use "
            'them; set id2label (and label2id) in config.json to real names, e.g. {"0": "negative", "1": "positive"}'
        )
    return labels, warnings


def _pad_token(tokenizer: Any, config: Any) -> tuple[int | None, list[str]]:
    """Decide how a batch is padded: returns the pad id the handler must set (None if nothing to change) and the
    warnings to show.

    Raises:
        PackageError: if there is neither a pad nor an EOS token, or if the EOS token would be the pad while the
            tokenizer also ends every input with it (the head reads the last non-pad token and would skip it).
    """
    tokenizer_pad = tokenizer.pad_token_id
    config_pad = getattr(config, "pad_token_id", None)
    if isinstance(config_pad, list):
        config_pad = config_pad[0] if config_pad else None
    if tokenizer_pad is not None and config_pad in (None, tokenizer_pad):
        return (tokenizer_pad if config_pad is None else None), []
    if config_pad is not None:
        if tokenizer_pad is not None:
            return config_pad, [
                f"the tokenizer pads with id {tokenizer_pad} but config.pad_token_id is {config_pad}; "
                f"padding with {config_pad}, the id the classification head was built with"
            ]
        return config_pad, []
    eos = tokenizer.eos_token_id
    if eos is None:
        raise PackageError(
            "neither the tokenizer nor config.json has a pad token, and there is no EOS token to pad with, so the "
            "model cannot be run on batches: set tokenizer.pad_token (tokenizer.save_pretrained) and pad_token_id "
            "in config.json"
        )
    sample = tokenizer("a b")["input_ids"]
    if sample and sample[-1] == eos:
        raise PackageError(
            f"there is no pad token and the tokenizer ends every input with its EOS token {tokenizer.eos_token!r}: "
            "padding with EOS would make the classification head skip it; add a pad token to the tokenizer "
            "(tokenizer.add_special_tokens) and set pad_token_id in config.json to the id the model was trained with"
        )
    return eos, [
        f"no pad token: batches are padded with the EOS token {tokenizer.eos_token!r} (id {eos}), as Hugging Face "
        "fine-tuning scripts do; set pad_token_id in config.json to silence this"
    ]


def _token_checks(labels: tuple[str, ...], settings: Settings) -> list[str]:
    """A token classifier's own checks: explain-when-unsure does not apply; a label set without a tagging scheme is
    served token by token (a warning)."""
    from explainers import label_scheme

    if settings.explain_below is not None:
        raise PackageError(
            "explain_below is for sequence classifiers: a token classifier explains every entity it finds (leave "
            "explain_below out for this model)"
        )
    scheme = label_scheme(labels)
    if scheme.name == "none":
        return [
            f"the labels ({', '.join(labels[:4])}{', ...' if len(labels) > 4 else ''}) follow no BIO/BIOES/IO "
            "scheme: every token is served as its own entity (name them B-X/I-X, or O and X, to group spans)"
        ]
    return []


def _chat_template(tokenizer: Any, template: str | None) -> list[str]:
    """Check the chat template a generation model will render messages with (the setting's, else the checkpoint's):
    it must render a one-message chat. A model with none is served for prompts only (a warning).

    Raises:
        PackageError: for a template that does not render a user message.
    """
    from explainers import ExplainError, chat_template_of, render_chat

    if chat_template_of(tokenizer, template) is None:
        return [
            "no chat template (the tokenizer has none and no chat_template setting is given): requests with "
            "'messages' will be refused with no_chat_template; set chat_template to serve chats"
        ]
    try:
        render_chat(tokenizer, [{"role": "user", "content": "hello"}], chat_template=template)
    except ExplainError as error:
        raise PackageError(f"the chat template does not render a user message: {error}") from None
    return []


def validate(path: Path | str, name: str, settings: Settings | None = None) -> Checkpoint:
    """Check that ``path`` is a checkpoint folder the service can serve under ``name``; reads only, writes nothing.

    Loads ``config.json``, the safetensors headers (no tensor data), the tokenizer or image processor, and builds
    the model's skeleton on the ``meta`` device (no memory for weights) to compare its head with the weights.

    Raises:
        PackageError: the first problem found, with the fix.
    """
    settings = settings or Settings()
    settings.check()
    check_name(name)
    monitored = monitor_files(settings.monitor, name)
    raw = str(path)
    if "://" in raw:
        raise PackageError(
            f"{raw!r} is a URL: only local checkpoint folders are packaged (no downloads); fetch it in a trusted "
            "environment first, e.g. `hf download ORG/NAME --local-dir DIR`, and pass DIR"
        )
    folder = Path(path).expanduser()
    if not folder.is_dir():
        hint = " (a model hub id is not accepted: download it first, e.g. `hf download ORG/NAME --local-dir DIR`)"
        raise PackageError(
            f"{folder} is not a folder{hint if not folder.exists() and raw.count('/') == 1 else ''}: pass the "
            "checkpoint folder that save_pretrained wrote (config.json, model.safetensors, tokenizer files)"
        )
    if not (folder / "config.json").is_file():
        raise PackageError(
            f"{folder} has no config.json: pass the folder that model.save_pretrained(folder) wrote "
            "(config.json, model.safetensors, tokenizer or image-processor files)"
        )
    files, left_out, pickled = select_files(folder)
    document = read_config(folder)
    from explainers import supported_model_types

    model_type = document.get("model_type")
    supported = supported_model_types()
    if model_type is None:
        raise PackageError("config.json has no model_type: re-save the model with model.save_pretrained(folder)")
    if model_type not in supported:
        raise PackageError(
            f"model type {model_type!r} is not supported by the explainers; supported: {', '.join(supported)}. "
            "Serve a checkpoint of one of those architectures"
        )
    architectures = document.get("architectures") or []
    architecture = str(architectures[0]) if architectures else ""
    task = _task_of(architecture)
    if task is None:
        raise PackageError(
            f"config.json's architectures is {architectures!r}: the service serves classifiers, "
            f"{model_type} ...ForSequenceClassification, ...ForTokenClassification or ...ForImageClassification, "
            "and causal LMs (...ForCausalLM, GPT2LMHeadModel); fine-tune a classification head and save it with "
            "save_pretrained"
        )
    if not any(file_name.endswith(".safetensors") for file_name in files):
        if pickled:
            raise PackageError(
                f"the weights are pickle files only ({', '.join(pickled)}), and loading pickle runs code: they are "
                "refused. Convert them to safetensors in a trusted environment, then package again (the pickle "
                f"files are then left out):\n  {conversion_command(folder.resolve(), task)}"
            )
        raise PackageError(
            f"{folder} has no weights (no *.safetensors file): save them with model.save_pretrained(folder)"
        )
    shapes = safetensors_shapes(files)
    with tempfile.TemporaryDirectory(prefix="explain-package-") as work:
        stage = Path(work)
        for file_name, source in files.items():
            (stage / file_name).symlink_to(source)
        checkpoint = _validate_staged(folder, stage, files, tuple(left_out), task, architecture, shapes, settings)
    baseline = monitored.get(ARCHIVE_NAMES["baseline"])
    if baseline is not None:
        check_baseline_fits(baseline, name, checkpoint.task, checkpoint.labels)
    return replace(checkpoint, monitor_files=monitored)


def _validate_staged(
    folder: Path,
    stage: Path,
    files: Mapping[str, Path],
    left_out: tuple[str, ...],
    task: Task,
    architecture: str,
    shapes: Mapping[str, list[int]],
    settings: Settings,
) -> Checkpoint:
    """The checks that load the config, the preprocessor and the model skeleton from the staged files."""
    import torch
    import transformers
    from transformers import AutoConfig, AutoImageProcessor, AutoTokenizer

    from explainers import DEFAULT_METHOD, ExplainError, describe, head_type, supported_methods
    from serving_core.config import DEFAULT_THRESHOLD
    from serving_core.loading import classifier_class

    try:
        config = AutoConfig.from_pretrained(str(stage), local_files_only=True)
    except Exception as error:  # transformers raises ValueError/OSError/KeyError for bad configs
        raise PackageError(
            f"config.json cannot be loaded by transformers ({error}); re-save it with save_pretrained"
        ) from None
    facts = TASKS[task]
    if facts.explained_as == "causal_lm":  # an LM is built as its Auto class names it
        model_class: Any = getattr(transformers, facts.model_class)
    else:
        model_class = classifier_class(config, task)
    try:
        with torch.device("meta"):  # the skeleton only: no memory for weights
            skeleton = model_class.from_config(config) if hasattr(model_class, "from_config") else model_class(config)
    except Exception as error:
        raise PackageError(f"transformers cannot build a {architecture} from config.json ({error})") from None
    if type(skeleton).__name__ != architecture:
        raise PackageError(
            f"config.json names {architecture}, but a {config.model_type} {task} classifier is a "
            f"{type(skeleton).__name__}: the service serves only those classifiers"
        )
    try:
        describe(skeleton)
    except ExplainError as error:
        raise PackageError(f"the explainers cannot explain this model: {error}") from None
    if task == "generation":
        _check_lm_head(skeleton, shapes, architecture)
    else:
        _check_head(skeleton, shapes, architecture)
    methods = supported_methods(str(config.model_type), facts.explained_as)
    default_method = settings.default_method or (DEFAULT_METHOD if DEFAULT_METHOD in methods else "gae")
    if default_method not in methods:
        raise PackageError(
            f"default_method {default_method!r} does not work on {config.model_type} models; choose one of "
            f"{', '.join(methods)}"
        )
    problem_type = getattr(config, "problem_type", None)
    if problem_type not in _PROBLEM_TYPES:
        raise PackageError(
            f"config.json's problem_type {problem_type!r} is not one of {_PROBLEM_TYPES[1:]}: set it to the task the "
            "head was trained for (or remove it)"
        )
    labels: tuple[str, ...] = ()
    warnings: list[str] = []
    chat_template = settings.chat_template_text()
    if chat_template is not None and task != "generation":
        raise PackageError("chat_template applies to generation models (causal LMs) only")
    if task == "generation":
        head = "causal_lm"
        if settings.default_new_tokens > settings.max_new_tokens:
            raise PackageError(
                f"default_new_tokens ({settings.default_new_tokens}) exceeds max_new_tokens ({settings.max_new_tokens})"
            )
    else:
        head = head_type(skeleton)
        labels, warnings = _labels(config, head)
    threshold: float | None = None
    if head == "multi_label":
        from_config = getattr(config, "threshold", None)
        threshold = float(settings.threshold or from_config or DEFAULT_THRESHOLD)
        if not 0 < threshold < 1:
            raise PackageError(f"config.json's threshold {from_config!r} is not a probability in (0, 1)")
    image_size: tuple[int, int] | None = None
    pad_token_id: int | None = None
    max_length: int | None = None
    if task == "token_classification":
        warnings += _token_checks(labels, settings)
    max_length_reason: str | None = None
    if task == "generation":
        max_length, max_length_reason = generation_max_length(
            config, skeleton, settings.max_length, settings, default_method
        )
    elif facts.input_kind == "text":
        max_length = checked_max_length(config, settings.max_length)
    if facts.input_kind == "text":
        fix = "save it next to the model with tokenizer.save_pretrained(folder) (tokenizer.json or vocabulary files)"
        if not any(is_vocabulary(file_name) for file_name in files):
            raise PackageError(f"{folder} has no loadable tokenizer (no tokenizer.json or vocabulary file); {fix}")
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(stage), local_files_only=True)
        except Exception as error:
            raise PackageError(f"{folder} has no loadable tokenizer ({type(error).__name__}: {error}); {fix}") from None
        if task == "token_classification" and not getattr(tokenizer, "is_fast", False):
            raise PackageError(
                f"{folder}'s tokenizer is not a fast tokenizer (no tokenizer.json): a token classifier's entities are "
                "answered with character offsets, which only fast tokenizers give; save the model's fast tokenizer "
                "(AutoTokenizer.from_pretrained(..., use_fast=True).save_pretrained(folder))"
            )
        pad_token_id, pad_warnings = _pad_token(tokenizer, config)
        warnings += pad_warnings
        if task == "generation":
            warnings += _chat_template(tokenizer, chat_template)
    else:
        try:
            AutoImageProcessor.from_pretrained(str(stage), local_files_only=True)
        except Exception as error:
            raise PackageError(
                f"{folder} has no loadable image processor ({type(error).__name__}: {error}); save it next to the "
                "model with image_processor.save_pretrained(folder) (preprocessor_config.json)"
            ) from None
        image_size = config_image_size(config)
    return Checkpoint(
        path=folder,
        files=dict(files),
        task=task,
        model_type=str(config.model_type),
        architecture=architecture,
        head_type=head,
        labels=labels,
        default_method=default_method,
        max_length=max_length,
        max_length_reason=max_length_reason,
        threshold=threshold,
        image_size=image_size,
        pad_token_id=pad_token_id,
        chat_template=chat_template,
        warnings=tuple(warnings),
        left_out=left_out,
    )
