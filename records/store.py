"""The one interface every records store has: write a batch in one transaction, read by id, list, erase, retention,
verify.

:class:`RecordStore` is the interface; :mod:`records.sql` implements it once for the SQL stores (SQLite and
PostgreSQL), :mod:`records.http_sink` for the write-only HTTP sink. :func:`records.stores.open_store` opens one from
its URL.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .chain import Verification
from .event import Payload, Record

#: The most records one :meth:`RecordStore.list` call returns.
MAX_LIMIT = 1000
#: What :meth:`RecordStore.list` returns when no limit is given.
DEFAULT_LIMIT = 100


@dataclass(frozen=True)
class StoredRecord:
    """A record as a store keeps it.

    Attributes:
        seq: Its place in the store's chain (1, 2, 3, ...).
        id: The record id (the event's ``id``).
        model: The model's name.
        time: When the row was answered (the event's ``time``).
        event: The CloudEvent (a tombstone, ``data: {"erased": true, "erased_at": ...}``, once erased).
        erased: Whether the record was erased.
        hash: Its link hash in the chain.
    """

    seq: int
    id: str
    model: str
    time: str
    event: dict[str, Any]
    erased: bool
    hash: str


@dataclass(frozen=True)
class Page:
    """One page of :meth:`RecordStore.list`.

    Attributes:
        records: The records, oldest first.
        next_cursor: The cursor of the next page, or None when this is the last.
    """

    records: list[StoredRecord]
    next_cursor: str | None


class RecordStore(abc.ABC):
    """Where records are kept (or, for a sink, delivered).

    Attributes:
        kind: ``sqlite``, ``postgresql`` or ``http``: the bounded ``store`` label of the metrics.
        location: The store's URL with any password left out, for messages.
        payload: How much of each input the store keeps.
    """

    kind: str
    location: str
    payload: Payload

    @abc.abstractmethod
    def write(self, records: Sequence[Record]) -> list[dict[str, Any]]:
        """Keep ``records`` (one batch) in one transaction: all are durable when this returns, or none is.

        Args:
            records: The batch's records.

        Returns:
            The events as kept (``data.input`` by the store's payload mode).

        Raises:
            StoreUnavailableError: the store could not commit them.
        """

    @abc.abstractmethod
    def get(self, record_id: str) -> StoredRecord | None:
        """The record of that id (the latest, if a caller reused a request id), or None.

        Raises:
            InvalidRecordIdError: the id is not valid.
            StoreUnavailableError: the store could not be read.
            WriteOnlyStoreError: the store is a sink.
        """

    @abc.abstractmethod
    def list(
        self,
        *,
        model: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int = DEFAULT_LIMIT,
        cursor: str | None = None,
    ) -> Page:
        """Records in the order they were written, oldest first, a page at a time.

        Args:
            model: Only this model's records.
            since: Only records answered at or after this time.
            until: Only records answered before this time.
            limit: The most records in the page (1 to :data:`MAX_LIMIT`).
            cursor: The ``next_cursor`` of the previous page.

        Returns:
            The :class:`Page`.

        Raises:
            ValueError: a bad limit or cursor.
            StoreUnavailableError: the store could not be read.
            WriteOnlyStoreError: the store is a sink.
        """

    @abc.abstractmethod
    def erase(self, record_id: str) -> int:
        """Erase the records of that id: their bodies become tombstones, the chain still verifies.

        Returns:
            How many records were erased now (0 when none has that id or all were erased already).

        Raises:
            InvalidRecordIdError: the id is not valid.
            StoreUnavailableError: the store could not be written.
            WriteOnlyStoreError: the store is a sink.
        """

    @abc.abstractmethod
    def retain(self, days: float, *, now: datetime | None = None) -> int:
        """Delete the records older than ``days`` (a prefix of the chain), keeping the chain verifiable.

        Args:
            days: How many days of records to keep.
            now: The present (default: the clock).

        Returns:
            How many records were deleted.

        Raises:
            ValueError: ``days`` is not positive.
            StoreUnavailableError: the store could not be written.
            WriteOnlyStoreError: the store is a sink.
        """

    @abc.abstractmethod
    def verify(self) -> Verification:
        """Check the whole chain (:func:`records.chain.verify_links`).

        Raises:
            StoreUnavailableError: the store could not be read.
            WriteOnlyStoreError: the store is a sink.
        """

    @property
    @abc.abstractmethod
    def salt(self) -> str:
        """The store's salt (hex), the one its ``hash`` records are made with."""

    def close(self) -> None:  # noqa: B027 (a store with nothing to release keeps this)
        """Release the store's connection, if it has one."""

    def __enter__(self) -> RecordStore:
        """The store itself."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Close the store."""
        self.close()


def check_limit(limit: int) -> int:
    """``limit`` when it is 1 to :data:`MAX_LIMIT`.

    Raises:
        ValueError: it is not.
    """
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"limit must be an integer from 1 to {MAX_LIMIT}, not {limit!r}")
    return limit


def parse_cursor(cursor: str | None) -> int:
    """The sequence number a cursor stands for (0 for the first page).

    Raises:
        ValueError: the cursor is not one a page gave.
    """
    if cursor is None or cursor == "":
        return 0
    if not cursor.isdigit() or len(cursor) > 19:
        raise ValueError(f"cursor {cursor[:40]!r} is not one a page of records gave")
    return int(cursor)


__all__ = ["DEFAULT_LIMIT", "MAX_LIMIT", "Page", "RecordStore", "StoredRecord", "check_limit", "parse_cursor"]
