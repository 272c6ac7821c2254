"""The records writer's group commit (:mod:`records.writer`): batches that wait while the writer commits go in one
transaction together, each caller returns only once the transaction holding its batch is committed (a fresh
connection sees its records), a failed group is committed batch by batch (a bad batch fails alone), and the HTTP
sink, which delivers record by record, is written one batch at a time."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from records import Record, open_store
from records.errors import StoreUnavailableError
from records.sql import TABLE
from records.store import RecordStore
from records.writer import RecordWriter
from tests.records_support import record


class SlowStore:
    """Wraps a store: each write first waits ``pause_s`` (a slow disk), and the writes are counted."""

    def __init__(self, inner: RecordStore, pause_s: float, fail_on: str | None = None, kind: str | None = None) -> None:
        self.inner = inner
        self.pause_s = pause_s
        self.fail_on = fail_on
        self.kind = kind or inner.kind
        self.location = inner.location
        self.writes: list[list[str]] = []

    def write(self, records: Sequence[Record]) -> list[dict[str, Any]]:
        time.sleep(self.pause_s)
        ids = [item.id for item in records]
        self.writes.append(ids)
        if self.fail_on is not None and self.fail_on in ids:
            raise StoreUnavailableError(self.kind, f"the store refused {self.fail_on}")
        return self.inner.write(records)

    def close(self) -> None:
        self.inner.close()


def _writer(store: SlowStore) -> RecordWriter:
    return RecordWriter(store)  # type: ignore[arg-type]


def test_batches_waiting_for_the_writer_share_one_transaction(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'records.sqlite3'}"
    store = SlowStore(open_store(url, payload="full"), pause_s=0.3)
    writer = _writer(store)
    first = writer.submit([record("a")])
    time.sleep(0.1)  # the writer is committing "a"
    second = writer.submit([record("b", 0), record("b", 1)])
    third = writer.submit([record("c")])
    writer.wait(first)
    assert not second.done() and not third.done()  # they wait for their own transaction
    writer.wait(second)
    writer.wait(third)
    assert store.writes == [["a"], ["b-0", "b-1", "c"]]
    assert [event["id"] for event in second.result()] == ["b-0", "b-1"]
    assert [event["id"] for event in third.result()] == ["c"]
    writer.close()
    with open_store(url, create=False) as opened:
        assert [item.id for item in opened.list().records] == ["a", "b-0", "b-1", "c"] and opened.verify().ok


def test_every_caller_returns_only_once_its_records_are_committed(tmp_path: Path) -> None:
    path = tmp_path / "records.sqlite3"
    store = SlowStore(open_store(f"sqlite:///{path}", payload="full"), pause_s=0.02)
    writer = _writer(store)
    unseen: list[str] = []
    lock = threading.Lock()

    def client(name: str) -> None:
        for index in range(10):
            writer.write([record(f"{name}-{index}")])
            with sqlite3.connect(path) as conn:  # another connection: it sees committed rows only
                seen = conn.execute(f"SELECT COUNT(*) FROM {TABLE} WHERE id = ?", (f"{name}-{index}",)).fetchone()[0]
            if seen != 1:
                with lock:
                    unseen.append(f"{name}-{index}")

    threads = [threading.Thread(target=client, args=(f"t{number}",)) for number in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    writer.close()
    assert unseen == []
    assert sum(len(ids) for ids in store.writes) == 80
    assert len(store.writes) < 80  # batches shared transactions
    with open_store(f"sqlite:///{path}", create=False) as opened:
        verified = opened.verify()
        assert verified.ok and verified.checked == 80


def test_a_failed_group_is_committed_batch_by_batch(tmp_path: Path) -> None:
    store = SlowStore(open_store(f"sqlite:///{tmp_path / 'r.sqlite3'}"), pause_s=0.2, fail_on="bad")
    writer = _writer(store)
    first = writer.submit([record("first")])
    time.sleep(0.05)
    futures = [writer.submit([record(name)]) for name in ("good", "bad", "fine")]
    writer.wait(first)
    writer.wait(futures[0])
    with pytest.raises(StoreUnavailableError, match="refused bad"):
        writer.wait(futures[1])
    writer.wait(futures[2])
    writer.close()
    assert store.writes == [["first"], ["good", "bad", "fine"], ["good"], ["bad"], ["fine"]]


def test_the_http_sink_is_written_one_batch_at_a_time(tmp_path: Path) -> None:
    store = SlowStore(open_store(f"sqlite:///{tmp_path / 'r.sqlite3'}"), pause_s=0.2, kind="http")
    writer = _writer(store)
    futures = [writer.submit([record(name)]) for name in ("a", "b", "c")]
    for future in futures:
        writer.wait(future)
    writer.close()
    assert store.writes == [["a"], ["b"], ["c"]]
    with pytest.raises(RuntimeError, match="closed"):
        writer.submit([record("late")])
