"""Fingerprints that decide whether a built model or archive can be reused.

A fingerprint is the SHA-256 of a canonical JSON document listing everything a result depends on: the recipe's
hyper-parameters, the hashes of the recipe's source files, the hashes of the input data files, and the versions of
the libraries that compute it. The document itself is stored next to the result (``fingerprint.json``) so that a
rebuild can say *what* changed.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from model_store import PACKAGE_DIR
from model_store.files import file_sha256

FINGERPRINT_FILE = "fingerprint.json"


def digest(document: Mapping[str, Any]) -> str:
    """Return the SHA-256 of ``document`` serialised as canonical JSON (sorted keys, no whitespace)."""
    canonical = json.dumps(document, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def source_hashes(module_files: Iterable[str]) -> dict[str, str]:
    """Hash recipe source files of this package, given by file name relative to ``model_store/``."""
    return {name: file_sha256(PACKAGE_DIR / name) for name in sorted(module_files)}


def input_hashes(files: Mapping[str, Path]) -> dict[str, str]:
    """Hash input data files, keyed by a stable name (not the path, which differs between machines)."""
    return {name: file_sha256(path) for name, path in sorted(files.items())}


def package_versions(packages: Iterable[str]) -> dict[str, str]:
    """Return the installed version of each package (``"absent"`` where it is not installed)."""
    versions: dict[str, str] = {}
    for package in sorted(packages):
        try:
            versions[package] = version(package)
        except PackageNotFoundError:
            versions[package] = "absent"
    return versions


def read_fingerprints(build_dir: Path) -> dict[str, Any]:
    """Read ``fingerprint.json`` of a model's build folder; an empty dict if it is missing or unreadable."""
    path = build_dir / FINGERPRINT_FILE
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def write_fingerprints(build_dir: Path, fingerprints: Mapping[str, Any]) -> None:
    """Write ``fingerprint.json`` atomically (write to a temporary file, then rename)."""
    path = build_dir / FINGERPRINT_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(fingerprints, indent=2, sort_keys=True, default=str) + "\n", encoding="utf-8")
    tmp.replace(path)
