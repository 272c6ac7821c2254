"""The records key: the token the ``/v1/records`` routes ask for, kept in ``key_file.json`` beside TorchServe's own
keys and in its shape (``{"records": {"key": "..."}}``; TorchServe writes ``inference``, ``management``, ``API``).

The launcher makes it when records are on (:func:`ensure_records_key`); the doors read it (:func:`records_key`) and
the inference key (:func:`inference_key`), which the records routes answer 403 rather than 401.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

#: The entry of ``key_file.json`` that holds the records key.
ENTRY = "records"


def _read(key_file: Path) -> dict[str, object]:
    try:
        document = json.loads(key_file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    return document if isinstance(document, dict) else {}


def _key(document: dict[str, object], entry: str) -> str | None:
    value = document.get(entry)
    key = value.get("key") if isinstance(value, dict) else None
    return key if isinstance(key, str) and key else None


def records_key(key_file: Path) -> str | None:
    """The records key in ``key_file`` (None when it has none, or the file is missing)."""
    return _key(_read(key_file), ENTRY)


def inference_key(key_file: Path) -> str | None:
    """TorchServe's inference key in ``key_file`` (None when it has none)."""
    return _key(_read(key_file), "inference")


def ensure_records_key(key_file: Path) -> str:
    """The records key of ``key_file``, made (a random 32-byte token) and added to the file when it has none.

    The file keeps its other entries and is written whole (a temporary file renamed over it), mode 0600.

    Returns:
        The records key.
    """
    document = _read(key_file)
    existing = _key(document, ENTRY)
    if existing is not None:
        return existing
    key = secrets.token_urlsafe(32)
    document[ENTRY] = {"key": key}
    key_file.parent.mkdir(parents=True, exist_ok=True)
    temporary = key_file.with_name(key_file.name + ".tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        json.dump(document, handle, indent=2)
    temporary.replace(key_file)
    return key


__all__ = ["ENTRY", "ensure_records_key", "inference_key", "records_key"]
