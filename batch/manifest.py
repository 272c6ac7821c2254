"""A job's manifest, beside its output (``OUTPUT.manifest.json``): what the lines already written were answered with.

The manifest holds the job's description (each model's name and version, :attr:`batch.models.BatchModel.version`; the
explanation asked of every row and the input's columns, for a table; the code version,
:data:`explainers._version.__version__`) and its fingerprint (the SHA-256 of that description). A rerun whose
description has the same fingerprint resumes the output; another one is refused (:class:`ForeignOutputError`), naming
what differs, so that one file never mixes answers of two models, methods or code versions.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from explainers._version import __version__

from .models import BatchModel

#: The manifest's format version.
FORMAT = 1


class ForeignOutputError(Exception):
    """The output belongs to another job (another fingerprint), or to no job (no manifest)."""


@dataclass(frozen=True)
class Manifest:
    """A job's description and fingerprint.

    Attributes:
        description: models (name → version), the explanation and columns of a table's rows, the code version.
        fingerprint: the SHA-256 of the description as canonical JSON.
    """

    description: Mapping[str, Any]
    fingerprint: str

    @classmethod
    def of(cls, models: Sequence[BatchModel], options: Mapping[str, Any]) -> Manifest:
        """The manifest of a job over ``models`` with the answer-changing ``options`` (a table's explanation and
        columns; empty for JSONL, whose lines carry their own)."""
        description = {
            "format": FORMAT,
            "models": {model.name: {"version": model.version, "task": model.config.task} for model in models},
            "options": dict(options),
            "code_version": __version__,
        }
        canonical = json.dumps(description, sort_keys=True, separators=(",", ":"), default=str)
        return cls(description, hashlib.sha256(canonical.encode("utf-8")).hexdigest())

    def to_dict(self) -> dict[str, Any]:
        """The manifest file's document."""
        return {"fingerprint": self.fingerprint, **self.description}


def manifest_path(output: Path) -> Path:
    """``OUTPUT.manifest.json`` beside ``OUTPUT``."""
    return output.with_name(output.name + ".manifest.json")


def claim(output: Path, manifest: Manifest) -> bool:
    """Make ``output`` this job's: write the manifest for a new output, check it for an existing one.

    Returns:
        Whether the output is resumed (it has this job's manifest already).

    Raises:
        ForeignOutputError: if the output exists with another job's manifest, or with none.
    """
    path = manifest_path(output)
    if path.is_file():
        try:
            stored = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise ForeignOutputError(f"{path} is not a batch job's manifest ({error}): use another -o") from None
        if not isinstance(stored, dict) or stored.get("fingerprint") != manifest.fingerprint:
            raise ForeignOutputError(
                f"{output} is the output of another job ({_differences(stored, manifest)}); it is not resumed: "
                "write to another -o, or delete it and its manifest to start again"
            )
        return True
    if output.exists() and output.stat().st_size > 0:
        raise ForeignOutputError(
            f"{output} exists and has no manifest ({path.name}): it is not this job's output; write to another -o"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(manifest.to_dict(), indent=2, sort_keys=True) + "\n", encoding="utf-8")
    temporary.replace(path)
    return False


def _differences(stored: Any, manifest: Manifest) -> str:
    """What differs between a stored manifest and this job's, in words."""
    if not isinstance(stored, dict):
        return "its manifest is not an object"
    differences = []
    for key, value in manifest.description.items():
        if stored.get(key) != value:
            differences.append(
                f"{key}: {json.dumps(stored.get(key), sort_keys=True)} there, {json.dumps(value, sort_keys=True)} here"
            )
    return "; ".join(differences) or f"fingerprint {stored.get('fingerprint')} there, {manifest.fingerprint} here"
