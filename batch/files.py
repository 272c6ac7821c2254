"""A job's output and error files: appended per batch, read back on a rerun.

Each batch's lines are written with one ``write`` and flushed before the next batch is served, so a job killed at any
moment has lost nothing it wrote and a rerun repeats nothing: a rerun first cuts a torn last line (a kill during the
write) off the output file, then skips every ``custom_id`` the output file holds. The error file holds the failures of
the latest run only (a rerun retries them all: it is read, then started again). Both are ``fsync``'d when the job
ends.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from .lines import dump


def default_errors_path(output: Path) -> Path:
    """``OUTPUT.errors.jsonl`` beside ``OUTPUT``."""
    return output.with_name(output.name + ".errors.jsonl")


def repair(path: Path) -> None:
    """Cut a torn last line (no newline, or not JSON) off a JSONL file written by a killed job."""
    if not path.is_file():
        return
    with path.open("rb+") as file:
        data = file.read()
        keep = len(data)
        if data and not data.endswith(b"\n"):
            keep = data.rfind(b"\n") + 1
        file.truncate(keep)


def written_ids(path: Path) -> set[str]:
    """The ``custom_id`` of every line of a job's file (none if it does not exist).

    Raises:
        ValueError: if a line is not a JSON object with a ``custom_id`` (the file is not a job's output).
    """
    ids: set[str] = set()
    if not path.is_file():
        return ids
    with path.open("rb") as file:
        for number, raw in enumerate(file, start=1):
            if not raw.strip():
                continue
            try:
                line = json.loads(raw)
            except json.JSONDecodeError:
                raise ValueError(f"{path}: line {number} is not JSON: it is not a batch job's output") from None
            if not isinstance(line, dict) or "custom_id" not in line:
                raise ValueError(f"{path}: line {number} has no custom_id: it is not a batch job's output")
            if line["custom_id"] is not None:
                ids.add(str(line["custom_id"]))
    return ids


class JobFiles:
    """The output file (appended) and the error file (started again) of one run."""

    def __init__(self, output: Path, errors: Path) -> None:
        """Open both files (creating their folder); :meth:`close` (or ``with``) syncs and closes them."""
        output.parent.mkdir(parents=True, exist_ok=True)
        errors.parent.mkdir(parents=True, exist_ok=True)
        self.output_path = output
        self.errors_path = errors
        self._output: IO[str] = output.open("a", encoding="utf-8")
        self._errors: IO[str] = errors.open("w", encoding="utf-8")

    def write(self, outputs: Iterable[dict[str, Any]], errors: Iterable[dict[str, Any]]) -> None:
        """Append one batch's lines to each file and flush them."""
        for file, lines in ((self._output, outputs), (self._errors, errors)):
            text = "".join(dump(line) for line in lines)
            if text:
                file.write(text)
                file.flush()

    def close(self) -> None:
        """Sync both files to disk and close them."""
        for file in (self._output, self._errors):
            if not file.closed:
                file.flush()
                os.fsync(file.fileno())
                file.close()

    def __enter__(self) -> JobFiles:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()
