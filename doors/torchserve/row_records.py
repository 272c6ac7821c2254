"""The request ids and records of a TorchServe batch: what the handler (:mod:`doors.torchserve.handler`) calls, per
batch, to give every row its id and record it before the batch's answers leave.

TorchServe batches separate requests: each row is a request of its own (its headers read with
``context.get_all_request_header(index)``), so a row's record id is its request id (index None). The handler:

1. before decoding, :func:`request_ids` (the caller's ``X-Request-Id`` per row, else one made; a path-like id is the
   row's ``invalid_request`` error);
2. after encoding, :func:`record_rows` with each row's JSON answer document: one record per row committed in one
   transaction through the model's recorder (:func:`serving_core.recording.record_batch`), the ``parent`` of a
   re-explanation read from ``X-Explain-Parent`` (:mod:`doors.torchserve.records_door`), the ``traceparent`` kept,
   ``X-Request-Id`` set on each row's response (``context.set_response_header``); its result names the rows to
   answer with ``records_unavailable`` instead.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from records import InvalidRecordIdError, check_record_id
from records.event import Input
from records.recorder import Recorder
from serving_core.errors import RowError
from serving_core.recording import (
    REQUEST_ID_HEADER,
    TRACEPARENT_HEADER,
    AnsweredRow,
    door_request_id,
    header,
    new_request_id,
    record_batch,
)

from .records_door import PARENT_HEADER


def request_ids(context: Any, count: int) -> list[str | RowError]:
    """Each row's request id: the caller's ``X-Request-Id`` when valid, else TorchServe's own id of the row (the one
    its answer's ``x-request-id`` carries), else a new one; a row whose header is not a valid id gets its
    ``invalid_request`` error (the handler answers it as the row's error).

    Args:
        context: TorchServe's context of the batch.
        count: The number of rows.
    """
    own = getattr(context, "request_ids", None) or {}  # TorchServe's id of each row, which it echoes
    ids: list[str | RowError] = []
    for index in range(count):
        headers = context.get_all_request_header(index)
        if header(headers, REQUEST_ID_HEADER) is None and own.get(index):
            headers = {REQUEST_ID_HEADER: own[index]}
        try:
            ids.append(door_request_id(headers))
        except RowError as error:
            ids.append(error)
    return ids


def row_input(row: Mapping[str, Any]) -> Input:
    """A TorchServe row's input as a record keeps it: its JSON document, else its bytes (a gRPC row's serialized
    ``ExplainRequest`` as it came); None when it has none."""
    request = row.get("request")
    if isinstance(request, bytes | bytearray):
        return bytes(request)
    body = row.get("body", row.get("data"))
    if isinstance(body, Mapping):
        return dict(body)
    if isinstance(body, bytes | bytearray):
        try:
            document = json.loads(body)
        except (UnicodeDecodeError, ValueError):
            return bytes(body)
        return dict(document) if isinstance(document, Mapping) else bytes(body)
    if isinstance(body, str):
        return row_input({"body": body.encode("utf-8")})
    return None


def _parent(headers: Mapping[str, Any]) -> str | None:
    value = header(headers, PARENT_HEADER)
    if value is None:
        return None
    try:
        return check_record_id(value)
    except InvalidRecordIdError:
        return None  # not a record id: the row is recorded without a parent


def record_rows(
    recorder: Recorder | None,
    *,
    task: str,
    version: str | None,
    context: Any,
    data: Sequence[Mapping[str, Any]],
    answers: Sequence[Mapping[str, Any]],
    ids: Sequence[str | RowError],
    timings: Sequence[Mapping[str, float]] | None = None,
) -> list[RowError | None]:
    """Record a TorchServe batch's rows and set each row's ``X-Request-Id`` response header.

    Args:
        recorder: The model's recorder (None: no records; the ids are still set).
        task: The model's task name.
        version: The model's version (its archive's fingerprint).
        context: TorchServe's context of the batch.
        data: The batch's rows as TorchServe gave them.
        answers: Each row's JSON answer document (a failed row: ``{"error": {...}}``).
        ids: :func:`request_ids` of the batch (a row whose id was refused is recorded under a new id).
        timings: Seconds the handler measured per row.

    Returns:
        Per row, None when its answer may leave, else the error to answer instead (``records_unavailable``).
    """
    rows: list[AnsweredRow] = []
    for index, (row, answer, given) in enumerate(zip(data, answers, ids, strict=True)):
        headers = context.get_all_request_header(index) or {}
        request = given if isinstance(given, str) else new_request_id()
        context.set_response_header(index, REQUEST_ID_HEADER, request)
        rows.append(
            AnsweredRow(
                request_id=request,
                index=None,
                answer=answer,
                input=row_input(row),
                traceparent=header(headers, TRACEPARENT_HEADER),
                parent=_parent(headers),
                timings=dict(timings[index]) if timings is not None else {},
            )
        )
    return record_batch(recorder, task=task, door="torchserve", version=version, rows=rows)


__all__ = ["record_rows", "request_ids", "row_input"]
