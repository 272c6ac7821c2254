"""Re-explaining stored predictions: what a records store gives a batch job (``explain-batch --from-records``).

A store of answered rows (issue 36's records) hands the job a :class:`RecordsReader`: the stored inputs of one model
between two times, in its own order. :class:`RecordsQuery` makes them a job's input (``JobSpec(records=...)``): each
stored input becomes a request to the route it was answered on, its ``custom_id`` the record's id, its ``explain``
replaced by the job's, so that a job re-explains yesterday's predictions by another method. A record that cannot be
re-explained goes to the error file: one whose input was not kept (``payload_not_kept``) or that another version of the
model answered (``version_changed``: the job would explain another model than the one that predicted).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from .inputs import OPENAI_ROUTES, LineError, Request, RouteError, parse_route, unique
from .models import BatchModel


@dataclass(frozen=True)
class StoredInput:
    """One stored input.

    Attributes:
        record_id: the record's id.
        model: the model that answered it.
        model_version: that model's version when it answered (:attr:`batch.models.BatchModel.version`).
        url: the route it was answered on (``/predictions/<model>``, ``/v1/chat/completions``, ...).
        body: the request body as the route took it (``None``: the store kept only its hash, or nothing).
    """

    record_id: str
    model: str
    model_version: str
    url: str
    body: Any


class RecordsReader(Protocol):
    """What a records store implements for batch jobs."""

    def count(self, model: str, since: datetime | None, until: datetime | None) -> int:
        """How many records of ``model`` were written from ``since`` (inclusive) to ``until`` (exclusive)."""
        ...

    def inputs(self, model: str, since: datetime | None, until: datetime | None) -> Iterator[StoredInput]:
        """The stored inputs of those records, oldest first."""
        ...


@dataclass(frozen=True)
class RecordsQuery:
    """A job's input read from a records store (module docstring).

    Attributes:
        reader: the store's reader.
        model: the model whose records are re-explained (one of the job's).
        since: the first time (``None``: from the first record).
        until: the time after the last (``None``: to the last record).
        explain: the ``explain`` every re-explained body carries (``None``: the model's default method).
    """

    reader: RecordsReader
    model: str
    since: datetime | None = None
    until: datetime | None = None
    explain: Any = None

    def describe(self) -> dict[str, Any]:
        """What of the query changes the answers (for the job's manifest)."""
        return {
            "from_records": self.model,
            "since": self.since.isoformat() if self.since else None,
            "until": self.until.isoformat() if self.until else None,
            "explain": self.explain,
        }

    def count(self) -> int:
        """How many records the job reads."""
        return self.reader.count(self.model, self.since, self.until)

    def requests(self, models: Mapping[str, BatchModel]) -> Iterator[Request | LineError]:
        """The stored inputs as requests, in the store's order (module docstring)."""
        model = models[self.model]

        def items() -> Iterator[Request | LineError]:
            for number, stored in enumerate(self.reader.inputs(self.model, self.since, self.until), start=1):
                yield self._request(stored, number, model, models)

        return unique(items())

    def _request(
        self, stored: StoredInput, number: int, model: BatchModel, models: Mapping[str, BatchModel]
    ) -> Request | LineError:
        where = f"record {stored.record_id}"
        if stored.body is None:
            return LineError(
                number,
                stored.record_id,
                "payload_not_kept",
                f"{where}: its input was not kept (payload: hash or none), so it cannot be explained again",
            )
        if stored.model_version != model.version:
            return LineError(
                number,
                stored.record_id,
                "version_changed",
                f"{where} was answered by version {stored.model_version} of {stored.model}, this job "
                f"serves version {model.version}",
            )
        body = dict(stored.body) if isinstance(stored.body, Mapping) else stored.body
        url = stored.url
        if isinstance(body, dict) and url in OPENAI_ROUTES:
            body["explain"] = True if self.explain is None else self.explain
        elif isinstance(body, dict):
            body.pop("explain", None)
            if self.explain is None:  # the explanations route: the model's default method
                url = url.replace("/predictions/", "/explanations/", 1)
            else:
                body["explain"] = self.explain
        try:
            route = parse_route(url, body, models)
        except RouteError as error:
            return LineError(number, stored.record_id, error.code, f"{where}: {error.message}")
        return Request(stored.record_id, url, route, body, number)
