"""The service's records, read over REST: ``ExplainClient.records`` (:class:`RecordsClient`), behind the records key.

Each method is one route of the inference port (docs/RECORDS.md, "Reading records over HTTP"):
:meth:`~RecordsClient.list` (``GET /v1/records``), :meth:`~RecordsClient.get` (``GET /v1/records/{id}``),
:meth:`~RecordsClient.page` (``GET /v1/records/{id}/page``, the HTML page), :meth:`~RecordsClient.explain` (``POST
/v1/records/{id}/explain``: the stored input explained again by another method, a new record whose ``parent`` is the
id) and :meth:`~RecordsClient.erase` (``DELETE /v1/records/{id}``). A refusal raises
:class:`~explain_client.results.ServiceError` with the route's code (``unauthenticated``, ``forbidden``,
``record_not_found``, ``invalid_record_id``, ``payload_not_kept``, ``model_version_changed``, ...).

The records key is ``key_file.json``'s ``records`` entry (``{"records": {"key": ...}}``), which the launcher writes
beside TorchServe's keys; the inference key is refused (403).
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import urllib3

from .results import ServiceError


def read_records_key(key_file: str | Path) -> str | None:
    """The records key in a ``key_file.json`` (None when it has no ``records`` entry or is not JSON)."""
    try:
        document = json.loads(Path(key_file).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    entry = document.get("records") if isinstance(document, dict) else None
    key = entry.get("key") if isinstance(entry, dict) else None
    return key if isinstance(key, str) and key else None


@dataclass(frozen=True)
class RecordPage:
    """One page of records.

    Attributes:
        records: The records (CloudEvents), oldest first.
        next_cursor: The cursor of the next page, None on the last.
    """

    records: list[dict[str, Any]]
    next_cursor: str | None


@dataclass(frozen=True)
class Reexplanation:
    """A stored record explained again.

    Attributes:
        id: The new record's id.
        parent: The record explained again.
        answer: The answer document (as ``/predictions/<model>`` answers it).
    """

    id: str
    parent: str
    answer: dict[str, Any]


class RecordsClient:
    """The records routes of one service (see the module docstring).

    Args:
        url: The REST base URL (``http://127.0.0.1:8080``).
        key: The records key.
        timeout: Seconds per call (a re-explanation runs the model).
    """

    def __init__(self, url: str, key: str | None, timeout: float = 60.0) -> None:
        """Create the client (no connection is opened yet)."""
        self.url = url.rstrip("/")
        self._path = urllib.parse.urlsplit(self.url).path
        self._key = key
        self._timeout = timeout
        self._pool = urllib3.connection_from_url(self.url, maxsize=4, block=False)

    def _call(self, method: str, route: str, body: Any = None) -> tuple[bytes, str]:
        headers = {"Content-Type": "application/json"}
        if self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        try:
            response = self._pool.urlopen(
                method,
                self._path + route,
                body=None if body is None else json.dumps(body).encode("utf-8"),
                headers=headers,
                timeout=urllib3.Timeout(connect=self._timeout, read=self._timeout),
                redirect=False,
            )
        except (OSError, urllib3.exceptions.HTTPError) as error:
            raise ServiceError("unavailable", f"cannot reach {self.url}: {error}") from error
        status, data = int(response.status), bytes(response.data)
        kind = str(response.headers.get("Content-Type", ""))
        if status >= 400:
            raise _refusal(status, data)
        return data, kind

    def _json(self, method: str, route: str, body: Any = None) -> Any:
        data, _ = self._call(method, route, body)
        return json.loads(data)

    def list(
        self,
        model: str | None = None,
        since: str | None = None,
        until: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> RecordPage:
        """A page of records, oldest first.

        Args:
            model: Only this model's.
            since: Only those answered at or after this time (ISO 8601).
            until: Only those answered before this time.
            limit: The most records in the page (1 to 1000; the service's default 100).
            cursor: The ``next_cursor`` of the previous page.

        Raises:
            ServiceError: the service refused (e.g. ``unauthenticated``, ``invalid_request``).
        """
        query = {"model": model, "since": since, "until": until, "limit": limit, "cursor": cursor}
        text = urllib.parse.urlencode({name: value for name, value in query.items() if value is not None})
        document = self._json("GET", "/v1/records" + (f"?{text}" if text else ""))
        return RecordPage(list(document["data"]), document.get("next_cursor"))

    def iterate(
        self, model: str | None = None, since: str | None = None, until: str | None = None
    ) -> Iterator[dict[str, Any]]:
        """Every record (of ``model``, in the time range), page after page, oldest first."""
        cursor = None
        while True:
            page = self.list(model, since, until, 1000, cursor)
            yield from page.records
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def get(self, record_id: str) -> dict[str, Any]:
        """The record of that id (a tombstone once erased).

        Raises:
            ServiceError: ``record_not_found``, ``invalid_record_id``, or a refusal.
        """
        return dict(self._json("GET", f"/v1/records/{_quoted(record_id)}"))

    def page(self, record_id: str) -> str:
        """The record's HTML page (what ``explain --html`` draws for its answer)."""
        data, _ = self._call("GET", f"/v1/records/{_quoted(record_id)}/page")
        return data.decode("utf-8")

    def explain(self, record_id: str, method: str, **options: Any) -> Reexplanation:
        """Explain the record's stored input again by ``method`` (and its options) on the same model version.

        Raises:
            ServiceError: ``payload_not_kept``, ``model_version_changed``, ``record_not_found``, or the row's error
                (e.g. ``unknown_method``).
        """
        body = {"explain": {"method": method, **options}}
        data, _ = self._call_allowing_row_errors(f"/v1/records/{_quoted(record_id)}/explain", body)
        document = json.loads(data)
        answer = dict(document["answer"])
        if isinstance(answer.get("error"), Mapping):
            error = answer["error"]
            raise ServiceError(str(error.get("code", "internal")), str(error.get("message", "")),
                               error.get("http_status"), error.get("grpc_code"))  # fmt: skip
        return Reexplanation(str(document["id"]), str(document["parent"]), answer)

    def _call_allowing_row_errors(self, route: str, body: Any) -> tuple[bytes, str]:
        try:
            return self._call("POST", route, body)
        except _RowAnswerError as answered:
            return answered.data, "application/json"

    def erase(self, record_id: str) -> int:
        """Erase the records of that id; how many were erased now (0: none, or erased already)."""
        return int(self._json("DELETE", f"/v1/records/{_quoted(record_id)}")["erased"])

    def close(self) -> None:
        """Close the pooled connections."""
        self._pool.close()


class _RowAnswerError(ServiceError):
    """A re-explanation answered with the row's own error (its ``answer`` carries it)."""

    def __init__(self, status: int, data: bytes) -> None:
        super().__init__("row_error", "", status)
        self.data = data


def _refusal(status: int, data: bytes) -> ServiceError:
    try:
        document = json.loads(data)
    except ValueError:
        return ServiceError(f"http_{status}", data.decode("utf-8", "replace")[:500], status)
    if isinstance(document, dict) and "answer" in document:
        return _RowAnswerError(status, data)
    error = document.get("error") if isinstance(document, dict) else None
    if isinstance(error, Mapping):
        return ServiceError(str(error.get("code", f"http_{status}")), str(error.get("message", "")), status)
    return ServiceError(f"http_{status}", str(document)[:500], status)


def _quoted(record_id: str) -> str:
    return urllib.parse.quote(record_id, safe="")


__all__ = ["RecordPage", "RecordsClient", "Reexplanation", "read_records_key"]
