"""Package your own Hugging Face checkpoint folder as a TorchServe archive of the explanation service.

``python -m model_store.package PATH --name NAME [--out DIR] [options]`` validates the folder, then writes the
TorchServe ``no-archive`` folder ``DIR/NAME/`` (default ``DIR``: ``model_store/build/packages``), which any
TorchServe 0.12 with this project installed serves: ``torchserve --model-store DIR --models NAME=NAME``.
``python -m model_store.package --config models.yaml`` packages every model of a YAML file (docs/SERVING.md,
"Serve your own model"). ``make serve MODELS="name=path,..."`` calls the same code.

Validation happens before anything is written; each refusal is one :class:`PackageError` whose message names the
problem and the fix: not a local folder or no ``config.json``; an architecture the explainers do not support; a head
that is not a sequence or image classifier, or whose weights are missing; weights only as pickle (``*.bin``,
``*.pt``: loading pickle runs code) or unreadable safetensors; no tokenizer / image processor; no way to pad a batch;
an unsafe archive name. Generic labels (``LABEL_0``...) are served, with a warning.

Only the checkpoint's own top-level files of safe formats are copied (config and tokenizer JSON, safetensors,
vocabularies, sentencepiece models); pickle weights, Python files and sub-folders are left out. A package is reused
while its fingerprint (the checkpoint files' names, sizes and modification times, the settings, the handler and
packaging code, the archiver version) is unchanged.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import yaml

from model_store import DEFAULT_BUILD_DIR, REPO_ROOT
from model_store.archive import MANIFEST_PATH, ServingConfig, make_archive
from model_store.files import file_sha256
from model_store.fingerprint import digest, package_versions

logger = logging.getLogger(__name__)

DEFAULT_OUT = DEFAULT_BUILD_DIR / "packages"
FINGERPRINTS_DIR = ".fingerprints"
TEXT_HANDLER = REPO_ROOT / "handlers" / "text_handler.py"
IMAGE_HANDLER = REPO_ROOT / "handlers" / "image_handler.py"
#: A safe TorchServe model / archive name: no path separators, dots or leading dash; at most 64 characters.
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
#: Suffixes of the checkpoint files copied into an archive: formats that carry no code.
SAFE_SUFFIXES = frozenset({".json", ".safetensors", ".txt", ".model", ".jinja", ".tiktoken", ".md"})
#: Suffixes of pickle-based weight files (``torch.load`` of these runs code embedded in them).
PICKLE_SUFFIXES = frozenset({".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt"})
_GENERIC_LABEL = re.compile(r"LABEL_\d+")
_PROBLEM_TYPES = (None, "single_label_classification", "multi_label_classification", "regression")
#: The code an archive's behaviour depends on (hashed into the fingerprint).
_CODE_FILES = ("model_store/package.py", "model_store/archive.py")

Task = Literal["text", "image"]


class PackageError(ValueError):
    """A checkpoint that cannot be served; the message names the problem and the fix. Nothing was written."""


@dataclass(frozen=True)
class Settings:
    """The per-model settings a user tunes (command-line options or a YAML file's keys of the same names).

    Attributes:
        default_method: Method used when a request asks for an explanation without naming one (``None``:
            ``relevance`` where the architecture supports it, else ``gae``).
        max_length: Text: tokens per input (both segments of a pair together); longer inputs are truncated
            (``None``: 128, or the model's position limit if smaller).
        batch_size: TorchServe ``batchSize``: rows per batch.
        max_batch_delay: TorchServe ``maxBatchDelay`` in ms: how long a partial batch waits (a lone request waits
            all of it).
        device: ``auto`` (CUDA when present), ``cpu`` or ``cuda``.
        bf16: Run the forward under bfloat16 autocast (GPU).
        threshold: Multi-label heads: probability at or above which a label is predicted (default: the
            checkpoint config's ``threshold`` key, else 0.5).
        workers: TorchServe workers of the model (``minWorkers`` = ``maxWorkers``).
        response_timeout: TorchServe ``responseTimeout`` in s: a slower batch kills the worker.
    """

    default_method: str | None = None
    max_length: int | None = None
    batch_size: int = 8
    max_batch_delay: int = 2
    device: Literal["auto", "cpu", "cuda"] = "auto"
    bf16: bool = False
    threshold: float | None = None
    workers: int = 1
    response_timeout: int = 60

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], where: str) -> Settings:
        """Settings from a YAML mapping; ``where`` names it in error messages.

        Raises:
            PackageError: for an unknown key or a value of the wrong type or range.
        """
        known = {name: default for name, default in asdict(cls()).items()}
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise PackageError(f"{where}: unknown setting(s) {unknown}; known: {sorted(known)}")
        settings = cls(**{key: values[key] for key in values})
        settings.check(where)
        return settings

    def check(self, where: str = "settings") -> None:
        """Check types and ranges.

        Raises:
            PackageError: naming the setting and what it must be.
        """
        from explainers import available_methods

        if self.default_method is not None and self.default_method not in available_methods():
            raise PackageError(f"{where}: default_method {self.default_method!r} is not one of {available_methods()}")
        for key, low in (("max_length", 3), ("batch_size", 1), ("max_batch_delay", 1), ("workers", 1)):
            value = getattr(self, key)
            if key == "max_length" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise PackageError(f"{where}: {key} must be an integer >= {low}, got {value!r}")
        if isinstance(self.response_timeout, bool) or not isinstance(self.response_timeout, int):
            raise PackageError(f"{where}: response_timeout must be an integer number of seconds")
        if self.response_timeout < 1:
            raise PackageError(f"{where}: response_timeout must be at least 1 s, got {self.response_timeout}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise PackageError(f"{where}: device must be auto, cpu or cuda, got {self.device!r}")
        if not isinstance(self.bf16, bool):
            raise PackageError(f"{where}: bf16 must be true or false, got {self.bf16!r}")
        if self.threshold is not None and not (
            isinstance(self.threshold, int | float) and not isinstance(self.threshold, bool) and 0 < self.threshold < 1
        ):
            raise PackageError(f"{where}: threshold must be a probability in (0, 1), got {self.threshold!r}")


@dataclass(frozen=True)
class Checkpoint:
    """A validated checkpoint folder: what the archive will say about it.

    Attributes:
        path: The folder as given.
        files: The top-level files copied into the archive, by name, resolved (symbolic links followed).
        task: ``text`` or ``image``.
        model_type: ``config.model_type``.
        architecture: The classifier class (``config.architectures[0]``).
        head_type: ``single_label``, ``multi_label`` or ``regression``.
        labels: Label names in index order.
        default_method: The method served when a request names none (one that works on this architecture).
        max_length: Text models: tokens per input served.
        threshold: Multi-label heads: the threshold served.
        image_size: Image models: ``(height, width)``.
        pad_token_id: Text models: the pad token the handler sets on the tokenizer and ``config.pad_token_id``
            (``None``: both already agree).
        warnings: What is served but worth fixing (generic labels, a substituted pad token).
        left_out: Files of the folder not copied (pickle weights, code, sub-folders).
    """

    path: Path
    files: Mapping[str, Path]
    task: Task
    model_type: str
    architecture: str
    head_type: str
    labels: tuple[str, ...]
    default_method: str = "relevance"
    max_length: int | None = None
    threshold: float | None = None
    image_size: tuple[int, int] | None = None
    pad_token_id: int | None = None
    warnings: tuple[str, ...] = ()
    left_out: tuple[str, ...] = field(default_factory=tuple)


def check_name(name: str) -> str:
    """Return ``name`` if it is a safe archive name.

    Raises:
        PackageError: naming the rule.
    """
    if not isinstance(name, str) or NAME_PATTERN.fullmatch(name) is None:
        raise PackageError(
            f"{name!r} is not a safe model name: use 1-64 letters, digits, '_' or '-', starting with a letter or "
            "digit (it becomes a folder name and a URL path segment), e.g. --name my-classifier"
        )
    return name


def _select_files(path: Path) -> tuple[dict[str, Path], list[str], list[str]]:
    """The top-level files to copy, the names left out, and the pickle weight files among them."""
    selected: dict[str, Path] = {}
    left_out: list[str] = []
    pickled: list[str] = []
    for entry in sorted(path.iterdir()):
        if entry.is_dir():
            left_out.append(entry.name + "/")
            continue
        if not entry.is_file():  # a dangling link, a socket...
            left_out.append(entry.name)
            continue
        suffix = entry.suffix.lower()
        if suffix in PICKLE_SUFFIXES:
            pickled.append(entry.name)
        if suffix in SAFE_SUFFIXES and not entry.name.startswith("."):
            selected[entry.name] = entry.resolve()
        else:
            left_out.append(entry.name)
    return selected, left_out, pickled


def _read_config(path: Path) -> dict[str, Any]:
    config_path = path / "config.json"
    try:
        document = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise PackageError(
            f"{config_path} is not readable JSON ({error}); re-save the model with model.save_pretrained(folder)"
        ) from None
    if not isinstance(document, dict):
        raise PackageError(f"{config_path} must hold a JSON object; re-save the model with model.save_pretrained")
    return document


def _is_vocabulary(file_name: str) -> bool:
    """Whether a file holds a tokenizer's vocabulary (tokenizers JSON, WordPiece/BPE vocabulary, sentencepiece)."""
    return (
        file_name in ("tokenizer.json", "merges.txt")
        or file_name.startswith("vocab")
        or file_name.endswith((".model", ".tiktoken"))
    )


def _task_of(architecture: str) -> Task | None:
    if architecture.endswith("ForSequenceClassification"):
        return "text"
    if "ForImageClassification" in architecture:  # also DeiTForImageClassificationWithTeacher
        return "image"
    return None


def _conversion_command(path: Path, task: Task | None) -> str:
    auto = "AutoModelForImageClassification" if task == "image" else "AutoModelForSequenceClassification"
    return f"python -c \"from transformers import {auto} as M; M.from_pretrained('{path}').save_pretrained('{path}')\""


def _safetensors_keys(files: Mapping[str, Path]) -> dict[str, list[int]]:
    """Tensor name → shape of every tensor in the checkpoint's safetensors files (headers only, no data read).

    Raises:
        PackageError: if a file is not valid safetensors or a shard named by the index is missing.
    """
    from safetensors import safe_open

    index = files.get("model.safetensors.index.json")
    if index is not None:
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            shards = sorted(set(weight_map.values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
            raise PackageError(f"model.safetensors.index.json is not a valid shard index ({error})") from None
        missing = [shard for shard in shards if shard not in files]
        if missing:
            raise PackageError(f"the shard index names {missing}, which are not in the folder: copy them there")
    else:
        shards = sorted(name for name in files if name.endswith(".safetensors"))
    shapes: dict[str, list[int]] = {}
    for shard in shards:
        try:
            with safe_open(str(files[shard]), framework="pt") as handle:
                for key in handle.keys():  # noqa: SIM118 - safe_open is not a mapping
                    shapes[key] = list(handle.get_slice(key).get_shape())
        except Exception as error:  # safetensors raises SafetensorError or OSError for a damaged file
            raise PackageError(
                f"{shard} is not a readable safetensors file ({error}); save the weights again with "
                "model.save_pretrained(folder)"
            ) from None
    return shapes


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


#: Model types whose position ids start after the pad id (``max_position_embeddings`` counts those offsets).
_OFFSET_POSITIONS = frozenset({"roberta", "xlm-roberta", "camembert"})
DEFAULT_MAX_LENGTH = 128


def _max_length(config: Any, requested: int | None) -> int:
    """Tokens per input: ``requested``, else 128, never more than the model has positions for.

    Raises:
        PackageError: if ``requested`` exceeds the model's positions.
    """
    positions = getattr(config, "max_position_embeddings", None)
    if not isinstance(positions, int) or not getattr(config, "position_biased_input", True):
        limit = None  # no absolute position embeddings (relative or rotary positions)
    elif config.model_type in _OFFSET_POSITIONS:
        limit = positions - int(getattr(config, "pad_token_id", 1) or 1) - 1
    else:
        limit = positions
    if requested is None:
        return min(DEFAULT_MAX_LENGTH, limit) if limit is not None else DEFAULT_MAX_LENGTH
    if limit is not None and requested > limit:
        raise PackageError(
            f"max_length {requested} exceeds the {limit} positions of this {config.model_type} model: pass "
            f"--max-length {limit} or less"
        )
    return requested


def _image_size(config: Any) -> tuple[int, int]:
    size = getattr(config, "image_size", None)
    if isinstance(size, int) and size > 0:
        return size, size
    if isinstance(size, list | tuple) and len(size) == 2 and all(isinstance(v, int) and v > 0 for v in size):
        return int(size[0]), int(size[1])
    raise PackageError(f"config.json's image_size is {size!r}: set it to the model's input size (an int or [h, w])")


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
    files, left_out, pickled = _select_files(folder)
    document = _read_config(folder)
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
            f"{model_type} ...ForSequenceClassification or ...ForImageClassification; fine-tune a classification "
            "head and save it with save_pretrained"
        )
    if not any(file_name.endswith(".safetensors") for file_name in files):
        if pickled:
            raise PackageError(
                f"the weights are pickle files only ({', '.join(pickled)}), and loading pickle runs code: they are "
                "refused. Convert them to safetensors in a trusted environment, then package again (the pickle "
                f"files are then left out):\n  {_conversion_command(folder.resolve(), task)}"
            )
        raise PackageError(
            f"{folder} has no weights (no *.safetensors file): save them with model.save_pretrained(folder)"
        )
    shapes = _safetensors_keys(files)
    with tempfile.TemporaryDirectory(prefix="explain-package-") as work:
        stage = Path(work)
        for file_name, source in files.items():
            (stage / file_name).symlink_to(source)
        return _validate_staged(folder, stage, files, tuple(left_out), task, architecture, shapes, settings)


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
    from transformers import AutoConfig, AutoImageProcessor, AutoTokenizer

    from explainers import ExplainError, describe, head_type, supported_methods
    from handlers.config import DEFAULT_THRESHOLD
    from handlers.service import classifier_class

    try:
        config = AutoConfig.from_pretrained(str(stage), local_files_only=True)
    except Exception as error:  # transformers raises ValueError/OSError/KeyError for bad configs
        raise PackageError(
            f"config.json cannot be loaded by transformers ({error}); re-save it with save_pretrained"
        ) from None
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
    _check_head(skeleton, shapes, architecture)
    methods = supported_methods(str(config.model_type))
    default_method = settings.default_method or ("relevance" if "relevance" in methods else "gae")
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
    if task == "text":
        max_length = _max_length(config, settings.max_length)
        fix = "save it next to the model with tokenizer.save_pretrained(folder) (tokenizer.json or vocabulary files)"
        if not any(_is_vocabulary(file_name) for file_name in files):
            raise PackageError(f"{folder} has no loadable tokenizer (no tokenizer.json or vocabulary file); {fix}")
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(stage), local_files_only=True)
        except Exception as error:
            raise PackageError(f"{folder} has no loadable tokenizer ({type(error).__name__}: {error}); {fix}") from None
        pad_token_id, pad_warnings = _pad_token(tokenizer, config)
        warnings += pad_warnings
    else:
        try:
            AutoImageProcessor.from_pretrained(str(stage), local_files_only=True)
        except Exception as error:
            raise PackageError(
                f"{folder} has no loadable image processor ({type(error).__name__}: {error}); save it next to the "
                "model with image_processor.save_pretrained(folder) (preprocessor_config.json)"
            ) from None
        image_size = _image_size(config)
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
        threshold=threshold,
        image_size=image_size,
        pad_token_id=pad_token_id,
        warnings=tuple(warnings),
        left_out=left_out,
    )


def serving_config(checkpoint: Checkpoint, settings: Settings) -> ServingConfig:
    """The archive's ``model-config.yaml`` for a validated checkpoint."""
    extra: dict[str, Any] = {}
    if checkpoint.threshold is not None:
        extra["threshold"] = checkpoint.threshold
    if checkpoint.pad_token_id is not None:
        extra["pad_token_id"] = checkpoint.pad_token_id
    return ServingConfig(
        task=checkpoint.task,
        labels=checkpoint.labels,
        max_length=checkpoint.max_length,
        image_size=checkpoint.image_size,
        max_image_bytes=2_000_000 if checkpoint.task == "image" else None,
        default_method=checkpoint.default_method,
        device=settings.device,
        autocast_bf16=settings.bf16,
        min_workers=settings.workers,
        max_workers=settings.workers,
        batch_size=settings.batch_size,
        max_batch_delay_ms=settings.max_batch_delay,
        response_timeout_s=settings.response_timeout,
        extra_handler_keys=extra,
    )


def _handler(task: Task) -> Path:
    return TEXT_HANDLER if task == "text" else IMAGE_HANDLER


def fingerprint(checkpoint: Checkpoint, settings: Settings, name: str) -> tuple[str, dict[str, Any]]:
    """The package's fingerprint and the document it hashes: each copied file's name, size and modification time
    (hashing gigabytes of weights would take longer than packaging), the settings, the handler and packaging code and
    the archiver version."""
    handler = _handler(checkpoint.task)
    document = {
        "name": name,
        "files": {
            file_name: [source.stat().st_size, source.stat().st_mtime_ns, str(source)]
            for file_name, source in sorted(checkpoint.files.items())
        },
        "model_config": serving_config(checkpoint, settings).to_yaml(),
        "code": {path: file_sha256(REPO_ROOT / path) for path in (*_CODE_FILES, str(handler.relative_to(REPO_ROOT)))},
        "versions": package_versions(["torch-model-archiver", "transformers"]),
    }
    return digest(document), document


@dataclass(frozen=True)
class Packaged:
    """Outcome of :func:`package`."""

    name: str
    archive: Path
    checkpoint: Checkpoint
    reused: bool


def package(
    path: Path | str,
    name: str,
    out: Path = DEFAULT_OUT,
    settings: Settings | None = None,
    checkpoint: Checkpoint | None = None,
) -> Packaged:
    """Validate ``path`` (unless ``checkpoint`` is its validation already) and write (or reuse) its archive
    ``out/name``.

    Raises:
        PackageError: if the checkpoint is refused; nothing is written then.
        RuntimeError: if ``torch-model-archiver`` fails.
    """
    settings = settings or Settings()
    checkpoint = checkpoint or validate(path, name, settings)
    for warning in checkpoint.warnings:
        logger.warning("%s: %s", name, warning)
    if checkpoint.left_out:
        logger.info("%s: not packaged (not a safe checkpoint file): %s", name, ", ".join(checkpoint.left_out))
    archive = out / name
    stamp = out / FINGERPRINTS_DIR / f"{name}.json"
    expected, document = fingerprint(checkpoint, settings, name)
    try:
        stored = json.loads(stamp.read_text(encoding="utf-8")).get("fingerprint")
    except (OSError, ValueError, AttributeError):
        stored = None
    if stored == expected and (archive / MANIFEST_PATH).is_file():
        logger.info("%s: package up to date, reusing %s", name, archive)
        return Packaged(name, archive, checkpoint, reused=True)
    out.mkdir(parents=True, exist_ok=True)
    stamp.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".stage-{name}-", dir=out) as work:
        stage = Path(work) / "model"
        stage.mkdir()
        for file_name, source in checkpoint.files.items():
            (stage / file_name).symlink_to(source)
        make_archive(name, _handler(checkpoint.task), stage, serving_config(checkpoint, settings), archive)
    stamp.parent.mkdir(exist_ok=True)
    stamp.write_text(json.dumps({"fingerprint": expected, "inputs": document}, indent=2) + "\n", encoding="utf-8")
    logger.info("%s: packaged %s (%s, %s head) -> %s", name, checkpoint.architecture, checkpoint.task,
                checkpoint.head_type, archive)  # fmt: skip
    return Packaged(name, archive, checkpoint, reused=False)


@dataclass(frozen=True)
class ModelEntry:
    """One model to package: its name, checkpoint folder and settings."""

    name: str
    path: Path | str
    settings: Settings


def parse_models(spec: str, defaults: Settings | None = None) -> list[ModelEntry]:
    """Parse ``name=path[,name=path...]`` (``make serve MODELS=...``).

    Raises:
        PackageError: for an entry without ``=``, an unsafe name or a name given twice.
    """
    entries: list[ModelEntry] = []
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, separator, path = item.partition("=")
        if not separator or not path.strip():
            raise PackageError(f'MODELS entry {item!r} is not name=path, e.g. MODELS="reviews=/models/reviews"')
        entries.append(ModelEntry(check_name(name.strip()), path.strip(), defaults or Settings()))
    return _distinct(entries, "MODELS")


def read_models_file(path: Path) -> list[ModelEntry]:
    """Read a YAML file of several models::

        defaults:            # optional, applies to every model
          device: cpu
        models:
          reviews:
            path: /models/reviews          # relative paths are relative to the YAML file
            default_method: rollout
            max_length: 256
          tickets: {path: /models/tickets, threshold: 0.4}

    Raises:
        PackageError: if the file is unreadable or a key is unknown or wrong.
    """
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as error:
        raise PackageError(f"cannot read the models file {path}: {error}") from None
    if not isinstance(document, Mapping) or not isinstance(document.get("models"), Mapping):
        raise PackageError(f"{path}: expected a mapping with a `models:` section of name: {{path: ..., ...}}")
    unknown = sorted(set(document) - {"models", "defaults"})
    if unknown:
        raise PackageError(f"{path}: unknown top-level key(s) {unknown}; allowed: defaults, models")
    defaults = document.get("defaults") or {}
    if not isinstance(defaults, Mapping):
        raise PackageError(f"{path}: `defaults:` must be a mapping of settings")
    entries: list[ModelEntry] = []
    for name, values in document["models"].items():
        where = f"{path}: models.{name}"
        if not isinstance(values, Mapping) or not isinstance(values.get("path"), str):
            raise PackageError(f"{where} must be a mapping with a `path:` to the checkpoint folder")
        model_path = Path(values["path"]).expanduser()
        if not model_path.is_absolute():
            model_path = path.parent / model_path
        own = {key: value for key, value in values.items() if key != "path"}
        settings = Settings.from_mapping({**defaults, **own}, where)
        entries.append(ModelEntry(check_name(str(name)), model_path, settings))
    return _distinct(entries, str(path))


def _distinct(entries: list[ModelEntry], where: str) -> list[ModelEntry]:
    names = [entry.name for entry in entries]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise PackageError(f"{where}: model name(s) {repeated} given more than once")
    if not entries:
        raise PackageError(f"{where}: no model given")
    return entries


def _settings_from_args(args: argparse.Namespace) -> Settings:
    overrides = {
        key: getattr(args, key)
        for key in ("default_method", "max_length", "batch_size", "max_batch_delay", "device", "threshold", "workers")
        if getattr(args, key) is not None
    }
    if args.bf16:
        overrides["bf16"] = True
    settings = replace(Settings(), **overrides)
    settings.check("options")
    return settings


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit status (0 packaged, 2 refused, 1 archiver failure)."""
    parser = argparse.ArgumentParser(
        prog="python -m model_store.package",
        description="Validate a Hugging Face checkpoint folder and write its TorchServe archive folder OUT/NAME.",
    )
    parser.add_argument("path", nargs="?", type=str, help="the checkpoint folder (config.json, *.safetensors, ...)")
    parser.add_argument("--name", help="model name (the archive folder and the URL: /predictions/NAME)")
    parser.add_argument("--config", type=Path, help="a YAML file of several models (instead of PATH and --name)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="model store folder (default: %(default)s)")
    parser.add_argument("--default-method", help="method used when a request names none (default: relevance)")
    parser.add_argument("--max-length", type=int, help="tokens per text input, longer is truncated (default: 128)")
    parser.add_argument("--batch-size", type=int, help="TorchServe batchSize (default: 8)")
    parser.add_argument("--max-batch-delay", type=int, help="TorchServe maxBatchDelay in ms (default: 2)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), help="default: auto (CUDA when present)")
    parser.add_argument("--bf16", action="store_true", help="run the forward under bfloat16 autocast (GPU)")
    parser.add_argument("--threshold", type=float, help="multi-label heads: probability to predict a label (0.5)")
    parser.add_argument("--workers", type=int, help="TorchServe workers of the model (default: 1)")
    parser.add_argument("-q", "--quiet", action="store_true", help="log warnings only")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO, format="%(levelname)s %(message)s")
    try:
        if args.config is not None:
            if args.path or args.name:
                raise PackageError("give either PATH --name NAME or --config FILE, not both")
            entries = read_models_file(args.config)
        else:
            if not args.path or args.name is None:
                parser.error("PATH and --name are required (or --config FILE)")
            entries = [ModelEntry(check_name(args.name), args.path, _settings_from_args(args))]
        # validate all first: nothing is written if one is refused
        checked = [validate(entry.path, entry.name, entry.settings) for entry in entries]
        results = [
            package(entry.path, entry.name, args.out, entry.settings, checkpoint)
            for entry, checkpoint in zip(entries, checked, strict=True)
        ]
    except PackageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except RuntimeError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    for result in results:
        state = "reused" if result.reused else "packaged"
        print(f"{result.name}: {state} {result.archive}")
    store = args.out
    names = " ".join(f"{result.name}={result.name}" for result in results)
    print(f"serve with: torchserve --model-store {store} --models {names}  (or: make serve MODELS=...)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
