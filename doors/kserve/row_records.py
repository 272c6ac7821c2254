"""The records of one request's rows on the KServe and Ray doors: what the door decides before its rows are served
(the request id, each recorded row's index and input, the caller's ``traceparent``), and the one function that
commits them where the rows were served (the door's process, or the Ray Serve replica that served the batch).

A request's served rows and its recorded rows are usually the same, one record per row: a single-row request's record
is the request id, each row of a multi-row request ``<request id>-<index>`` (:func:`records.row_id`). The OpenAI API
serves identical greedy choices once, yet records every choice: a :class:`RecordedRow` names the served row
(``source``) that answers it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from records import row_id
from records.event import Input
from records.recorder import Recorder
from serving_core.errors import RowError
from serving_core.recording import TRACEPARENT_HEADER, AnsweredRow, header, record_batch, row_indexes


@dataclass(frozen=True)
class RecordedRow:
    """One record to write for a request.

    Attributes:
        source: The index of the served row whose answer it records (in the rows handed to the backend).
        index: Its index in the request (None for a request of one row): its record id is ``<request id>-<index>``.
        input: What the caller sent for it (a JSON document, bytes), None when there is nothing to keep.
    """

    source: int
    index: int | None
    input: Input = None


@dataclass(frozen=True)
class RequestRecords:
    """What the records of one request's rows need (picklable: it travels to a Ray Serve replica with the rows).

    Attributes:
        request_id: The request's id (the caller's ``X-Request-Id`` or OIP ``id``, else one the door made).
        rows: The records to write, in the request's order.
        traceparent: The caller's W3C ``traceparent``, if it sent one.
        parent: The record a re-explanation derives from, if it is one.
        refuse: Whether a failed store refuses the whole request (``records_unavailable``) rather than only its rows.
    """

    request_id: str
    rows: tuple[RecordedRow, ...]
    traceparent: str | None = None
    parent: str | None = None
    refuse: bool = True

    @classmethod
    def of(
        cls,
        request_id: str,
        inputs: Sequence[Input],
        headers: Mapping[str, Any] | None = None,
        parent: str | None = None,
        refuse: bool = True,
    ) -> RequestRecords:
        """One record per served row of a request whose rows are ``inputs`` (one each), indexed as
        :func:`serving_core.recording.row_indexes` says; ``headers`` give the ``traceparent``."""
        indexes = row_indexes(len(inputs))
        pairs = enumerate(zip(indexes, inputs, strict=True))
        rows = tuple(RecordedRow(source, index, value) for source, (index, value) in pairs)
        return cls(request_id, rows, header(headers, TRACEPARENT_HEADER), parent, refuse)

    @property
    def ids(self) -> list[str]:
        """The record ids, in the request's order."""
        return [row_id(self.request_id, row.index) for row in self.rows]


def commit(
    recorder: Recorder | None,
    request: RequestRecords,
    answers: Sequence[Mapping[str, Any]],
    *,
    task: str,
    door: str,
    version: str | None,
) -> list[RowError | None]:
    """Commit the records of one request (one transaction) before its answers leave (:func:`commit_batch` of one).

    Returns:
        One entry per served row: None, or the error to answer instead (``records_unavailable``).
    """
    return commit_batch(recorder, [(request, answers)], task=task, door=door, version=version)[0]


def commit_batch(
    recorder: Recorder | None,
    requests: Sequence[tuple[RequestRecords, Sequence[Mapping[str, Any]]]],
    *,
    task: str,
    door: str,
    version: str | None,
) -> list[list[RowError | None]]:
    """Commit the records of a batch's requests in one transaction before their answers leave.

    Args:
        recorder: The model's recorder; None when it keeps none (nothing is written).
        requests: Each request's records and the JSON answer document of each of its served rows (a failed row:
            ``{"error": {...}}``).
        task: The model's task.
        door: The door in the records (``kserve``, ``ray``).
        version: The model's version.

    Returns:
        Per request, one entry per served row: None, or the error to answer instead (``records_unavailable``).
    """
    served: list[list[RowError | None]] = [[None] * len(answers) for _, answers in requests]
    if recorder is None:
        return served
    rows = [
        AnsweredRow(
            request_id=request.request_id,
            index=row.index,
            answer=answers[row.source],
            input=row.input,
            traceparent=request.traceparent,
            parent=request.parent,
        )
        for request, answers in requests
        for row in request.rows
    ]
    refusals = iter(record_batch(recorder, task=task, door=door, version=version, rows=rows))
    for (request, _), refused in zip(requests, served, strict=True):
        for row in request.rows:
            refusal = next(refusals)
            refused[row.source] = refused[row.source] or refusal
    return served


__all__ = ["RecordedRow", "RequestRecords", "commit", "commit_batch"]
