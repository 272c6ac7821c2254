"""Re-explaining stored predictions: what a records store gives a batch job (``explain-batch --from-records``).

A store of answered rows (issue 36's records, :mod:`records`) hands the job a :class:`RecordsReader`: the stored
inputs of one model between two times, in the store's order (:class:`StoreRecords` reads a SQL store: SQLite or
PostgreSQL). :class:`RecordsQuery` makes them a job's input (``JobSpec(records=...)``): each stored input becomes a
request to the route it was answered on, its ``custom_id`` and ``parent`` the record's id, its ``explain`` replaced by
the job's, so that a job re-explains yesterday's predictions by another method. A record that cannot be re-explained
goes to the error file: one whose input was not kept whole (``payload_not_kept``: a store of payload ``hash`` or
``none``, an erased record), one whose input is no request of its task (``unreadable_input``: the input is read as
``POST /v1/records/{id}/explain`` reads it, :func:`serving_core.stored_input.task_document` — raw image or text
bodies and protobuf rows become the task's JSON document; an OIP row, which only the KServe door's codec reads, is
explained again there), or that another version of the model answered
(``version_changed``: the job would explain another model than the one that predicted; the versions compared are
the ones the records name, :attr:`batch.models.BatchModel.served_version`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from records import RecordStore, StoredRecord, WriteOnlyStoreError, open_store, parse_store_url, recorded_input
from records.api import UnreadableInputError
from records.store import MAX_LIMIT
from serving_core.stored_input import task_document

from .inputs import OPENAI_ROUTES, LineError, Request, RouteError, parse_route, unique
from .models import BatchModel


@dataclass(frozen=True)
class StoredInput:
    """One stored input.

    Attributes:
        record_id: the record's id.
        model: the model that answered it.
        model_version: that model's version when it answered, as the record names it (``None``: the door did not
            know it).
        url: the route it was answered on (``/predictions/<model>``, ``/v1/chat/completions``, ...).
        body: the request body as the route took it (``None``: the store did not keep it whole).
        kept: what the store kept of the input: ``full``, or why ``body`` is ``None`` (``hash``, ``none``,
            ``erased``, ``unreadable``: kept, but no request of its task).
        problem: why a kept input is ``unreadable``.
    """

    record_id: str
    model: str
    model_version: str | None
    url: str
    body: Any
    kept: str = "full"
    problem: str | None = None


class RecordsReader(Protocol):
    """What a records store implements for batch jobs.

    Attributes:
        location: the store, for messages and the job's manifest (a URL without its password).
    """

    location: str

    def count(self, model: str, since: datetime | None, until: datetime | None) -> int:
        """How many records of ``model`` were written from ``since`` (inclusive) to ``until`` (exclusive)."""
        ...

    def inputs(self, model: str, since: datetime | None, until: datetime | None) -> Iterator[StoredInput]:
        """The stored inputs of those records, oldest first."""
        ...


def stored_input(record: StoredRecord) -> StoredInput:
    """A stored record's input (:func:`records.recorded_input`), as a request to ``/predictions/<model>``: the task's
    JSON document (:func:`serving_core.stored_input.task_document`: a REST document as it is, raw bytes and protobuf
    rows converted; the OpenAI routes' choices are recorded as their generation documents)."""
    data = record.event.get("data") or {}
    model = data.get("model") or {}
    name = str(model.get("name") or record.model)
    version = None if model.get("version") is None else str(model["version"])
    url = f"/predictions/{name}"
    if record.erased:
        return StoredInput(record.id, name, version, url, None, "erased")
    document = recorded_input(record.event)
    if document is None:
        kept = str((data.get("input") or {}).get("payload") or "none")
        return StoredInput(record.id, name, version, url, None, kept)
    try:
        body = task_document(document, str(data.get("task") or ""))
    except UnreadableInputError as error:
        return StoredInput(record.id, name, version, url, None, "unreadable", str(error))
    return StoredInput(record.id, name, version, url, body, "full")


class StoreRecords:
    """A records store (:class:`records.RecordStore`: SQLite, PostgreSQL) read as a :class:`RecordsReader`, a page of
    :data:`records.store.MAX_LIMIT` records at a time."""

    def __init__(self, store: RecordStore) -> None:
        """Read ``store`` (closed by :meth:`close`)."""
        self.store = store
        self.location = store.location

    @classmethod
    def open(cls, url: str) -> StoreRecords:
        """The store at ``url`` (:func:`records.open_store`; a missing SQLite file is an error, never made).

        Raises:
            records.StoreUrlError: the URL names no store.
            records.WriteOnlyStoreError: the URL is the HTTP sink's (it keeps nothing to read back).
            records.StoreUnavailableError: the store cannot be opened.
        """
        if parse_store_url(url).kind == "http":
            raise WriteOnlyStoreError(
                f"records store {url}: the HTTP sink delivers records and keeps none to read back; give the SQL store "
                "(sqlite:///path, postgresql://...) that holds them"
            )
        return cls(open_store(url, create=False))

    def records(self, model: str, since: datetime | None, until: datetime | None) -> Iterator[StoredRecord]:
        """The records of ``model`` from ``since`` to ``until``, oldest first.

        Raises:
            records.StoreUnavailableError: the store cannot be read.
            records.WriteOnlyStoreError: the store is the HTTP sink.
        """
        cursor: str | None = None
        while True:
            page = self.store.list(model=model, since=since, until=until, limit=MAX_LIMIT, cursor=cursor)
            yield from page.records
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def count(self, model: str, since: datetime | None, until: datetime | None) -> int:
        """How many records :meth:`inputs` gives."""
        return sum(1 for _ in self.records(model, since, until))

    def inputs(self, model: str, since: datetime | None, until: datetime | None) -> Iterator[StoredInput]:
        """The stored inputs (:func:`stored_input`), oldest first."""
        for record in self.records(model, since, until):
            yield stored_input(record)

    def close(self) -> None:
        """Close the store."""
        self.store.close()


@dataclass(frozen=True)
class RecordsQuery:
    """A job's input read from a records store (module docstring).

    Attributes:
        reader: the store's reader.
        model: the model whose records are re-explained (one of the job's).
        since: the first time (``None``: from the first record).
        until: the time after the last (``None``: to the last record).
        explain: the ``explain`` every re-explained body carries (``None``: the model's default method).
    """

    reader: RecordsReader
    model: str
    since: datetime | None = None
    until: datetime | None = None
    explain: Any = None

    def describe(self) -> dict[str, Any]:
        """What of the query changes the answers (for the job's manifest)."""
        return {
            "from_records": self.model,
            "store": self.reader.location,
            "since": self.since.isoformat() if self.since else None,
            "until": self.until.isoformat() if self.until else None,
            "explain": self.explain,
        }

    def count(self) -> int:
        """How many records the job reads."""
        return self.reader.count(self.model, self.since, self.until)

    def requests(self, models: Mapping[str, BatchModel]) -> Iterator[Request | LineError]:
        """The stored inputs as requests, in the store's order (module docstring)."""
        model = models[self.model]

        def items() -> Iterator[Request | LineError]:
            for number, stored in enumerate(self.reader.inputs(self.model, self.since, self.until), start=1):
                yield self._request(stored, number, model, models)

        return unique(items())

    def _request(
        self, stored: StoredInput, number: int, model: BatchModel, models: Mapping[str, BatchModel]
    ) -> Request | LineError:
        where = f"record {stored.record_id}"

        def error(code: str, message: str) -> LineError:
            return LineError(number, stored.record_id, code, f"{where}: {message}", stored.record_id)

        if stored.body is None:
            if stored.kept == "unreadable":
                return error("unreadable_input", f"its input is no request of its model: {stored.problem}")
            return error(
                "payload_not_kept",
                f"its input was not kept (payload: {stored.kept}); only records kept with payload full can be "
                "explained again",
            )
        if stored.model_version != model.served_version:
            return error(
                "version_changed",
                f"it was answered by version {stored.model_version} of {stored.model}; the job's --model "
                f"{model.name}={model.path} is version {model.served_version}: pass the archive that answered it",
            )
        body = dict(stored.body) if isinstance(stored.body, Mapping) else stored.body
        url = stored.url
        if isinstance(body, dict) and url in OPENAI_ROUTES:
            body["explain"] = True if self.explain is None else self.explain
        elif isinstance(body, dict):
            body.pop("explain", None)
            if self.explain is None:  # the explanations route: the model's default method
                url = url.replace("/predictions/", "/explanations/", 1)
            else:
                body["explain"] = self.explain
        try:
            route = parse_route(url, body, models)
        except RouteError as route_error:
            return error(route_error.code, route_error.message)
        return Request(stored.record_id, url, route, body, number, stored.record_id)
