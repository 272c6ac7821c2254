"""Open a records store from its URL.

======================================  ==============================================================
``sqlite``                              ``records.sqlite3`` in the working directory (``EXPLAIN_WORKDIR``)
``sqlite:///abs/path.sqlite3``          that file (``sqlite:relative/path`` is under the working directory)
``postgresql://user:pw@host:5432/db``   a PostgreSQL database (also ``postgres://``; any libpq URL)
``http://host/path``, ``https://...``   the write-only HTTP sink (CloudEvents binary mode)
======================================  ==============================================================

:func:`parse_store_url` checks a URL without opening anything (what settings parsing calls);
:func:`open_store` opens it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from supervise.workdir import workdir

from .errors import StoreUrlError
from .event import Payload
from .http_sink import ATTEMPTS, SALT_FILE, TIMEOUT_S, HttpSink
from .sqlite_store import DEFAULT_FILE
from .store import RecordStore

#: The URL forms, for error messages.
URL_FORMS = "sqlite, sqlite:///path, postgresql://user@host/database or http(s)://host/path"


@dataclass(frozen=True)
class StoreUrl:
    """A parsed store URL.

    Attributes:
        kind: ``sqlite``, ``postgresql`` or ``http``.
        url: The URL as given (stripped).
        path: The SQLite file (relative paths are under the working directory when opened), else None.
    """

    kind: str
    url: str
    path: Path | None = None

    def sqlite_path(self) -> Path:
        """The SQLite file, relative paths resolved under the working directory (read when called)."""
        assert self.path is not None
        path = self.path.expanduser()
        return path if path.is_absolute() else workdir() / path


def parse_store_url(url: str) -> StoreUrl:
    """Check a store URL and say which store it names.

    Args:
        url: The URL (see the module docstring).

    Returns:
        The :class:`StoreUrl`.

    Raises:
        StoreUrlError: the URL names no store, or lacks what its store needs (one message with the forms).
    """
    if not isinstance(url, str) or not url.strip():
        raise StoreUrlError(f"a records store must be a URL: {URL_FORMS}")
    text = url.strip()
    if text == "sqlite":
        return StoreUrl("sqlite", text, Path(DEFAULT_FILE))
    scheme = text.split(":", 1)[0].lower() if ":" in text else ""
    if scheme == "sqlite":
        rest = text[len("sqlite:") :]
        if rest.startswith("//"):
            if not rest.startswith("///"):
                raise StoreUrlError(f"records store {text!r}: a sqlite URL has no host; use sqlite:///absolute/path")
            rest = rest[2:]
        if "?" in rest or "#" in rest or not rest.strip("/"):
            raise StoreUrlError(f"records store {text!r}: give the SQLite file, e.g. sqlite:///srv/records.sqlite3")
        return StoreUrl("sqlite", text, Path(rest))
    if scheme in ("postgresql", "postgres"):
        parts = urlsplit(text)
        if not parts.netloc and not parts.path.strip("/") and not parts.query:
            raise StoreUrlError(f"records store {text!r}: name the server or database, e.g. postgresql://user@host/db")
        try:
            parts.port  # noqa: B018 (a bad port raises here)
        except ValueError as error:
            raise StoreUrlError(f"records store {text!r}: {error}") from None
        return StoreUrl("postgresql", text)
    if scheme in ("http", "https"):
        parts = urlsplit(text)
        try:
            parts.port  # noqa: B018 (a bad port raises here)
        except ValueError as error:
            raise StoreUrlError(f"records store {text!r}: {error}") from None
        if not parts.hostname:
            raise StoreUrlError(f"records store {text!r}: an HTTP sink URL needs a host, e.g. http://broker:8080/")
        return StoreUrl("http", text)
    raise StoreUrlError(f"records store {text!r} is not a store URL: use {URL_FORMS}")


def open_store(
    url: str,
    payload: Payload | str = Payload.HASH,
    *,
    create: bool = True,
    salt_file: Path | None = None,
    attempts: int = ATTEMPTS,
    timeout_s: float = TIMEOUT_S,
) -> RecordStore:
    """Open the store a URL names.

    Args:
        url: The store's URL (see the module docstring).
        payload: How much of each input the store keeps: ``full``, ``hash`` (the default) or ``none``.
        create: For SQLite: make the file when it is missing (readers pass False: a missing file is an error).
        salt_file: For the HTTP sink: where its salt is kept (default ``records-http.salt`` in the working
            directory).
        attempts: For the HTTP sink: tries per record.
        timeout_s: For the HTTP sink: seconds one try may take.

    Returns:
        The open store.

    Raises:
        StoreUrlError: the URL names no store.
        SettingsError: the payload is not full, hash or none.
        StoreUnavailableError: the store cannot be opened.
    """
    location = parse_store_url(url)
    mode = Payload.parse(payload)
    if location.kind == "sqlite":
        from .sqlite_store import SqliteStore

        return SqliteStore(location.sqlite_path(), mode, create=create)
    if location.kind == "postgresql":
        from .postgres_store import PostgresStore

        return PostgresStore(location.url, mode)
    return HttpSink(
        location.url, mode, salt_file=salt_file or workdir() / SALT_FILE, attempts=attempts, timeout_s=timeout_s
    )


__all__ = ["URL_FORMS", "StoreUrl", "open_store", "parse_store_url"]
