"""The SQL records stores, SQLite and PostgreSQL, through the one interface: a batch in one transaction, read by id,
list with filters and a cursor, payload modes, the hash chain (a changed, a deleted, a re-chained record named by
``verify``), erasure and retention that keep the chain verifiable, migrations, and writers taking turns.

PostgreSQL is a real server the session starts (tests/postgres_server.py); skipped with one line where it is not
installed."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from records import InvalidRecordIdError, Payload, StoreUnavailableError, input_matches, open_store, recorded_input
from records.event import Record, input_digest
from records.sql import TABLE, Migration, SqlStore
from tests.postgres_server import PostgresServer, postgres_server
from tests.records_support import execute, record


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    with postgres_server() as server:
        yield server


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'records.sqlite3'}"
    server: PostgresServer = request.getfixturevalue("postgres")
    return server.new_database()


@pytest.fixture
def store(store_url: str) -> Iterator[SqlStore]:
    opened = open_store(store_url, payload="full")
    assert isinstance(opened, SqlStore)
    yield opened
    opened.close()


def test_a_batch_is_written_and_read_back(store: SqlStore) -> None:
    events = store.write([record("r1", 0), record("r1", 1, answer={"error": {"code": "missing_text"}}), record("r2")])
    assert [event["id"] for event in events] == ["r1-0", "r1-1", "r2"]
    first = store.get("r1-0")
    assert first is not None and first.seq == 1 and first.model == "sentiment" and not first.erased
    assert first.event == events[0]
    assert first.event["specversion"] == "1.0" and first.event["source"] == "/doors/torchserve/models/sentiment"
    data = first.event["data"]
    assert data["model"] == {"name": "sentiment", "version": "sha256:feedface"} and data["method"] == "attnlrp"
    assert data["input"] == {
        "payload": "full",
        "document": {"text": "what a lovely day", "explain": {"method": "attnlrp"}},
    }
    failed = store.get("r1-1")
    assert failed is not None and failed.event["data"]["error"] == {"code": "missing_text"}
    assert failed.event["data"]["prediction"] is None and failed.event["data"]["method"] == "attnlrp"
    assert store.get("nope") is None
    with pytest.raises(InvalidRecordIdError):
        store.get("../etc/passwd")
    assert store.verify().ok and store.verify().checked == 3


def test_a_reused_request_id_reads_the_latest(store: SqlStore) -> None:
    store.write([record("same", text="first")])
    store.write([record("same", text="second")])
    found = store.get("same")
    assert found is not None and found.seq == 2 and found.event["data"]["input"]["document"]["text"] == "second"


def test_a_failed_batch_writes_nothing(store: SqlStore) -> None:
    store.write([record("before")])
    good = record("good")
    bad = Record({**good.event, "id": None}, good.input)  # the id column is NOT NULL
    with pytest.raises(StoreUnavailableError, match="could not commit 2 record"):
        store.write([good, bad])
    assert store.get("good") is None and store.verify().ok and store.verify().head.seq == 1
    store.write([record("after")])
    assert store.verify().ok and store.get("after") is not None


def test_list_pages_with_a_cursor_and_filters(store: SqlStore) -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    store.write([record(f"a{i}", model="sentiment" if i % 2 else "digits", time=start + timedelta(hours=i))
                 for i in range(7)])  # fmt: skip
    seen, cursor, pages = [], None, 0
    while True:
        page = store.list(limit=3, cursor=cursor)
        seen += [item.id for item in page.records]
        pages += 1
        cursor = page.next_cursor
        if cursor is None:
            break
    assert seen == [f"a{i}" for i in range(7)] and pages == 3
    assert [item.id for item in store.list(model="sentiment").records] == ["a1", "a3", "a5"]
    window = store.list(since=start + timedelta(hours=2), until=start + timedelta(hours=5))
    assert [item.id for item in window.records] == ["a2", "a3", "a4"]
    naive = store.list(since=datetime(2026, 1, 1, 6))
    assert [item.id for item in naive.records] == ["a6"]
    assert store.list(model="sentiment", limit=2).next_cursor is not None
    for bad in ({"limit": 0}, {"limit": 1001}, {"cursor": "x"}, {"cursor": "-1"}):
        with pytest.raises(ValueError):
            store.list(**bad)


@pytest.mark.parametrize("mode", ["full", "hash", "none"])
def test_payload_modes(store_url: str, mode: str) -> None:
    document = {"text": "a secret", "explain": {"method": "saliency"}}
    with open_store(store_url, payload=mode) as store:
        store.write([record("doc", input=document), record("raw", input=b"\x00\xffbytes"), record("nil", input=None)])
        kept = {name: store.get(name).event for name in ("doc", "raw", "nil")}  # type: ignore[union-attr]
        salt = store.salt
    inputs = {name: event["data"]["input"] for name, event in kept.items()}
    assert inputs["nil"] is None
    if mode == "full":
        assert inputs["doc"] == {"payload": "full", "document": document}
        assert inputs["raw"] == {"payload": "full", "base64": "AP9ieXRlcw=="}
    elif mode == "hash":
        assert inputs["doc"] == {"payload": "hash", "sha256": input_digest(document, salt)}
        assert "a secret" not in str(kept["doc"])
    else:
        assert inputs["doc"] == inputs["raw"] == {"payload": "none"}
    if mode == "full":
        assert recorded_input(kept["doc"]) == document and recorded_input(kept["raw"]) == b"\x00\xffbytes"
    else:
        assert recorded_input(kept["doc"]) is None and recorded_input(kept["raw"]) is None
    proves = mode != "none"
    assert input_matches(kept["doc"], document, salt) is proves
    assert input_matches(kept["raw"], b"\x00\xffbytes", salt) is proves
    assert not input_matches(kept["doc"], {**document, "text": "another"}, salt)


def test_the_salt_is_the_stores_own_and_kept(store_url: str, tmp_path: Path) -> None:
    with open_store(store_url) as first:
        salt = first.salt
    with open_store(store_url) as again:
        assert again.salt == salt and len(bytes.fromhex(salt)) == 32
    with open_store(f"sqlite:///{tmp_path / 'other.sqlite3'}") as other:
        assert other.salt != salt


def test_verify_names_a_changed_record(store: SqlStore) -> None:
    store.write([record(f"c{i}") for i in range(4)])
    body = execute(store, f"SELECT body FROM {TABLE} WHERE seq = 2")[0][0]
    execute(store, f"UPDATE {TABLE} SET body = ? WHERE seq = 2", (body.replace("positive", "negative"),))
    result = store.verify()
    assert not result.ok and [(p.seq, p.id, p.kind) for p in result.problems] == [(2, "c1", "changed")]
    assert "record 2 (id c1) was changed" in result.problems[0].message


def test_verify_names_a_record_rechained_to_hide_a_change(store: SqlStore) -> None:
    from records.chain import body_hash, link_hash

    store.write([record(f"c{i}") for i in range(4)])
    body, prev = execute(store, f"SELECT body, prev_hash FROM {TABLE} WHERE seq = 2")[0]
    forged = body.replace("positive", "negative")
    digest = body_hash(forged)
    execute(store, f"UPDATE {TABLE} SET body = ?, body_hash = ?, hash = ? WHERE seq = 2",
            (forged, digest, link_hash(prev, 2, digest)))  # fmt: skip
    result = store.verify()
    assert [(p.seq, p.id, p.kind) for p in result.problems] == [(2, "c1", "broken")]
    assert "record 2 (id c1) was changed or replaced" in result.problems[0].message


def test_verify_names_deleted_records(store: SqlStore) -> None:
    store.write([record(f"d{i}") for i in range(6)])
    execute(store, f"DELETE FROM {TABLE} WHERE seq IN (3, 4)")
    execute(store, f"DELETE FROM {TABLE} WHERE seq = 6")
    result = store.verify()
    assert [(p.seq, p.kind) for p in result.problems] == [(3, "missing"), (6, "missing")]
    assert "records 3-4 missing" in result.problems[0].message
    assert "record 6 missing" in result.problems[1].message and "head is 6" in result.problems[1].message


def test_erasure_keeps_the_chain_verifiable(store: SqlStore) -> None:
    store.write([record("keep"), record("gone"), record("gone", 0), record("gone")])  # "gone" reused: both erased
    assert store.erase("gone") == 2
    assert not store.get("gone-0").erased  # type: ignore[union-attr]
    erased = store.get("gone")
    assert erased is not None and erased.erased
    assert erased.event["data"]["erased"] is True and "input" not in erased.event["data"]
    assert set(erased.event) == {"specversion", "id", "source", "type", "time", "datacontenttype", "data"}
    assert store.erase("gone") == 0
    result = store.verify()
    assert result.ok and result.erased == 2 and result.checked == 4
    store.write([record("later")])
    assert store.verify().ok


def test_retention_deletes_a_prefix_and_keeps_the_chain_verifiable(store: SqlStore) -> None:
    now = datetime(2026, 12, 1, tzinfo=UTC)
    store.write([record(f"old{i}", time=now - timedelta(days=10 - i)) for i in range(3)])
    store.write([record(f"new{i}", time=now - timedelta(hours=i)) for i in range(2)])
    assert store.retain(5, now=now) == 3
    assert store.retain(5, now=now) == 0
    assert [item.id for item in store.list().records] == ["new0", "new1"]
    result = store.verify()
    assert result.ok and result.anchor.seq == 3 and result.checked == 2
    store.write([record("newer")])
    assert store.verify().ok
    assert store.retain(0.001, now=now + timedelta(days=30)) == 3
    result = store.verify()
    assert result.ok and result.checked == 0 and result.anchor == result.head
    store.write([record("fresh")])
    assert store.verify().ok and store.get("fresh").seq == 7  # type: ignore[union-attr]
    assert store.retain(10**9, now=now) == 0
    for bad in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ValueError):
            store.retain(bad)


def test_retention_cannot_hide_a_deleted_record(store: SqlStore) -> None:
    now = datetime(2026, 12, 1, tzinfo=UTC)
    store.write([record(f"old{i}", time=now - timedelta(days=10)) for i in range(3)] + [record("new", time=now)])
    execute(store, f"DELETE FROM {TABLE} WHERE seq = 2")
    execute(store, f"DELETE FROM {TABLE} WHERE seq = 3")
    with pytest.raises(StoreUnavailableError, match="lacks record 3"):
        store.retain(5, now=now)


def test_writers_with_their_own_connections_take_turns(store_url: str) -> None:
    stores = [open_store(store_url) for _ in range(4)]
    errors: list[BaseException] = []

    def write(number: int) -> None:
        try:
            for batch in range(8):
                stores[number].write([record(f"w{number}-{batch}", index) for index in range(3)])
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=write, args=(number,)) for number in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert errors == []
    result = stores[0].verify()
    assert result.ok and result.checked == 4 * 8 * 3 and result.head.seq == 96
    for opened in stores:
        opened.close()


WRITER = """
import sys
from records import open_store
from tests.records_support import record

store = open_store(sys.argv[1])
for batch in range(10):
    store.write([record(f"p{sys.argv[2]}-{batch}", index) for index in range(2)])
store.close()
"""


def test_worker_processes_append_to_one_chain(store_url: str) -> None:
    """Each worker of a door is its own process with its own connection: their batches interleave in one chain."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(root)}
    workers = [
        subprocess.Popen([sys.executable, "-c", WRITER, store_url, str(number)], cwd=root, env=env)
        for number in range(3)
    ]
    assert [worker.wait(timeout=120) for worker in workers] == [0, 0, 0]
    with open_store(store_url) as store:
        result = store.verify()
        assert result.ok and result.checked == 60 and result.head.seq == 60
        assert store.erase("p1-3-0") == 1 and store.verify().ok


def test_migrations_run_once_and_a_newer_schema_is_refused(store_url: str) -> None:
    with open_store(store_url) as store:
        assert isinstance(store, SqlStore) and store.schema_version() == 1
        store.write([record("x")])
        kind = type(store)

    class Upgraded(kind):  # type: ignore[valid-type,misc]
        migrations = (*kind.migrations, Migration(2, "an index on the model and time", (
            f"CREATE INDEX {TABLE}_model_time ON {TABLE} (model, time)",)))  # fmt: skip

    where = getattr(store, "path", store_url)  # SQLite opens its file, PostgreSQL its URL

    def reopen() -> SqlStore:
        return Upgraded(where, Payload.HASH)

    upgraded = reopen()
    assert upgraded.schema_version() == 2 and upgraded.get("x") is not None
    upgraded.close()
    again = reopen()  # applied once: a second CREATE INDEX would fail
    assert again.schema_version() == 2
    again.close()
    with pytest.raises(StoreUnavailableError, match="schema version 2, newer than this service's 1"):
        open_store(store_url)


def test_a_connection_the_server_dropped_is_made_again(store: SqlStore) -> None:
    """A PostgreSQL server restarted (here: the store's session terminated) while the store was idle: the next
    write and read go through on a new connection, and nothing is written twice."""
    store.write([record("before")])
    if store.kind == "postgresql":
        execute(store, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid <> pg_backend_pid() "
                "AND datname = current_database()")  # fmt: skip
    else:
        store._conn.close()
    store.write([record("after")])
    assert store.get("after") is not None
    result = store.verify()
    assert result.ok and result.checked == 2
