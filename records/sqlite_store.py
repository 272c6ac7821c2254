"""The SQLite store: the embedded default, one file (``records.sqlite3`` in the working directory, or any path).

The file is made on first use with mode 0600 (records may hold whole inputs), in WAL mode with ``synchronous=FULL``
so that a committed batch survives a crash of the machine, and a busy timeout so that the workers of a door (each
its own process, each with its own connection) take turns: every write is one ``BEGIN IMMEDIATE`` transaction.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

from .chain import GENESIS
from .errors import StoreUnavailableError
from .event import Payload, format_time
from .sql import CHAIN_TABLE, META_TABLE, TABLE, Migration, SqlStore

#: The file name of the default store, in the working directory.
DEFAULT_FILE = "records.sqlite3"
#: How long a writer waits for another process's transaction, in seconds.
BUSY_TIMEOUT_S = 30.0

MIGRATIONS = (
    Migration(
        1,
        "records, their chain marks and the store's salt",
        (
            f"CREATE TABLE {TABLE} (seq INTEGER PRIMARY KEY, id TEXT NOT NULL, model TEXT NOT NULL, "
            "time TEXT NOT NULL, body TEXT NOT NULL, body_hash TEXT NOT NULL, prev_hash TEXT NOT NULL, "
            "hash TEXT NOT NULL, erased_at TEXT)",
            f"CREATE INDEX {TABLE}_id ON {TABLE} (id)",
            f"CREATE INDEX {TABLE}_model ON {TABLE} (model, seq)",
            f"CREATE INDEX {TABLE}_time ON {TABLE} (time)",
            f"CREATE TABLE {CHAIN_TABLE} (name TEXT PRIMARY KEY, seq INTEGER NOT NULL, hash TEXT NOT NULL)",
            f"INSERT INTO {CHAIN_TABLE} (name, seq, hash) VALUES ('head', 0, '{GENESIS}'), ('anchor', 0, '{GENESIS}')",
            f"CREATE TABLE {META_TABLE} (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
        ),
    ),
)


class SqliteStore(SqlStore):
    """Records in a SQLite file.

    Attributes:
        path: The database file.
    """

    kind = "sqlite"
    migrations = MIGRATIONS
    _failures = (sqlite3.Error, OSError)

    def __init__(self, path: Path, payload: Payload = Payload.HASH, *, create: bool = True) -> None:
        """Open (with ``create``: make) the store in ``path``.

        Args:
            path: The database file.
            payload: How much of each input the store keeps.
            create: Make the file (and its folder) when missing; else a missing file is an error.

        Raises:
            StoreUnavailableError: the file is missing (without ``create``), or cannot be opened or migrated.
        """
        self.path = path
        if not path.exists():
            if not create:
                raise StoreUnavailableError(self.kind, f"no records store at {path}")
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
            except OSError as error:
                raise StoreUnavailableError(self.kind, f"cannot make the records store {path}: {error}") from error
        super().__init__(f"sqlite:///{path}", payload)

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        return conn

    @contextmanager
    def _transaction(self, conn: sqlite3.Connection, *, write: bool) -> Iterator[sqlite3.Cursor]:
        cur = conn.cursor()
        cur.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        try:
            yield cur
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        else:
            conn.execute("COMMIT")
        finally:
            cur.close()

    def _lock_chain(self, cur: Any) -> None:
        """``BEGIN IMMEDIATE`` holds the database's write lock already."""

    def _lock_schema(self, cur: Any) -> None:
        """``BEGIN IMMEDIATE`` holds the database's write lock already."""

    def _time_value(self, moment: datetime) -> str:
        return format_time(moment)


__all__ = ["DEFAULT_FILE", "MIGRATIONS", "SqliteStore"]
