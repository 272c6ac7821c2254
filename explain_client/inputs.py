"""Inputs given as lines (the ``explain`` command's ``--input`` file or stdin): plain text or JSON lines (a text, a
sentence pair, or an image as a file path or base64) read into the plain inputs of
:meth:`~explain_client.client.ExplainClient.explain_many`.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from pathlib import Path

from .wire import PlainInput


def load_requests(lines: Sequence[str], *, image_base: Path | None = None) -> list[PlainInput]:
    """Turn input lines into plain inputs for :meth:`~explain_client.client.ExplainClient.explain_many`.

    A line is either plain text, or a JSON object (JSON lines) with ``"text"`` (and optionally ``"text_pair"``, the
    second text of a sentence pair) or ``"image"`` (a file path, relative to ``image_base``, or base64 PNG/JPEG
    bytes). Blank lines are skipped.

    Raises:
        ValueError: for a JSON line without ``text``/``image`` or with a ``text_pair`` that is not a string, naming
            the line number.
    """
    inputs: list[PlainInput] = []
    for number, raw in enumerate(lines, start=1):
        line = raw.rstrip("\n")
        if not line.strip():
            continue
        if line.lstrip().startswith("{"):
            try:
                document = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"line {number}: invalid JSON ({error.msg})") from None
            pair = document.get("text_pair")
            if pair is not None and not (isinstance(pair, str) and isinstance(document.get("text"), str)):
                raise ValueError(f"line {number}: 'text_pair' must be a string, next to a 'text' string")
            if isinstance(document.get("text"), str):
                inputs.append(document["text"] if pair is None else (document["text"], pair))
            elif isinstance(document.get("image"), str):
                inputs.append(_image_bytes(document["image"], image_base))
            else:
                raise ValueError(f"line {number}: a JSON line needs a 'text' or 'image' string")
        else:
            inputs.append(line)
    return inputs


def _image_bytes(value: str, base: Path | None) -> bytes:
    """An image line's bytes: the file ``value`` (relative to ``base``) if there is one, else ``value`` as base64."""
    path = Path(value)
    if base is not None and not path.is_absolute():
        path = base / path
    if path.is_file():
        return path.read_bytes()
    try:
        return base64.b64decode(value, validate=True)
    except ValueError:
        raise ValueError(f"image {value!r} is neither a file nor base64") from None
