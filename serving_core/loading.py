"""Loading a served checkpoint, the same way for every task and every door.

A worker (TorchServe's, a KServe door's, a Ray Serve replica) first sets its torch threads and picks its device
(:func:`worker_device`); a task then loads its checkpoint folder with :func:`load_model` (local safetensors only —
never a download, never a pickle file — in eval mode, refused early if the architecture is not supported) and its
tokenizer with :func:`load_tokenizer` (the configured pad token applied to tokenizer and model alike). A model whose
family or task refuses its default method fails to load (:func:`check_default_method`), not at its first request.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import transformers
from torch import nn
from transformers import AutoConfig, AutoTokenizer

from explainers import FAMILIES, UnsupportedMethodError, available_methods, check_method, describe

from .config import DEFAULT_METHOD_ENV, ConfigError, HandlerConfig
from .registry import task_facts

logger = logging.getLogger(__name__)


def select_device(requested: str) -> torch.device:
    """``auto`` → CUDA when available, else CPU; ``cuda`` without a GPU is a configuration error.

    Raises:
        RuntimeError: for ``cuda`` on a machine without a CUDA device.
    """
    if requested == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("handler.device is 'cuda' but no CUDA device is available; use 'auto' or 'cpu'")
    if requested == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda")


def worker_device(config: HandlerConfig, gpu_id: int | None = None) -> torch.device:
    """Set the worker's torch threads (``handler.threads``) and choose its device.

    Args:
        config: the model's handler config.
        gpu_id: the GPU the server assigned to this worker (TorchServe's ``gpu_id``), if any.
    """
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    device = select_device(config.device)
    if device.type == "cuda" and gpu_id is not None:
        device = torch.device(f"cuda:{int(gpu_id)}")
    return device


def load_model(model_class: Any, model_dir: Path, device: torch.device, **kwargs: Any) -> nn.Module:
    """``model_class.from_pretrained`` on the folder: local safetensors only, moved to ``device``, in eval mode.

    Raises:
        UnsupportedModelError: if the explainers do not support the architecture.
    """
    model: nn.Module = model_class.from_pretrained(
        str(model_dir), local_files_only=True, use_safetensors=True, **kwargs
    )
    model = model.to(device).eval()
    describe(model)  # raises UnsupportedModelError at load, not at the first request
    return model


def check_default_method(method: str, model_type: str, task: str) -> None:
    """Refuse a default method that cannot explain ``model_type`` models of the serving ``task`` (the support
    registry's refusals, :mod:`explainers.architectures.support`), as the library task the serving task is explained
    as (:attr:`serving_core.registry.TaskFacts.explained_as`).

    Raises:
        ConfigError: naming the method, why it is refused, the methods that work there and the settings to change.
    """
    try:
        check_method(model_type, method, available_methods(), task_facts(task).explained_as)
    except UnsupportedMethodError as error:
        raise ConfigError(
            f"default method {method!r} cannot explain this model: {error}. Set the model's default_method (or "
            f"{DEFAULT_METHOD_ENV}, explain-serve --default-method) to one of those"
        ) from None


def classifier_class(model_config: Any, task: str) -> Any:
    """The class a checkpoint is loaded with: the one ``config.architectures`` names when the explainers accept it for
    its model type as the task's library task (e.g. ``DeiTForImageClassificationWithTeacher``, which the Auto class
    would not pick), else the task's Auto class (:attr:`serving_core.registry.TaskFacts.model_class`)."""
    facts = task_facts(task)
    names = getattr(model_config, "architectures", None) or []
    family = FAMILIES.get(str(getattr(model_config, "model_type", "")))
    wanted = facts.explained_as
    if names and family is not None and family.task_of(names[0]) == wanted and hasattr(transformers, names[0]):
        return getattr(transformers, names[0])
    return getattr(transformers, facts.model_class)


def load_classifier(config: HandlerConfig, model_dir: Path, device: torch.device) -> nn.Module:
    """A classifier checkpoint (sequence, image or token classification) loaded with :func:`classifier_class`'s class,
    its labels checked against ``handler.labels``.

    Raises:
        ValueError: if the checkpoint's labels disagree with ``config.labels``.
        ConfigError: if the model's family refuses ``config.default_method`` (:func:`check_default_method`).
    """
    checkpoint_config = AutoConfig.from_pretrained(str(model_dir), local_files_only=True)
    check_default_method(config.default_method, str(checkpoint_config.model_type), config.task)
    model = load_model(classifier_class(checkpoint_config, config.task), model_dir, device)
    labels = checkpoint_labels(model)
    if labels != config.labels:
        raise ValueError(f"handler.labels {config.labels} differ from the checkpoint id2label {labels}")
    return model


def load_tokenizer(model_dir: Path, model: nn.Module, pad_token_id: int | None) -> Any:
    """The folder's tokenizer (its own padding side: right for encoders, left for most decoders), padding with
    ``pad_token_id`` when one is configured (set on the tokenizer and on the model's config alike)."""
    tokenizer: Any = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    if pad_token_id is not None:
        if tokenizer.pad_token_id != pad_token_id:
            tokenizer.pad_token = tokenizer.convert_ids_to_tokens(pad_token_id)
        model_config: Any = model.config
        model_config.pad_token_id = pad_token_id
    return tokenizer


def checkpoint_labels(model: nn.Module) -> tuple[str, ...]:
    """The checkpoint's class names in index order (``config.id2label``)."""
    model_config: Any = model.config
    id2label = {int(key): value for key, value in model_config.id2label.items()}
    return tuple(id2label[index] for index in range(len(id2label)))


@contextlib.contextmanager
def autocast(config: HandlerConfig, device: torch.device) -> Iterator[None]:
    """bfloat16 autocast on ``device`` around the block when ``handler.autocast_bf16`` is set; else nothing."""
    if config.autocast_bf16:
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
            yield
    else:
        yield
