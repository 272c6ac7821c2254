"""Small file helpers with no heavy imports (the reuse path of the build must not import torch)."""

from __future__ import annotations

import hashlib
from pathlib import Path


def file_sha256(path: Path, chunk_size: int = 1 << 20) -> str:
    """Return the hex SHA-256 of a file's bytes, read in chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(chunk_size):
            digest.update(chunk)
    return digest.hexdigest()


def make_readable(folder: Path) -> None:
    """Give every file under ``folder`` mode 0644 and every folder 0755.

    safetensors writes weights with mode 0600; a TorchServe worker running as another user (as in the official
    image) could then not read the archive.
    """
    for path in [folder, *folder.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
