"""The PostgreSQL store (production): the tables of :mod:`records.sql` in one database, reached with psycopg 3.

``postgresql://user:password@host:port/database`` (any libpq URL or its parameters, e.g. ``?sslmode=require``).
The schema is versioned (``explain_records_schema``) and migrated when a store is opened, under a transaction-level
advisory lock so that workers starting together apply each step once. A write holds the ``head`` row of
``explain_records_chain`` ``FOR UPDATE``: the chain is appended to by one transaction at a time, whichever worker or
machine writes. ``time`` and ``erased_at`` are ``timestamptz`` (an operator's own SQL can compare them with
``now()``); the body is the canonical JSON as text, so the chain hashes exactly what is stored.

psycopg is the ``records`` extra (``pip install 'transformer-explain-service[records]'``; ``make extras``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from .chain import GENESIS
from .errors import StoreUnavailableError
from .event import Payload
from .sql import CHAIN_TABLE, META_TABLE, TABLE, Migration, SqlStore

#: Seconds to wait for the server when connecting.
CONNECT_TIMEOUT_S = 10
#: The advisory lock key migrations hold (any fixed 64-bit number; this one spells "records").
MIGRATION_LOCK = 0x7265636F726473

MIGRATIONS = (
    Migration(
        1,
        "records, their chain marks and the store's salt",
        (
            f"CREATE TABLE {TABLE} (seq BIGINT PRIMARY KEY, id TEXT NOT NULL, model TEXT NOT NULL, "
            "time TIMESTAMPTZ NOT NULL, body TEXT NOT NULL, body_hash TEXT NOT NULL, prev_hash TEXT NOT NULL, "
            "hash TEXT NOT NULL, erased_at TIMESTAMPTZ)",
            f"CREATE INDEX {TABLE}_id ON {TABLE} (id)",
            f"CREATE INDEX {TABLE}_model ON {TABLE} (model, seq)",
            f"CREATE INDEX {TABLE}_time ON {TABLE} (time)",
            f"CREATE TABLE {CHAIN_TABLE} (name TEXT PRIMARY KEY, seq BIGINT NOT NULL, hash TEXT NOT NULL)",
            f"INSERT INTO {CHAIN_TABLE} (name, seq, hash) VALUES ('head', 0, '{GENESIS}'), ('anchor', 0, '{GENESIS}')",
            f"CREATE TABLE {META_TABLE} (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
        ),
    ),
)


def redacted(url: str) -> str:
    """``url`` with its password (in the user part or a ``password=`` parameter) replaced by ``***``, for messages."""
    parts = urlsplit(url)
    if parts.password is not None:
        host = parts.hostname or ""
        netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
        parts = parts._replace(netloc=netloc)
    if parts.query:
        query = [(key, "***" if key == "password" else value) for key, value in parse_qsl(parts.query, True)]
        parts = parts._replace(query=urlencode(query, safe="*"))
    return urlunsplit(parts)


class PostgresStore(SqlStore):
    """Records in a PostgreSQL database."""

    kind = "postgresql"
    migrations = MIGRATIONS

    def __init__(self, url: str, payload: Payload = Payload.HASH) -> None:
        """Connect to the database of ``url`` and migrate its schema.

        Args:
            url: A ``postgresql://`` URL.
            payload: How much of each input the store keeps.

        Raises:
            StoreUnavailableError: psycopg is not installed, or the server cannot be reached or migrated.
        """
        try:
            import psycopg
        except ImportError as error:
            raise StoreUnavailableError(
                self.kind,
                "the PostgreSQL records store needs psycopg: pip install 'transformer-explain-service[records]'",
            ) from error
        self._psycopg = psycopg
        self._failures = (psycopg.Error, OSError)
        self._url = url
        super().__init__(redacted(url), payload)

    def _connect(self) -> Any:
        return self._psycopg.connect(self._url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S)

    @contextmanager
    def _transaction(self, conn: Any, *, write: bool) -> Iterator[Any]:
        with conn.transaction(), conn.cursor() as cur:
            if not write:
                cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            yield cur

    def _lock_chain(self, cur: Any) -> None:
        cur.execute(f"SELECT seq FROM {CHAIN_TABLE} WHERE name = 'head' FOR UPDATE")

    def _lock_schema(self, cur: Any) -> None:
        cur.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))

    def _time_value(self, moment: datetime) -> datetime:
        return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)

    def _sql(self, query: str) -> str:
        return query.replace("?", "%s")


__all__ = ["MIGRATIONS", "PostgresStore", "redacted"]
