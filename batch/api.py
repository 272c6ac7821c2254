"""The OpenAI Batch API, door-neutral: files and batches as objects in a state folder, and the routes that answer them.

Routes (:meth:`BatchApi.handle`, answered as OpenAI's API answers them): ``POST /v1/files`` (multipart,
``purpose=batch``), ``GET /v1/files/{id}``, ``GET /v1/files/{id}/content``, ``POST /v1/batches`` (``input_file_id``,
``endpoint``, ``completion_window``, ``metadata``), ``GET /v1/batches/{id}``, ``GET /v1/batches`` (``after``,
``limit``) and ``POST /v1/batches/{id}/cancel``. Each door adapts its own HTTP server to :meth:`BatchApi.handle`
(:mod:`doors.kserve.batch_routes`, :mod:`doors.torchserve.batch_door`); the jobs themselves are run by
:mod:`batch.scheduler`.

State (:class:`BatchStore`, a folder under the run folder; it survives a restart):

- ``files/<id>.json`` (the file object) beside ``files/<id>.jsonl`` (its content);
- ``batches/<id>/state.json`` (the batch object, written by this process only, atomically), ``output.jsonl`` and
  ``output.jsonl.errors.jsonl`` with the job's manifest (:mod:`batch.job`), and ``progress.json`` (the job's counts,
  written by whoever runs it).

Statuses: ``validating`` (created) → ``in_progress`` (its lines counted) → ``finalizing`` (every line answered) →
``completed`` (the output and error files registered); ``failed`` (the input cannot be read, or the job could not run:
``errors``), ``expired`` (not done within ``completion_window``), ``cancelling`` → ``cancelled``. A batch that ends
otherwise than ``completed`` keeps the lines it finished, in its output and error files.

Limits (:class:`BatchLimits`, docs/BATCH.md "The Batch API"): a file over ``max_file_bytes`` or ``max_lines`` is
refused with 413. Ids are ``file-`` or ``batch_`` and 24 hex digits; anything else (a path, ``..``) is refused with
400 before any file is touched; an unknown id is 404.
"""

from __future__ import annotations

import contextlib
import email.parser
import email.policy
import json
import os
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from .inputs import OPENAI_ROUTES

#: The routes' prefixes (a door sends every request under them to :meth:`BatchApi.handle`).
PREFIXES = ("/v1/files", "/v1/batches")
#: The completion windows accepted, in seconds (OpenAI's only one).
COMPLETION_WINDOWS = {"24h": 24 * 3600}
#: The statuses after which a batch changes no more.
TERMINAL = frozenset({"completed", "failed", "expired", "cancelled"})
#: The statuses of a batch someone still has to run (or finish): :mod:`batch.scheduler` picks them up.
ACTIVE = frozenset({"validating", "in_progress", "finalizing", "cancelling"})

_FILE_ID = re.compile(r"file-[0-9a-f]{24}")
_BATCH_ID = re.compile(r"batch_[0-9a-f]{24}")
_REST_ENDPOINT = re.compile(r"/predictions/([A-Za-z0-9][A-Za-z0-9._-]*)")
_MAX_METADATA = 16


@dataclass(frozen=True)
class BatchLimits:
    """What an input file may hold.

    Attributes:
        max_file_bytes: the most bytes of a file (the upload must also fit the door's request bound, 3 MB).
        max_lines: the most lines (requests) of a file.
    """

    max_file_bytes: int = 2_900_000
    max_lines: int = 50_000


class ApiError(Exception):
    """A refusal in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}`` with its status."""

    def __init__(self, status: int, code: str, message: str, param: str | None = None) -> None:
        """``status``: the HTTP status; ``code``: OpenAI's error code."""
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.param = param

    def to_dict(self) -> dict[str, Any]:
        """The error's JSON body."""
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class Response:
    """A route's answer: status, content type and body."""

    status: int
    body: bytes
    content_type: str = "application/json"


def _json(status: int, document: Any) -> Response:
    return Response(status, json.dumps(document, separators=(",", ":")).encode("utf-8"))


def _write_json(path: Path, document: Any) -> None:
    """Write ``document`` to ``path`` atomically (a reader sees the old or the new one, never a torn one)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps(document, separators=(",", ":")), encoding="utf-8")
    os.replace(tmp, path)


def check_id(kind: str, value: str) -> str:
    """``value`` if it is an id of ``kind`` (``file`` or ``batch``).

    Raises:
        ApiError: 400 ``invalid_id`` for anything else (a path, ``..``, another kind's id).
    """
    pattern = _FILE_ID if kind == "file" else _BATCH_ID
    if not pattern.fullmatch(value):
        raise ApiError(400, "invalid_id", f"{value!r} is not a {kind} id", f"{kind}_id")
    return value


def endpoint_model(endpoint: str) -> str | None:
    """The model of a REST endpoint (``/predictions/<model>``), ``None`` for the OpenAI endpoints.

    Raises:
        ApiError: 400 for an endpoint that is neither.
    """
    if endpoint in OPENAI_ROUTES:
        return None
    match = _REST_ENDPOINT.fullmatch(endpoint) if isinstance(endpoint, str) else None
    if match is None:
        routes = ", ".join([*OPENAI_ROUTES, "/predictions/<model>"])
        raise ApiError(400, "invalid_endpoint", f"endpoint {endpoint!r} is not one of {routes}", "endpoint")
    return match.group(1)


class BatchStore:
    """The files and batches in the state folder ``root`` (module docstring); safe to share between threads."""

    def __init__(self, root: Path, limits: BatchLimits | None = None) -> None:
        """Use (and create) ``root/files`` and ``root/batches``."""
        self.root = root
        self.limits = limits or BatchLimits()
        self.files_dir = root / "files"
        self.batches_dir = root / "batches"
        self.files_dir.mkdir(parents=True, exist_ok=True)
        self.batches_dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()

    # files

    def create_file(self, filename: str, data: bytes, purpose: str) -> dict[str, Any]:
        """Store an uploaded input file and return its file object.

        Raises:
            ApiError: 400 for a purpose other than ``batch`` or a file that is not UTF-8; 413 over the limits.
        """
        if purpose != "batch":
            raise ApiError(400, "invalid_purpose", f"purpose must be 'batch', got {purpose!r}", "purpose")
        if len(data) > self.limits.max_file_bytes:
            raise ApiError(
                413, "file_too_large", f"the file has {len(data)} bytes; at most {self.limits.max_file_bytes}", "file"
            )
        lines = sum(1 for raw in data.splitlines() if raw.strip())
        if lines > self.limits.max_lines:
            raise ApiError(
                413, "too_many_lines", f"the file has {lines} lines; at most {self.limits.max_lines}", "file"
            )
        return self._add_file(filename, data, purpose)

    def _add_file(self, filename: str, data: bytes, purpose: str, file_id: str | None = None) -> dict[str, Any]:
        file_id = file_id or f"file-{secrets.token_hex(12)}"
        document = {
            "id": file_id,
            "object": "file",
            "bytes": len(data),
            "created_at": int(time.time()),
            "expires_at": None,
            "filename": os.path.basename(filename) or "file.jsonl",
            "purpose": purpose,
            "status": "processed",
            "status_details": None,
        }
        content = self.files_dir / f"{file_id}.jsonl"
        tmp = content.with_name(f".{content.name}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, content)
        _write_json(self.files_dir / f"{file_id}.json", document)
        return document

    def get_file(self, file_id: str) -> dict[str, Any]:
        """The file object of ``file_id``.

        Raises:
            ApiError: 400 for a malformed id, 404 for an unknown one.
        """
        path = self.files_dir / f"{check_id('file', file_id)}.json"
        if not path.is_file():
            raise ApiError(404, "file_not_found", f"no file {file_id!r}", "file_id")
        document: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        return document

    def file_path(self, file_id: str) -> Path:
        """Where the content of ``file_id`` is (:meth:`get_file`'s errors)."""
        self.get_file(file_id)
        return self.files_dir / f"{file_id}.jsonl"

    # batches

    def create_batch(
        self, input_file_id: Any, endpoint: Any, completion_window: Any, metadata: Any, models: Iterable[str]
    ) -> dict[str, Any]:
        """A new batch (``validating``) of the input file's lines, for ``endpoint``; ``models`` are the door's.

        Raises:
            ApiError: 400 for a missing or malformed field, an endpoint not served (or a model the door does not
                serve), a file whose purpose is not ``batch``; 404 for an unknown file.
        """
        if not isinstance(input_file_id, str):
            raise ApiError(400, "invalid_request", "'input_file_id' must be a file id", "input_file_id")
        if self.get_file(input_file_id)["purpose"] != "batch":
            raise ApiError(400, "invalid_purpose", f"file {input_file_id!r} is not a batch input", "input_file_id")
        model = endpoint_model(endpoint)
        if model is not None and model not in set(models):
            raise ApiError(404, "model_not_found", f"no model {model!r} is served here", "endpoint")
        if completion_window not in COMPLETION_WINDOWS:
            windows = ", ".join(COMPLETION_WINDOWS)
            raise ApiError(
                400, "invalid_completion_window", f"completion_window must be {windows}", "completion_window"
            )
        if metadata is not None and not (
            isinstance(metadata, dict)
            and len(metadata) <= _MAX_METADATA
            and all(isinstance(key, str) and isinstance(value, str) for key, value in metadata.items())
        ):
            raise ApiError(400, "invalid_metadata", "metadata must be at most 16 string keys and values", "metadata")
        now = int(time.time())
        batch_id = f"batch_{secrets.token_hex(12)}"
        document: dict[str, Any] = {
            "id": batch_id,
            "object": "batch",
            "endpoint": endpoint,
            "errors": None,
            "input_file_id": input_file_id,
            "completion_window": completion_window,
            "status": "validating",
            "output_file_id": None,
            "error_file_id": None,
            "created_at": now,
            "in_progress_at": None,
            "expires_at": now + COMPLETION_WINDOWS[completion_window],
            "finalizing_at": None,
            "completed_at": None,
            "failed_at": None,
            "expired_at": None,
            "cancelling_at": None,
            "cancelled_at": None,
            "request_counts": {"total": 0, "completed": 0, "failed": 0},
            "metadata": metadata,
        }
        folder = self.batches_dir / batch_id
        folder.mkdir()
        _write_json(folder / "state.json", document)
        return document

    def batch_dir(self, batch_id: str) -> Path:
        """The folder of ``batch_id`` (:meth:`get_batch`'s errors)."""
        folder = self.batches_dir / check_id("batch", batch_id)
        if not (folder / "state.json").is_file():
            raise ApiError(404, "batch_not_found", f"no batch {batch_id!r}", "batch_id")
        return folder

    def get_batch(self, batch_id: str) -> dict[str, Any]:
        """The batch object of ``batch_id``, its ``request_counts`` as of the job's last written batch.

        Raises:
            ApiError: 400 for a malformed id, 404 for an unknown one.
        """
        folder = self.batch_dir(batch_id)
        document: dict[str, Any] = json.loads((folder / "state.json").read_text(encoding="utf-8"))
        progress = folder / "progress.json"
        if document["status"] not in TERMINAL and progress.is_file():
            with contextlib.suppress(ValueError):  # a torn read (no atomic rename): the last counts stand
                document["request_counts"] = json.loads(progress.read_text(encoding="utf-8"))
        return document

    def list_batches(self, after: str | None = None, limit: int = 20) -> dict[str, Any]:
        """OpenAI's list of batches, newest first, ``limit`` of them after the batch ``after``.

        Raises:
            ApiError: 400 for a limit outside 1..100 or a malformed ``after``.
        """
        if not 1 <= limit <= 100:
            raise ApiError(400, "invalid_limit", "limit must be between 1 and 100", "limit")
        if after is not None:
            check_id("batch", after)
        batches = [self.get_batch(folder.name) for folder in self._batch_folders()]
        batches.sort(key=lambda batch: (batch["created_at"], batch["id"]), reverse=True)
        if after is not None:
            ids = [batch["id"] for batch in batches]
            batches = batches[ids.index(after) + 1 :] if after in ids else []
        page = batches[:limit]
        return {
            "object": "list",
            "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
            "has_more": len(batches) > limit,
        }

    def active_batches(self) -> list[str]:
        """The ids of the batches still to run or finish, oldest first (:data:`ACTIVE`)."""
        batches = [self.get_batch(folder.name) for folder in self._batch_folders()]
        active = [batch for batch in batches if batch["status"] in ACTIVE]
        return [batch["id"] for batch in sorted(active, key=lambda batch: (batch["created_at"], batch["id"]))]

    def _batch_folders(self) -> list[Path]:
        return [folder for folder in self.batches_dir.iterdir() if _BATCH_ID.fullmatch(folder.name)]

    def update_batch(self, batch_id: str, change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        """Apply ``change`` to the batch object and write it (under the store's lock); returns it."""
        with self._lock:
            folder = self.batch_dir(batch_id)
            document: dict[str, Any] = json.loads((folder / "state.json").read_text(encoding="utf-8"))
            change(document)
            _write_json(folder / "state.json", document)
            return document

    def set_status(self, batch_id: str, status: str, **fields: Any) -> dict[str, Any]:
        """Move the batch to ``status`` (its ``<status>_at`` set now) with other ``fields`` changed."""

        def change(document: dict[str, Any]) -> None:
            document["status"] = status
            if f"{status}_at" in document:
                document[f"{status}_at"] = int(time.time())
            document.update(fields)

        return self.update_batch(batch_id, change)

    def cancel_batch(self, batch_id: str) -> dict[str, Any]:
        """Ask a batch to stop (``cancelling``; the runner stops between two of its batches and makes it
        ``cancelled``, its finished lines kept).

        Raises:
            ApiError: 404 for an unknown batch, 409 for one that has ended.
        """
        with self._lock:
            status = self.get_batch(batch_id)["status"]
            if status in ("cancelling", "cancelled"):
                return self.get_batch(batch_id)
            if status in TERMINAL:
                raise ApiError(409, "batch_not_cancellable", f"batch {batch_id!r} is {status}: it cannot be cancelled")
            self.set_status(batch_id, "cancelling")
            return self.get_batch(batch_id)

    def add_output_file(self, batch_id: str, kind: str, path: Path) -> str | None:
        """Register a batch's output (``kind`` ``output``) or error file as a file of purpose ``batch_output``;
        its id (``None`` when the file has no line). The id is derived from the batch's, so a finalizing batch
        resumed after a restart registers the same file again."""
        if not path.is_file() or path.stat().st_size == 0:
            return None
        digest = batch_id.removeprefix("batch_")
        file_id = f"file-{digest[:-1]}{'0' if kind == 'output' else '1'}"
        self._add_file(f"{batch_id}_{kind}.jsonl", path.read_bytes(), "batch_output", file_id)
        return file_id


class BatchApi:
    """The Batch API's routes over a :class:`BatchStore` (module docstring), for a door serving ``models``."""

    def __init__(self, store: BatchStore, models: Iterable[str], wake: Callable[[], None] | None = None) -> None:
        """Answer for the door's ``models`` (their names); ``wake()`` tells the scheduler a batch was created or
        cancelled."""
        self.store = store
        self.models = tuple(models)
        self._wake = wake or (lambda: None)

    @staticmethod
    def owns(path: str) -> bool:
        """Whether ``path`` is one of this API's routes (the door sends it to :meth:`handle`)."""
        route = urlsplit(path).path.rstrip("/")
        return any(route == prefix or route.startswith(prefix + "/") for prefix in PREFIXES)

    def handle(self, method: str, path: str, headers: Mapping[str, str], body: bytes) -> Response:
        """Answer one request of the API (``path`` with its query string); any failure in OpenAI's error shape."""
        try:
            return self._route(method, path, {name.lower(): value for name, value in headers.items()}, body)
        except ApiError as error:
            return _json(error.status, error.to_dict())

    def _route(self, method: str, path: str, headers: Mapping[str, str], body: bytes) -> Response:
        parts = urlsplit(path)
        segments = [segment for segment in parts.path.split("/") if segment][1:]  # after "v1"
        query = {name: values[-1] for name, values in parse_qs(parts.query).items()}
        route = (method, segments[0], len(segments))
        if route == ("POST", "files", 1):
            filename, data, purpose = _multipart(headers.get("content-type", ""), body)
            return _json(200, self.store.create_file(filename, data, purpose))
        if route == ("GET", "files", 2):
            return _json(200, self.store.get_file(segments[1]))
        if route == ("GET", "files", 3) and segments[2] == "content":
            return Response(200, self.store.file_path(segments[1]).read_bytes(), "application/octet-stream")
        if route == ("POST", "batches", 1):
            document = _json_body(body)
            batch = self.store.create_batch(
                document.get("input_file_id"),
                document.get("endpoint"),
                document.get("completion_window"),
                document.get("metadata"),
                self.models,
            )
            self._wake()
            return _json(200, batch)
        if route == ("GET", "batches", 1):
            try:
                limit = int(query.get("limit", "20"))
            except ValueError:
                raise ApiError(400, "invalid_limit", "limit must be an integer", "limit") from None
            return _json(200, self.store.list_batches(query.get("after"), limit))
        if route == ("GET", "batches", 2):
            return _json(200, self.store.get_batch(segments[1]))
        if route == ("POST", "batches", 3) and segments[2] == "cancel":
            batch = self.store.cancel_batch(segments[1])
            self._wake()
            return _json(200, batch)
        raise ApiError(404, "not_found", f"no route {method} {parts.path}")


def _json_body(body: bytes) -> dict[str, Any]:
    try:
        document = json.loads(body)
    except (UnicodeDecodeError, ValueError) as error:
        raise ApiError(400, "invalid_json", f"the body is not JSON: {error}") from None
    if not isinstance(document, dict):
        raise ApiError(400, "invalid_request", "the body must be a JSON object")
    return document


def _multipart(content_type: str, body: bytes) -> tuple[str, bytes, str]:
    """The upload's ``file`` (its name and bytes) and ``purpose`` fields of a ``multipart/form-data`` body.

    Raises:
        ApiError: 400 for another content type or a missing field.
    """
    if not content_type.lower().startswith("multipart/form-data"):
        raise ApiError(400, "invalid_request", "POST /v1/files takes multipart/form-data (file, purpose)")
    parser = email.parser.BytesParser(policy=email.policy.HTTP)
    message = parser.parsebytes(f"Content-Type: {content_type}\r\n\r\n".encode("latin-1") + body)
    fields: dict[str, tuple[str | None, bytes]] = {}
    for part in message.iter_parts() if message.is_multipart() else ():
        name = part.get_param("name", header="content-disposition")
        if isinstance(name, str):
            payload = part.get_payload(decode=True)
            fields[name] = (part.get_filename(), payload if isinstance(payload, bytes) else b"")
    if "file" not in fields:
        raise ApiError(400, "invalid_request", "the upload has no 'file' field", "file")
    if "purpose" not in fields:
        raise ApiError(400, "invalid_request", "the upload has no 'purpose' field", "purpose")
    filename, data = fields["file"]
    return filename or "file.jsonl", data, fields["purpose"][1].decode("utf-8", errors="replace").strip()
