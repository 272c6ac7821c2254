"""The records of a served batch, for every door: one function a door calls after encoding a batch and before it
returns the answers (:func:`record_batch`), and the request ids the answers carry (:func:`door_request_id`).

A door has, per answered row, the request id (the caller's ``X-Request-Id`` when valid, else one made:
:func:`records.request_id`), the row's index in a multi-row request (None for a single-row request), the answer
document (an error is ``{"error": {...}}``), the input as received (a JSON document or bytes), and the caller's
``traceparent``. :func:`record_batch` builds one record per row (:func:`records.build_record`) and commits them in
one transaction through the model's :class:`~records.recorder.Recorder`; its result says, per row, whether the answer
may leave (None) or must be replaced by the error it gives (``records_unavailable`` when the store failed and
``on_store_error`` is ``refuse``: :func:`refused_answers` does the replacing for JSON answers)::

    refusals = record_batch(recorder, task=config.task, door="torchserve", version=version, rows=rows)
    answers = refused_answers(answers, refusals)
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from records import InvalidRecordIdError, Record, build_record, new_request_id, request_id
from records.event import Input
from records.recorder import Recorder
from serving_core.errors import RowError
from serving_core.wire import error_document

#: The folder beside the archives that holds their fingerprints (``model_store.package.FINGERPRINTS_DIR``).
FINGERPRINTS_DIR = ".fingerprints"
#: The header a caller names its request with, and the one every REST answer echoes.
REQUEST_ID_HEADER = "X-Request-Id"
#: The W3C trace context header a record keeps when the caller sent it.
TRACEPARENT_HEADER = "traceparent"


@dataclass(frozen=True)
class AnsweredRow:
    """One answered row, as a door has it when the batch is encoded.

    Attributes:
        request_id: The request's id (:func:`door_request_id`).
        index: The row's index in a multi-row request (from 0), None for a single-row request.
        answer: The row's JSON answer document (a failed row: ``{"error": {...}}``).
        input: The row's input: its JSON document or the bytes received; None when there is none.
        traceparent: The caller's ``traceparent``, if it sent one.
        parent: The record id this row re-explains, if it does.
        timings: Seconds the door measured for the row (``{"model": 0.02}``).
    """

    request_id: str
    index: int | None
    answer: Mapping[str, Any]
    input: Input = None
    traceparent: str | None = None
    parent: str | None = None
    timings: Mapping[str, float] = field(default_factory=dict)


def door_request_id(headers: Mapping[str, Any] | None) -> str:
    """The id of a request: the caller's ``X-Request-Id`` (any case) when it sent one, else a new one.

    Args:
        headers: The request's headers (or gRPC metadata), any case; None when there are none.

    Returns:
        The request id.

    Raises:
        RowError: ``invalid_request`` when the caller's id is not a valid id (path-like, too long, empty).
    """
    given = header(headers, REQUEST_ID_HEADER)
    try:
        return request_id(given)
    except InvalidRecordIdError as error:
        raise RowError("invalid_request", f"{REQUEST_ID_HEADER}: {error}") from None


def header(headers: Mapping[str, Any] | None, name: str) -> str | None:
    """The value of header ``name`` in ``headers``, matched in any case (bytes decoded as UTF-8); None when absent."""
    if not headers:
        return None
    wanted = name.lower()
    for key, value in headers.items():
        if str(key).lower() == wanted and value is not None:
            text = value.decode("utf-8", "replace") if isinstance(value, bytes | bytearray) else str(value)
            return text.strip() or None
    return None


def archive_version(archive: Path) -> str | None:
    """A model's version: its archive's fingerprint (``.fingerprints/<archive name>.json`` beside the archive, as
    :func:`model_store.package.package` writes it); None when the archive has none (a folder packaged elsewhere).

    Args:
        archive: The archive folder.
    """
    stamp = archive.parent / FINGERPRINTS_DIR / f"{archive.name}.json"
    try:
        document = json.loads(stamp.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    value = document.get("fingerprint") if isinstance(document, dict) else None
    return str(value) if value else None


def served_version(archive: Path) -> str | None:
    """The version a served archive's records name: ``handler.model_version`` of its ``model-config.yaml`` (what
    :func:`model_store.package.package` writes, and what the TorchServe handler reads), else
    :func:`archive_version`; None when it has neither.

    Args:
        archive: The archive folder.
    """
    import yaml

    try:
        document = yaml.safe_load((archive / "model-config.yaml").read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        document = None
    handler = document.get("handler") if isinstance(document, dict) else None
    value = handler.get("model_version") if isinstance(handler, dict) else None
    return str(value) if value else archive_version(archive)


def row_indexes(count: int) -> list[int | None]:
    """The row indexes of a request of ``count`` rows: ``[None]`` for one row, else ``0 .. count - 1``."""
    return [None] if count == 1 else list(range(count))


def record_batch(
    recorder: Recorder | None,
    *,
    task: str,
    door: str,
    version: str | None,
    rows: Sequence[AnsweredRow],
) -> list[RowError | None]:
    """Commit one record per answered row of a batch (one transaction) before the answers leave.

    Args:
        recorder: The model's recorder (:meth:`records.recorder.Recorder.open`); None when it keeps no records.
        task: The model's task name.
        door: The door answering (``torchserve``, ``kserve``, ``ray``, ``openai``).
        version: The model's version (its archive's fingerprint), None when the door does not know it.
        rows: The batch's answered rows, errors included.

    Returns:
        One entry per row: None when its answer may leave as it is, else the error to answer instead (every row of
        the batch gets ``records_unavailable`` when the store failed and ``on_store_error`` is ``refuse``).
    """
    if recorder is None or not rows:
        return [None] * len(rows)
    records: list[Record] = [
        build_record(
            model=recorder.model,
            version=version,
            task=task,
            door=door,
            request_id=row.request_id,
            index=row.index,
            answer=row.answer,
            input=row.input,
            timings=row.timings,
            traceparent=row.traceparent,
            parent=row.parent,
        )
        for row in rows
    ]
    try:
        recorder.record(records)
    except RowError as error:
        return [error] * len(rows)
    return [None] * len(rows)


def refused_answers(
    answers: Sequence[Mapping[str, Any]], refusals: Sequence[RowError | None]
) -> list[Mapping[str, Any]]:
    """The answers with each refused row's answer replaced by its error document (:func:`record_batch`'s result)."""
    return [
        answer if refusal is None else error_document(refusal)
        for answer, refusal in zip(answers, refusals, strict=True)
    ]


__all__ = [
    "REQUEST_ID_HEADER",
    "TRACEPARENT_HEADER",
    "AnsweredRow",
    "archive_version",
    "door_request_id",
    "header",
    "new_request_id",
    "record_batch",
    "refused_answers",
    "row_indexes",
    "served_version",
]
