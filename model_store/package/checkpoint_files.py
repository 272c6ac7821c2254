"""Reading a checkpoint folder without running anything from it: which top-level files are copied (formats that
carry no code), ``config.json``, and the safetensors headers (tensor names and shapes, no tensor data).

Pickle weights (``*.bin``, ``*.pt``...) are never loaded: loading pickle runs code. They are named in the refusal,
with the command that converts them (:func:`conversion_command`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from model_store.package.settings import PackageError, Task
from serving_core.registry import TASKS

#: Suffixes of the checkpoint files copied into an archive: formats that carry no code.
SAFE_SUFFIXES = frozenset({".json", ".safetensors", ".txt", ".model", ".jinja", ".tiktoken", ".md"})
#: Suffixes of pickle-based weight files (``torch.load`` of these runs code embedded in them).
PICKLE_SUFFIXES = frozenset({".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt"})


def select_files(path: Path) -> tuple[dict[str, Path], list[str], list[str]]:
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


def read_config(path: Path) -> dict[str, Any]:
    """The folder's ``config.json`` as a dict.

    Raises:
        PackageError: if it is not readable JSON or not an object.
    """
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


def is_vocabulary(file_name: str) -> bool:
    """Whether a file holds a tokenizer's vocabulary (tokenizers JSON, WordPiece/BPE vocabulary, sentencepiece)."""
    return (
        file_name in ("tokenizer.json", "merges.txt")
        or file_name.startswith("vocab")
        or file_name.endswith((".model", ".tiktoken"))
    )


def conversion_command(path: Path, task: Task | None) -> str:
    """The command that re-saves a pickle checkpoint at ``path`` as safetensors (to run in a trusted environment)."""
    auto = TASKS[task].model_class if task in TASKS else "AutoModelForSequenceClassification"
    return f"python -c \"from transformers import {auto} as M; M.from_pretrained('{path}').save_pretrained('{path}')\""


def safetensors_shapes(files: Mapping[str, Path]) -> dict[str, list[int]]:
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
