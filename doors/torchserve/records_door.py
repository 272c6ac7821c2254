"""The records routes on TorchServe's door, answered by the router (:mod:`doors.torchserve.router`) in front of
TorchServe: ``/v1/records`` and its sub-routes (:mod:`records.api`), when the deployment keeps records
(``EXPLAIN_RECORDS``).

The records key and the inference key are read from the run folder's ``key_file.json`` at each request (TorchServe
writes the file when it starts, and again when its keys are renewed; the ``records`` entry is added when missing,
:func:`records.keys.ensure_records_key`). A re-explanation is a ``POST /predictions/<model>`` to TorchServe with the
stored input as its task's JSON document, whatever it came in as (a REST body, a raw image or text body, a gRPC row's
serialized ``ExplainRequest``: :func:`serving_core.stored_input.task_document`), its ``explain`` replaced, the inference
key, a new ``X-Request-Id`` and the re-explained record's id in ``X-Explain-Parent``: the handler answers it as any
request and records the row with that ``parent`` (:func:`serving_core.recording.record_batch`). The models' versions are
given on the router's command line (``--model-version NAME=VERSION``, the archives' fingerprints).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

from forwarding import Reply, Upstream
from records import new_request_id, open_store, records_settings
from records.api import KeptInput, RecordsApi, Reexplained, is_records_path
from records.keys import ensure_records_key, inference_key, records_key
from records.store import RecordStore
from serving_core.recording import REQUEST_ID_HEADER
from serving_core.stored_input import task_document

logger = logging.getLogger(__name__)

#: The header that names the record a request explains again (the handler records it as the row's ``parent``).
PARENT_HEADER = "X-Explain-Parent"


class RecordsRoutes:
    """The records routes of the router (see the module docstring)."""

    def __init__(
        self,
        key_file: Path,
        versions: Mapping[str, str | None] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        """The routes for the deployment's store (none when it keeps no records: :meth:`respond` then answers
        nothing).

        Args:
            key_file: The run folder's ``key_file.json``.
            versions: The served models' versions (None: not checked).
            environ: The environment (default ``os.environ``).

        Raises:
            SettingsError: the ``EXPLAIN_RECORDS*`` settings are not usable.
        """
        self.settings = records_settings(None, environ, "EXPLAIN_RECORDS")
        self._key_file = key_file
        self._versions = dict(versions) if versions is not None else None
        self._store: RecordStore | None = None
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        """Whether the deployment keeps records (and so has these routes)."""
        return self.settings is not None

    def _opened(self) -> RecordStore:
        assert self.settings is not None
        with self._lock:
            if self._store is None:
                self._store = open_store(self.settings.store, self.settings.payload)
            return self._store

    def respond(
        self, method: str, path: str, authorization: str | None, body: bytes, upstream: Upstream
    ) -> Reply | None:
        """The answer to a records request; None for any other request (or when records are off).

        Raises:
            StoreUnavailableError: the store cannot be opened (the forwarder answers it as an error).
        """
        if not self.enabled or not is_records_path(path):
            return None
        key = records_key(self._key_file) or ensure_records_key(self._key_file)
        inference = inference_key(self._key_file)

        def reexplain(kept: KeptInput) -> Reexplained:
            document = {**task_document(kept.input, kept.task), "explain": dict(kept.explain)}
            request = new_request_id()
            headers = {"Content-Type": "application/json", REQUEST_ID_HEADER: request, PARENT_HEADER: kept.parent}
            if inference is not None:
                headers["Authorization"] = f"Bearer {inference}"
            response, payload = upstream.request(
                "POST", f"/predictions/{quote(kept.model, safe='')}", json.dumps(document).encode("utf-8"), headers
            )
            return Reexplained(request, _answer(response.status, payload))

        def read_input(model: str, task: str, kept: Mapping[str, Any] | bytes) -> Mapping[str, Any]:
            return task_document(kept, task)

        api = RecordsApi(self._opened(), key=key, inference_keys=[inference] if inference else [],
                         versions=self._versions, reexplain=reexplain, read_input=read_input)  # fmt: skip
        reply = api.respond(method, path, authorization, body)
        return None if reply is None else Reply(reply.status, reply.body, reply.content_type)


def _answer(status: int, payload: bytes) -> dict[str, Any]:
    """TorchServe's answer as a row's answer document (a non-JSON or non-row error as an ``internal`` error)."""
    try:
        document = json.loads(payload)
    except ValueError:
        document = None
    if isinstance(document, dict) and (status == 200 or isinstance(document.get("error"), Mapping)):
        return document
    message = payload.decode("utf-8", "replace")[:500]
    return {"error": {"code": "internal", "http_status": status if status >= 400 else 500, "grpc_code": "INTERNAL",
                      "message": f"TorchServe answered {status}: {message}"}}  # fmt: skip


def parse_versions(entries: list[str]) -> dict[str, str | None] | None:
    """``--model-version NAME=VERSION`` entries as a mapping (``NAME=`` : a model without a version); None when none
    is given (versions not checked).

    Raises:
        ValueError: an entry without ``=``.
    """
    if not entries:
        return None
    versions: dict[str, str | None] = {}
    for entry in entries:
        name, sep, version = entry.partition("=")
        if not sep or not name:
            raise ValueError(f"--model-version {entry!r}: write NAME=VERSION")
        versions[name] = version or None
    return versions


__all__ = ["PARENT_HEADER", "RecordsRoutes", "parse_versions"]
