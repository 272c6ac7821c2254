"""The request ids and records of a TorchServe batch: what the handler (:mod:`doors.torchserve.handler`) calls, per
batch, to give every row its id and record it before the batch's answers leave.

TorchServe batches separate requests: each row is a request of its own (its headers read with
``context.get_all_request_header(index)``), so a row's record id is its request id (index None), and the id its
answer carries (JSON ``id``, protobuf ``request_id``: :func:`serving_core.wire.with_id`). TorchServe hands a gRPC
row's input map over as the row and drops the call's metadata, so a gRPC row's ``x-request-id`` and ``traceparent``
are entries of its input map (the router in front of TorchServe copies the caller's metadata there:
:func:`forwarding.metadata.carry_metadata`); a header wins over an entry (:func:`row_headers`). The handler:

1. before decoding, :func:`request_ids` (the caller's ``X-Request-Id`` per row, else TorchServe's own id of the row,
   else one made; an id that is not valid, path-like or too long, is the row's ``invalid_request`` error), then
   :func:`answer_ids` (a refused row answered under TorchServe's own id of the row);
2. after encoding, :func:`record_rows` with each row's JSON answer document: one record per row committed in one
   transaction through the model's recorder (:func:`serving_core.recording.record_batch`), the ``parent`` of a
   re-explanation read from ``X-Explain-Parent`` (:mod:`doors.torchserve.records_door`), the ``traceparent`` kept
   (only a well-formed one: :func:`serving_core.tracing.valid_traceparent`), ``X-Request-Id`` set on each row's
   response (``context.set_response_header``); its result names the rows to answer with ``records_unavailable``
   instead.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from records import InvalidRecordIdError, check_record_id
from records.event import Input
from records.ids import check_request_id
from records.recorder import Recorder
from serving_core.errors import RowError
from serving_core.headers import DEADLINE_HEADER
from serving_core.recording import (
    REQUEST_ID_HEADER,
    TRACEPARENT_HEADER,
    AnsweredRow,
    door_request_id,
    header,
    new_request_id,
    record_batch,
)
from serving_core.tracing import TRACEPARENT, TRACESTATE, valid_traceparent

from .records_door import PARENT_HEADER

#: The longest input map entry read as a header (an id or a trace context is far shorter; anything longer is ignored).
_LONGEST_ENTRY = 1024
#: The headers a gRPC row carries as entries of its input map (TorchServe drops the call's metadata).
ROW_HEADERS = (REQUEST_ID_HEADER, TRACEPARENT, TRACESTATE, DEADLINE_HEADER)


def _text(value: Any) -> str | None:
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    return value if isinstance(value, str) else None


def row_headers(context: Any, index: int, row: Mapping[str, Any]) -> dict[str, str]:
    """Row ``index``'s headers as text: its request headers (TorchServe lists each input's content type among them,
    as a mapping: skipped), then, for a gRPC row, the entries of its input map named in :data:`ROW_HEADERS` (str or
    bytes, at most 1 KiB) that no header names, whatever their case."""
    found: dict[str, str] = {}
    for key, value in (context.get_all_request_header(index) or {}).items():
        text = _text(value)
        if text is not None:
            found[str(key)] = text
    present = {key.lower() for key in found}
    wanted = {name.lower() for name in ROW_HEADERS}
    for key, value in row.items():
        text = _text(value)
        if key.lower() in wanted and key.lower() not in present and text is not None and len(text) <= _LONGEST_ENTRY:
            found[key] = text
    return found


def row_value(context: Any, index: int, row: Mapping[str, Any], name: str) -> str | None:
    """Row ``index``'s header ``name`` (:func:`row_headers`, any case); None when it has none."""
    return header(row_headers(context, index, row), name)


def request_ids(context: Any, data: Sequence[Mapping[str, Any]]) -> list[str | RowError]:
    """Each row's request id: the caller's ``X-Request-Id`` (a header; a gRPC row: its input map's ``x-request-id``,
    :func:`row_value`) when valid, else TorchServe's own id of the row (the one its answer's ``x-request-id``
    carries), else a new one; a row whose id is not valid gets its ``invalid_request`` error (the handler answers it
    as the row's error, under TorchServe's own id of the row: :func:`answer_ids`).

    Args:
        context: TorchServe's context of the batch.
        data: The batch's rows as TorchServe gave them.
    """
    own = getattr(context, "request_ids", None) or {}  # TorchServe's id of each row, which it echoes
    ids: list[str | RowError] = []
    for index, row in enumerate(data):
        given = row_value(context, index, row, REQUEST_ID_HEADER) or own.get(index)
        try:
            ids.append(door_request_id({REQUEST_ID_HEADER: given} if given else None))
        except RowError as error:
            ids.append(error)
    return ids


def answer_ids(context: Any, ids: Sequence[str | RowError]) -> list[str]:
    """The id each row's answer and record carry: its :func:`request_ids` id; for a row whose id was refused,
    TorchServe's own id of the row (the ``x-request-id`` TorchServe answers it with), else a new one, so that its
    error answer has an id too."""
    own = getattr(context, "request_ids", None) or {}
    return [given if isinstance(given, str) else _own_id(own.get(index)) for index, given in enumerate(ids)]


def _own_id(value: Any) -> str:
    """TorchServe's id of a row when it is a valid id, else a new one."""
    try:
        return check_request_id(value)
    except InvalidRecordIdError:
        return new_request_id()


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
        ids: :func:`answer_ids` of the batch (a row given as its refused :func:`request_ids` entry: recorded under a
            new id).
        timings: Seconds the handler measured per row.

    Returns:
        Per row, None when its answer may leave, else the error to answer instead (``records_unavailable``).
    """
    rows: list[AnsweredRow] = []
    for index, (row, answer, given) in enumerate(zip(data, answers, ids, strict=True)):
        headers = row_headers(context, index, row)
        request = given if isinstance(given, str) else new_request_id()
        context.set_response_header(index, REQUEST_ID_HEADER, request)
        traceparent = valid_traceparent(header(headers, TRACEPARENT_HEADER))
        rows.append(
            AnsweredRow(
                request_id=request,
                index=None,
                answer=answer,
                input=row_input(row),
                traceparent=traceparent,
                parent=_parent(headers),
                timings=dict(timings[index]) if timings is not None else {},
            )
        )
    return record_batch(recorder, task=task, door="torchserve", version=version, rows=rows)


__all__ = ["ROW_HEADERS", "answer_ids", "record_rows", "request_ids", "row_headers", "row_input", "row_value"]
