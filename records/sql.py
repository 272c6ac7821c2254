"""The SQL stores' one implementation of :class:`~records.store.RecordStore`: tables, migrations, the chain.

Tables (the same in SQLite and PostgreSQL; column types differ, see each store's migrations):

- ``explain_records``: one row per record: ``seq`` (its place in the chain, the primary key), ``id``, ``model``,
  ``time``, ``body`` (the event's canonical JSON), ``body_hash``, ``prev_hash``, ``hash`` (:mod:`records.chain`) and
  ``erased_at`` (set when erased; the body is then a tombstone);
- ``explain_records_chain``: the two marks, ``head`` and ``anchor`` (``seq``, ``hash``);
- ``explain_records_meta``: ``salt`` (32 random bytes in hex, made when the store is created);
- ``explain_records_schema``: one row per migration applied (``version``, ``description``, ``applied_at``).

A store is migrated when opened: the steps of its :attr:`SqlStore.migrations` above the highest version in
``explain_records_schema`` run in order, in one transaction, each recording its version, under a lock so that two
workers opening the store at once apply them once. A store whose schema is newer than this code is refused.

Every write (a batch, an erasure, a retention) is one transaction that holds the chain's lock (SQLite: ``BEGIN
IMMEDIATE``; PostgreSQL: the ``head`` row ``FOR UPDATE``), so the workers of every door append to one chain in turn.
Reads that need a consistent view (verify) read in one transaction.
"""

from __future__ import annotations

import abc
import json
import math
import secrets
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, suppress
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from .chain import GENESIS, Link, Mark, Verification, body_hash, link_hash, verify_links
from .errors import StoreUnavailableError
from .event import Payload, Record, canonical_json, format_time, parse_time
from .ids import check_record_id
from .store import DEFAULT_LIMIT, Page, RecordStore, StoredRecord, check_limit, parse_cursor

T = TypeVar("T")

#: The records table.
TABLE = "explain_records"
#: The head and anchor marks.
CHAIN_TABLE = "explain_records_chain"
#: The store's settings (its salt).
META_TABLE = "explain_records_meta"
#: The migrations applied.
SCHEMA_TABLE = "explain_records_schema"
#: The envelope a tombstone keeps of an erased event.
ENVELOPE = ("specversion", "id", "source", "type", "time", "datacontenttype")

_COLUMNS = "seq, id, model, body, body_hash, prev_hash, hash, erased_at"


@dataclass(frozen=True)
class Migration:
    """One step of a store's schema.

    Attributes:
        version: Its version (steps run in increasing order, each once).
        description: What it changes.
        statements: The SQL statements it runs.
    """

    version: int
    description: str
    statements: tuple[str, ...]


def tombstone(event: dict[str, Any], erased_at: str) -> dict[str, Any]:
    """What an erased record keeps: the envelope, and ``data: {"erased": true, "erased_at": ...}``."""
    kept = {key: event[key] for key in ENVELOPE if key in event}
    return {**kept, "data": {"erased": True, "erased_at": erased_at}}


class SqlStore(RecordStore):
    """A :class:`~records.store.RecordStore` over a SQL database (subclasses give the connection and the dialect).

    One connection per store object, used by one thread at a time (a lock); a connection that failed is dropped and
    made again (see :meth:`_run` for the one case a call is tried again at once).
    """

    #: The schema's steps, in order (each dialect's own column types).
    migrations: tuple[Migration, ...] = ()

    def __init__(self, location: str, payload: Payload) -> None:
        """Open the store: connect and migrate.

        Raises:
            StoreUnavailableError: the database cannot be reached or migrated.
        """
        self.location = location
        self.payload = payload
        self._lock = threading.Lock()
        self._conn: Any = None
        self._locked = False
        self._salt = self._run(self._migrate, "open")

    # -- what each dialect gives -------------------------------------------------------------------------------

    @abc.abstractmethod
    def _connect(self) -> Any:
        """A new DB-API connection."""

    @abc.abstractmethod
    def _transaction(self, conn: Any, *, write: bool) -> AbstractContextManager[Any]:
        """A transaction on ``conn`` yielding a cursor (committed on success, rolled back on an error)."""

    @abc.abstractmethod
    def _lock_chain(self, cur: Any) -> None:
        """Take the chain's write lock inside a write transaction."""

    @abc.abstractmethod
    def _lock_schema(self, cur: Any) -> None:
        """Take the migration lock inside a write transaction (the tables may not exist yet)."""

    @abc.abstractmethod
    def _time_value(self, moment: datetime) -> Any:
        """``moment`` as the ``time`` column's parameter."""

    #: The exceptions that mean the database failed.
    _failures: tuple[type[BaseException], ...] = ()

    def _sql(self, query: str) -> str:
        """``query`` (written with ``?`` parameters) in the driver's parameter style."""
        return query

    # -- plumbing ------------------------------------------------------------------------------------------------

    def _run(self, action: Callable[[Any], T], what: str, *, idempotent: bool = False) -> T:
        """Run ``action`` on the connection (made when there is none); a failure is :class:`StoreUnavailableError`.

        A connection that went stale while idle (a restarted server) fails on the first statement: the action runs
        once more on a new connection when it is a read (``idempotent``) or a write that had not taken the chain's
        lock yet, so nothing it did can have been committed.
        """
        with self._lock:
            for attempt in (1, 2):
                fresh = self._conn is None
                self._locked = False
                try:
                    if fresh:
                        self._conn = self._connect()
                    return action(self._conn)
                except self._failures as error:
                    self._drop()
                    if attempt == 1 and not fresh and (idempotent or not self._locked):
                        continue
                    raise StoreUnavailableError(
                        self.kind, f"the {self.kind} records store {self.location} could not {what}: {error}"
                    ) from error
            raise AssertionError("unreachable")

    def _begin_write(self, cur: Any) -> None:
        """Take the chain's lock: from here on a failed write is not tried again."""
        self._lock_chain(cur)
        self._locked = True

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with suppress(*self._failures):
                conn.close()

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            self._drop()

    def _migrate(self, conn: Any) -> str:
        latest = max((step.version for step in self.migrations), default=0)
        with self._transaction(conn, write=True) as cur:
            self._lock_schema(cur)
            cur.execute(
                f"CREATE TABLE IF NOT EXISTS {SCHEMA_TABLE} "
                "(version INTEGER PRIMARY KEY, description TEXT NOT NULL, applied_at TEXT NOT NULL)"
            )
            cur.execute(f"SELECT MAX(version) FROM {SCHEMA_TABLE}")
            current = cur.fetchone()[0] or 0
            if current > latest:
                raise StoreUnavailableError(
                    self.kind,
                    f"the records store {self.location} has schema version {current}, newer than this service's "
                    f"{latest}: upgrade the service",
                )
            for step in sorted(self.migrations, key=lambda step: step.version):
                if step.version <= current:
                    continue
                for statement in step.statements:
                    cur.execute(statement)
                cur.execute(
                    self._sql(f"INSERT INTO {SCHEMA_TABLE} (version, description, applied_at) VALUES (?, ?, ?)"),
                    (step.version, step.description, format_time(datetime.now(UTC))),
                )
            cur.execute(
                self._sql(f"INSERT INTO {META_TABLE} (key, value) VALUES (?, ?) ON CONFLICT (key) DO NOTHING"),
                ("salt", secrets.token_hex(32)),
            )
            cur.execute(self._sql(f"SELECT value FROM {META_TABLE} WHERE key = ?"), ("salt",))
            return str(cur.fetchone()[0])

    def schema_version(self) -> int:
        """The highest migration applied to the store."""

        def read(conn: Any) -> int:
            with self._transaction(conn, write=False) as cur:
                cur.execute(f"SELECT MAX(version) FROM {SCHEMA_TABLE}")
                return int(cur.fetchone()[0] or 0)

        return self._run(read, "read its schema version", idempotent=True)

    @property
    def salt(self) -> str:
        """The store's salt (hex)."""
        return self._salt

    def _mark(self, cur: Any, name: str) -> Mark:
        cur.execute(self._sql(f"SELECT seq, hash FROM {CHAIN_TABLE} WHERE name = ?"), (name,))
        row = cur.fetchone()
        return Mark(int(row[0]), str(row[1])) if row is not None else Mark(0, GENESIS)

    def _stored(self, row: Sequence[Any]) -> StoredRecord:
        seq, record_id, model, body, _, _, hash_, erased_at = row
        try:
            event = json.loads(body)
        except ValueError:  # a body changed outside the store: `verify` names it
            event = {"id": record_id, "unreadable": body}
        return StoredRecord(int(seq), record_id, model, str(event.get("time", "")), event, erased_at is not None, hash_)

    # -- the interface -------------------------------------------------------------------------------------------

    def write(self, records: Sequence[Record]) -> list[dict[str, Any]]:
        """Append the batch's records to the chain in one transaction (see :meth:`RecordStore.write`)."""
        events = [record.event_for(self.payload, self._salt) for record in records]
        if not events:
            return []

        def append(conn: Any) -> None:
            with self._transaction(conn, write=True) as cur:
                self._begin_write(cur)
                head = self._mark(cur, "head")
                seq, prev = head.seq, head.hash
                rows = []
                for event in events:
                    seq += 1
                    body = canonical_json(event)
                    digest = body_hash(body)
                    link = link_hash(prev, seq, digest)
                    model = event["data"]["model"]["name"]
                    moment = self._time_value(parse_time(event["time"]))
                    rows.append((seq, event["id"], model, moment, body, digest, prev, link))
                    prev = link
                cur.executemany(
                    self._sql(
                        f"INSERT INTO {TABLE} (seq, id, model, time, body, body_hash, prev_hash, hash) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
                    ),
                    rows,
                )
                cur.execute(
                    self._sql(f"UPDATE {CHAIN_TABLE} SET seq = ?, hash = ? WHERE name = ?"), (seq, prev, "head")
                )

        self._run(append, f"commit {len(events)} record(s)")
        return events

    def get(self, record_id: str) -> StoredRecord | None:
        """The latest record of that id (see :meth:`RecordStore.get`)."""
        check_record_id(record_id)

        def read(conn: Any) -> StoredRecord | None:
            with self._transaction(conn, write=False) as cur:
                cur.execute(
                    self._sql(f"SELECT {_COLUMNS} FROM {TABLE} WHERE id = ? ORDER BY seq DESC LIMIT 1"), (record_id,)
                )
                row = cur.fetchone()
                return self._stored(row) if row is not None else None

        return self._run(read, "read a record", idempotent=True)

    def list(
        self,
        *,
        model: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int = DEFAULT_LIMIT,
        cursor: str | None = None,
    ) -> Page:
        """A page of records, oldest first (see :meth:`RecordStore.list`)."""
        check_limit(limit)
        after = parse_cursor(cursor)
        where: list[str] = ["seq > ?"]
        params: list[Any] = [after]
        if model is not None:
            where.append("model = ?")
            params.append(model)
        if since is not None:
            where.append("time >= ?")
            params.append(self._time_value(since))
        if until is not None:
            where.append("time < ?")
            params.append(self._time_value(until))
        query = f"SELECT {_COLUMNS} FROM {TABLE} WHERE {' AND '.join(where)} ORDER BY seq LIMIT ?"

        def read(conn: Any) -> Page:
            with self._transaction(conn, write=False) as cur:
                cur.execute(self._sql(query), (*params, limit + 1))
                rows = [self._stored(row) for row in cur.fetchall()]
            more = len(rows) > limit
            rows = rows[:limit]
            return Page(rows, str(rows[-1].seq) if more else None)

        return self._run(read, "list records", idempotent=True)

    def erase(self, record_id: str) -> int:
        """Replace the bodies of that id's records by tombstones (see :meth:`RecordStore.erase`)."""
        check_record_id(record_id)
        now = datetime.now(UTC)

        def erase(conn: Any) -> int:
            with self._transaction(conn, write=True) as cur:
                self._begin_write(cur)
                cur.execute(
                    self._sql(f"SELECT seq, body FROM {TABLE} WHERE id = ? AND erased_at IS NULL"), (record_id,)
                )
                found = cur.fetchall()
                for seq, body in found:
                    stone = canonical_json(tombstone(json.loads(body), format_time(now)))
                    cur.execute(
                        self._sql(f"UPDATE {TABLE} SET body = ?, erased_at = ? WHERE seq = ?"),
                        (stone, self._time_value(now), seq),
                    )
                return len(found)

        return self._run(erase, "erase a record")

    def retain(self, days: float, *, now: datetime | None = None) -> int:
        """Delete the oldest records, keeping ``days`` of them (see :meth:`RecordStore.retain`)."""
        if isinstance(days, bool) or not isinstance(days, int | float) or not 0 < days < math.inf:
            raise ValueError(f"retention must be a positive number of days, not {days!r}")
        try:
            cutoff = self._time_value((now or datetime.now(UTC)) - timedelta(days=days))
        except OverflowError:  # more days than the calendar has: nothing is that old
            return 0

        def retain(conn: Any) -> int:
            with self._transaction(conn, write=True) as cur:
                self._begin_write(cur)
                head, anchor = self._mark(cur, "head"), self._mark(cur, "anchor")
                cur.execute(self._sql(f"SELECT MIN(seq) FROM {TABLE} WHERE time >= ?"), (cutoff,))
                kept = cur.fetchone()[0]
                last = head.seq if kept is None else int(kept) - 1
                if last <= anchor.seq:
                    return 0
                cur.execute(self._sql(f"SELECT hash FROM {TABLE} WHERE seq = ?"), (last,))
                row = cur.fetchone()
                if row is None:
                    raise StoreUnavailableError(
                        self.kind,
                        f"the records store {self.location} lacks record {last}, the last one retention would "
                        "remove: run `explain-records verify` first",
                    )
                cur.execute(self._sql(f"DELETE FROM {TABLE} WHERE seq <= ?"), (last,))
                removed = int(cur.rowcount)
                cur.execute(
                    self._sql(f"UPDATE {CHAIN_TABLE} SET seq = ?, hash = ? WHERE name = ?"), (last, row[0], "anchor")
                )
                return removed

        return self._run(retain, "apply retention")

    def verify(self) -> Verification:
        """Walk the whole chain in one read transaction (see :meth:`RecordStore.verify`)."""

        def links(cur: Any) -> Iterator[Link]:
            cur.execute(f"SELECT {_COLUMNS} FROM {TABLE} ORDER BY seq")
            while rows := cur.fetchmany(500):
                for seq, record_id, _, body, digest, prev, hash_, erased_at in rows:
                    yield Link(int(seq), record_id, body, digest, prev, hash_, erased_at is not None)

        def verify(conn: Any) -> Verification:
            with self._transaction(conn, write=False) as cur:
                anchor, head = self._mark(cur, "anchor"), self._mark(cur, "head")
                return verify_links(links(cur), anchor, head)

        return self._run(verify, "verify its chain", idempotent=True)


__all__ = ["CHAIN_TABLE", "META_TABLE", "SCHEMA_TABLE", "TABLE", "Migration", "SqlStore", "tombstone"]
