"""Writing a batch's records off the model's path, durable before the answers leave, and the store-error policy.

A door builds one :class:`~records.event.Record` per answered row and calls :meth:`RecordWriter.record` with the
batch's records before it returns the answers. The writer's own thread (one per store, with the store's connection)
commits the batch in one transaction, so the model's thread never runs database code; the call returns once the
batch is durable. :meth:`RecordWriter.submit` starts the write and returns a future, for a door that encodes its
answers meanwhile. With ``retention_days`` the same thread deletes the records older than that after a batch (the
batch's answers do not wait for it), at most once an hour.

Group commit: batches submitted while the thread is committing an earlier one (concurrent requests of a door that
serves them in one process, several models' batches) wait for it, then go in one transaction together (up to
:data:`GROUP_MAX_RECORDS` records), so they share one durable commit instead of paying one each; every batch's future
is done only once the transaction that holds it is committed. When a group's transaction fails, each of its batches
is tried again alone, so a batch fails only by its own fault or the store's, as it would alone. The HTTP sink
delivers record by record, so its batches are written one at a time.

A store that fails (or does not commit within the writer's timeout) is handled by ``on_store_error``
(:func:`handle_store_error`): ``answer`` logs one ERROR naming the store and the model, counts
``explain_record_errors_total{model,store}`` and lets the answers go; ``refuse`` logs and counts the same and raises the
error table's ``records_unavailable`` (503, ``UNAVAILABLE``) as a :class:`~serving_core.errors.RowError`, which the
door answers for every row of the batch.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from prometheus_client import Counter

from serving_core.errors import RowError

from .errors import StoreUnavailableError
from .event import Record
from .settings import OnStoreError
from .store import RecordStore

logger = logging.getLogger(__name__)

#: Seconds :meth:`RecordWriter.record` waits for a batch to commit before treating the store as failed.
COMMIT_TIMEOUT_S = 30.0
#: Seconds between two retention passes of a writer.
RETENTION_EVERY_S = 3600.0
#: The error table's code of a batch that could not be recorded.
ERROR_CODE = "records_unavailable"
#: The most records one group commit takes (the batches waiting beyond it go in the next transaction).
GROUP_MAX_RECORDS = 512

#: What the writer's queue holds besides batches: run retention now, or end the thread.
_RETAIN = "retain"
_STOP = "stop"
_Batch = tuple[list[Record], "Future[list[dict[str, Any]]]"]

RECORD_ERRORS = Counter(
    "explain_record_errors",
    "Batches whose records could not be committed, by model and store kind (sqlite, postgresql, http)",
    ["model", "store"],
)


def handle_store_error(error: StoreUnavailableError, *, policy: OnStoreError, model: str) -> None:
    """Apply ``on_store_error`` to a failed write: count it, then log (``answer``) or refuse (``refuse``).

    Args:
        error: The store's error.
        policy: The model's ``on_store_error``.
        model: The model's name (the metric's label).

    Raises:
        RowError: ``records_unavailable``, when the policy is ``refuse``.
    """
    RECORD_ERRORS.labels(model, error.store).inc()
    if policy is OnStoreError.REFUSE:
        logger.error("records: %s; model %s refuses the batch (on_store_error: refuse)", error, model)
        raise RowError(ERROR_CODE, f"the answer could not be recorded, so it is refused: {error}") from error
    logger.error("records: %s; model %s answered without its records (on_store_error: answer)", error, model)


class RecordWriter:
    """Commits batches of records to one store from a thread of its own.

    Attributes:
        store: The store written to.
    """

    def __init__(
        self,
        store: RecordStore,
        *,
        timeout_s: float = COMMIT_TIMEOUT_S,
        retention_days: float | None = None,
        retention_every_s: float = RETENTION_EVERY_S,
        group_max_records: int = GROUP_MAX_RECORDS,
    ) -> None:
        """A writer for ``store``.

        Args:
            store: The store (the writer's thread is the only one that writes through it).
            timeout_s: Seconds :meth:`record` and :meth:`write` wait for a batch to commit.
            retention_days: Delete records older than this (the settings' ``retention_days``), checked after a
                batch at most every ``retention_every_s``; None keeps them.
            retention_every_s: Seconds between two retention passes.
            group_max_records: The most records one transaction takes from the batches waiting (1: no group
                commit); the HTTP sink is always written one batch at a time.
        """
        self.store = store
        self._timeout_s = timeout_s
        self._retention_days = retention_days
        self._retention_every_s = retention_every_s
        self._retained_at: float | None = None
        self._group_max = 1 if store.kind == "http" else max(1, group_max_records)
        self._queue: queue.SimpleQueue[_Batch | str] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="records-writer", daemon=True)
        self._thread.start()

    def submit(self, records: Sequence[Record]) -> Future[list[dict[str, Any]]]:
        """Start committing a batch's records (one transaction, shared with the batches waiting beside it); the
        future is done when they are durable.

        Args:
            records: The batch's records.

        Returns:
            A future whose result is the events as kept once committed, or the store's error.

        Raises:
            RuntimeError: the writer is closed.
        """
        future: Future[list[dict[str, Any]]] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("the records writer is closed")
            self._queue.put((list(records), future))
            if self._retention_due():
                self._queue.put(_RETAIN)  # after the batch: its answers do not wait for retention
        return future

    def _run(self) -> None:
        """The writer's thread: commit the batches as they come, each with those waiting behind it (an unexpected
        error is logged, and the thread goes on with the next batch)."""
        while True:
            try:
                if self._step():
                    return
            except Exception:
                logger.exception("records: the writer of %s failed unexpectedly", self.store.location)

    def _step(self) -> bool:
        """Take the next batch (with those waiting behind it) or marker from the queue and handle it; True when the
        thread is to end."""
        while True:
            item = self._queue.get()
            if item == _STOP:
                return True
            if item == _RETAIN:
                self._retain()
                continue
            assert not isinstance(item, str)
            group = [item]
            count = len(item[0])
            after: str | None = None
            while count < self._group_max:
                try:
                    waiting = self._queue.get_nowait()
                except queue.Empty:
                    break
                if isinstance(waiting, str):
                    after = waiting
                    break
                group.append(waiting)
                count += len(waiting[0])
            self._commit(group)
            if after == _RETAIN:
                self._retain()
            return after == _STOP

    def _commit(self, group: list[_Batch]) -> None:
        """Commit a group's batches in one transaction and settle their futures; when that fails and the group has
        more than one batch, each batch again alone."""
        try:
            events = self.store.write([record for records, _ in group for record in records])
        except BaseException as error:
            if len(group) == 1:
                if not group[0][1].done():
                    group[0][1].set_exception(error)
                return
            logger.warning("records: a group of %d batches failed (%s); committing each alone", len(group), error)
            for batch in group:
                self._commit([batch])
            return
        start = 0
        for records, future in group:
            if not future.done():
                future.set_result(events[start : start + len(records)])
            start += len(records)

    def _retention_due(self) -> bool:
        if self._retention_days is None:
            return False
        now = time.monotonic()
        if self._retained_at is not None and now - self._retained_at < self._retention_every_s:
            return False
        self._retained_at = now
        return True

    def _retain(self) -> None:
        assert self._retention_days is not None
        try:
            removed = self.store.retain(self._retention_days)
        except StoreUnavailableError as error:  # tried again after the next batch
            logger.warning("records: retention of %s failed: %s", self.store.location, error)
            self._retained_at = None
        else:
            if removed:
                logger.info("records: removed %d record(s) older than %g day(s)", removed, self._retention_days)

    def write(self, records: Sequence[Record]) -> None:
        """Commit a batch's records and return once they are durable.

        Raises:
            StoreUnavailableError: the store failed, or did not commit within the writer's timeout.
        """
        self.wait(self.submit(records))

    def wait(self, future: Future[Any]) -> None:
        """Wait for a batch :meth:`submit` started.

        Raises:
            StoreUnavailableError: the store failed, or did not commit within the writer's timeout.
        """
        try:
            future.result(timeout=self._timeout_s)
        except FutureTimeout:
            raise StoreUnavailableError(
                self.store.kind, f"the records store {self.store.location} did not commit within {self._timeout_s} s"
            ) from None

    def record(self, records: Sequence[Record], *, model: str, on_store_error: OnStoreError) -> None:
        """Commit a batch's records, applying ``on_store_error`` when the store fails.

        Args:
            records: The batch's records.
            model: The model's name (the metric's label).
            on_store_error: The model's policy.

        Raises:
            RowError: ``records_unavailable``, when the store failed and the policy is ``refuse``.
        """
        if not records:
            return
        try:
            self.write(records)
        except StoreUnavailableError as error:
            handle_store_error(error, policy=on_store_error, model=model)

    def close(self) -> None:
        """Finish the batches already submitted, then close the store."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._queue.put(_STOP)
        self._thread.join()
        self.store.close()


__all__ = [
    "COMMIT_TIMEOUT_S",
    "ERROR_CODE",
    "GROUP_MAX_RECORDS",
    "RECORD_ERRORS",
    "RETENTION_EVERY_S",
    "RecordWriter",
    "handle_store_error",
]
