"""The HTTP sink: POSTs each record as a CloudEvent in binary mode, as KServe's inference logger does, so that a
Knative broker, TrustyAI or any CloudEvents receiver can take them.

Binary mode: the context attributes are headers (``ce-specversion``, ``ce-id``, ``ce-source``, ``ce-type``,
``ce-time``, and ``ce-traceparent`` when the caller sent one), ``Content-Type`` is the ``datacontenttype``
(``application/json``), and the body is the event's ``data`` as JSON. A record counts as delivered when the receiver
answers 2xx; a connection error, a timeout, 408, 429 or 5xx is retried (:data:`ATTEMPTS` tries in all, with a short
doubling pause), another status fails at once. Each try has a bounded timeout, so a batch never waits longer than
about ``attempts * timeout`` per record.

The sink is write-only: get, list, erase, retention and verify raise :class:`~records.errors.WriteOnlyStoreError` (the
receiver keeps the events; the hash chain is a property of the SQL stores). ``hash`` payloads need a salt that
outlives the process and is the same in every worker: the sink keeps it in a file (default
``records-http.salt`` in the working directory, mode 0600), made on first use.
"""

from __future__ import annotations

import json
import os
import secrets
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, NoReturn

from .chain import Verification
from .errors import StoreUnavailableError, WriteOnlyStoreError
from .event import DATACONTENTTYPE, Payload, Record
from .store import DEFAULT_LIMIT, Page, RecordStore, StoredRecord

#: Tries per record (the first and its retries).
ATTEMPTS = 3
#: Seconds one try may take.
TIMEOUT_S = 5.0
#: Seconds before the first retry (doubled before each next one).
BACKOFF_S = 0.2
#: The salt file's name, in the working directory.
SALT_FILE = "records-http.salt"
#: The context attributes sent as ``ce-`` headers, when the event has them.
HEADER_ATTRIBUTES = ("specversion", "id", "source", "type", "time", "traceparent")
_RETRIED = {408, 429}


def read_salt(path: Path) -> str:
    """The salt kept in ``path`` (hex), made (32 random bytes, mode 0600) when the file does not exist yet.

    Raises:
        StoreUnavailableError: the file cannot be read or made.
    """
    try:
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except FileExistsError:
            pass
        else:
            with os.fdopen(fd, "w", encoding="ascii") as handle:
                handle.write(secrets.token_hex(32) + "\n")
        for _ in range(50):  # another worker may have made it an instant ago and be writing it
            salt = path.read_text(encoding="ascii").strip()
            if salt:
                bytes.fromhex(salt)
                return salt
            time.sleep(0.01)
    except (OSError, ValueError) as error:
        raise StoreUnavailableError("http", f"cannot read or make the records salt file {path}: {error}") from error
    raise StoreUnavailableError("http", f"the records salt file {path} is empty")


class HttpSink(RecordStore):
    """Delivers records to a CloudEvents receiver over HTTP(S).

    Attributes:
        url: The receiver's URL.
    """

    kind = "http"

    def __init__(
        self,
        url: str,
        payload: Payload = Payload.HASH,
        *,
        salt_file: Path,
        attempts: int = ATTEMPTS,
        timeout_s: float = TIMEOUT_S,
    ) -> None:
        """A sink for ``url``.

        Args:
            url: An ``http://`` or ``https://`` URL.
            payload: How much of each input the events carry.
            salt_file: Where the salt of ``hash`` payloads is kept.
            attempts: Tries per record (at least 1).
            timeout_s: Seconds one try may take.
        """
        if attempts < 1 or timeout_s <= 0:
            raise ValueError("the HTTP sink needs at least one attempt and a positive timeout")
        self.url = url
        self.location = url
        self.payload = payload
        self._salt_file = salt_file
        self._salt: str | None = None
        self._attempts = attempts
        self._timeout_s = timeout_s

    @property
    def salt(self) -> str:
        """The sink's salt (from its salt file)."""
        if self._salt is None:
            self._salt = read_salt(self._salt_file)
        return self._salt

    def write(self, records: Sequence[Record]) -> list[dict[str, Any]]:
        """POST each record in turn (see the module docstring); all were accepted when this returns.

        Raises:
            StoreUnavailableError: a record was not accepted after its tries (the ones before it were).
        """
        salt = self.salt if self.payload is Payload.HASH else ""
        events = [record.event_for(self.payload, salt) for record in records]
        for event in events:
            self._deliver(event)
        return events

    def _deliver(self, event: dict[str, Any]) -> None:
        headers = {f"ce-{name}": str(event[name]) for name in HEADER_ATTRIBUTES if event.get(name)}
        headers["Content-Type"] = str(event.get("datacontenttype", DATACONTENTTYPE))
        body = json.dumps(event["data"], ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        pause = BACKOFF_S
        last = ""
        for attempt in range(1, self._attempts + 1):
            request = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=self._timeout_s) as response:
                    response.read()
                return
            except urllib.error.HTTPError as error:
                last = f"answered {error.code} {error.reason}"
                if error.code < 500 and error.code not in _RETRIED:
                    break
            except (OSError, ValueError) as error:  # URLError, timeouts, refused connections
                last = f"could not be reached ({getattr(error, 'reason', error)})"
            if attempt < self._attempts:
                time.sleep(pause)
                pause *= 2
        raise StoreUnavailableError(
            self.kind, f"the records sink {self.url} {last} for record {event['id']} (tried {attempt} time(s))"
        )

    def _write_only(self, what: str) -> NoReturn:
        raise WriteOnlyStoreError(
            f"the records sink {self.url} is write-only: it cannot {what}; read the records where it delivers them"
        )

    def get(self, record_id: str) -> StoredRecord | None:
        """Not possible: raises :class:`~records.errors.WriteOnlyStoreError`."""
        self._write_only("read a record")

    def list(
        self,
        *,
        model: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int = DEFAULT_LIMIT,
        cursor: str | None = None,
    ) -> Page:
        """Not possible: raises :class:`~records.errors.WriteOnlyStoreError`."""
        self._write_only("list records")

    def erase(self, record_id: str) -> int:
        """Not possible: raises :class:`~records.errors.WriteOnlyStoreError`."""
        self._write_only("erase records")

    def retain(self, days: float, *, now: datetime | None = None) -> int:
        """Not possible: raises :class:`~records.errors.WriteOnlyStoreError`."""
        self._write_only("apply retention")

    def verify(self) -> Verification:
        """Not possible: raises :class:`~records.errors.WriteOnlyStoreError`."""
        self._write_only("verify a chain")


__all__ = ["ATTEMPTS", "BACKOFF_S", "SALT_FILE", "TIMEOUT_S", "HttpSink", "read_salt"]
