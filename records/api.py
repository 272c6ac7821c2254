"""The records routes of the inference port, door-neutral: read, draw, re-explain and erase stored records.

==========================================  ==========================================================================
``GET /v1/records``                         a page of records, oldest first (``model``, ``since``, ``until``,
                                            ``limit``, ``cursor``): ``{"object": "list", "data": [...],
                                            "next_cursor": ...}``
``GET /v1/records/{id}``                    one record (the stored CloudEvent; a tombstone once erased)
``GET /v1/records/{id}/page``               the record as the HTML page ``explain --html`` draws
``POST /v1/records/{id}/explain``           ``{"explain": {...}}``: the stored input (any record kept with payload
                                            ``full``, whatever door and encoding it came in) explained again by
                                            another method on the same model version; the answer is a new record
                                            whose ``parent`` is ``id``: ``{"id": <new record id>, "parent": id,
                                            "answer": {...}}``
``DELETE /v1/records/{id}``                 erase (``{"id": id, "erased": n}``)
==========================================  ==========================================================================

Every route needs the records key (``key_file.json``'s ``records`` entry, :mod:`records.keys`) as a bearer token:
no token (or an unknown one) is 401 ``unauthenticated``, the inference key is 403 ``forbidden`` (it may ask for
answers, not read what others asked). A record id that is not valid (path-like, too long) is 400
``invalid_record_id``; an unknown one 404 ``record_not_found``. A re-explanation is refused with 409
``payload_not_kept`` when the record kept only a hash of its input (or nothing, or was erased), 409
``model_version_changed`` when the model now served is another version, 404 ``model_not_found`` when the model is
not served here, 422 ``unreadable_input`` when the kept input is not a request the model's task takes (the door's
conversion, :class:`UnreadableInputError`). Errors are ``{"error": {"code", "message", "http_status"}}``.

A door adapts :class:`RecordsApi` to its server in a few lines: TorchServe's router in its ``respond`` (the
re-explanation a ``POST /predictions/<model>`` upstream), KServe's FastAPI application (the model in-process,
:mod:`doors.kserve.records_routes`). The routes hand the door the kept input as it was stored (:class:`KeptInput`: a
JSON document or bytes, with the record's task and door); the door turns it into its task's request
(:func:`serving_core.stored_input.task_document`; the KServe door's OIP rows: :mod:`doors.kserve.oip.stored`).
:meth:`RecordsApi.respond` takes the method, the path with its query, the ``Authorization`` header and the body, and
returns an :class:`ApiReply` (None for a path that is not a records route).
"""

from __future__ import annotations

import binascii
import hmac
import html
import json
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from .errors import InvalidRecordIdError, RecordsError, StoreUnavailableError, WriteOnlyStoreError
from .event import parse_time, recorded_input
from .ids import check_record_id
from .store import DEFAULT_LIMIT, RecordStore, StoredRecord

#: The prefix of every records route.
PREFIX = "/v1/records"


@dataclass(frozen=True)
class ApiReply:
    """What a records route answers.

    Attributes:
        status: The HTTP status.
        body: The body's bytes.
        content_type: Its media type.
    """

    status: int
    body: bytes
    content_type: str = "application/json"

    def json(self) -> Any:
        """The body as JSON."""
        return json.loads(self.body)


@dataclass(frozen=True)
class Reexplained:
    """A door's answer to a re-explanation.

    Attributes:
        record_id: The id of the new record (whose ``parent`` is the re-explained record).
        answer: The answer document (a failed row: ``{"error": {...}}``).
    """

    record_id: str
    answer: Mapping[str, Any]


@dataclass(frozen=True)
class KeptInput:
    """A stored input to explain again, as the record kept it.

    Attributes:
        model: The model that answered it (served here, at the record's version).
        task: The record's task (``data.task``).
        door: The door that recorded it (``data.door``: ``torchserve``, ``kserve``, ``ray``).
        input: The input: a JSON document (a TorchServe REST body, a KServe v1 instance, a generation document, or
            the OIP request of one row) or bytes (a raw image or text body, a serialized ``ExplainRequest``).
        explain: The ``explain`` to answer it with.
        parent: The re-explained record's id (the new record's ``parent``).
    """

    model: str
    task: str
    door: str
    input: Mapping[str, Any] | bytes
    explain: Mapping[str, Any]
    parent: str


class UnreadableInputError(ValueError):
    """A kept input that cannot be turned into a request of its model's task (answered 422 ``unreadable_input``)."""


#: How a door explains a stored input again: it turns the :class:`KeptInput` into its task's request (its
#: ``explain`` the given one), answers it as its REST route would, and records the row with the input's ``parent``.
#: It raises :class:`UnreadableInputError` for an input it cannot turn into a request.
Reexplain = Callable[[KeptInput], Reexplained]

#: How a door reads a stored input as its task's JSON document, given the model, the task and the input as kept (what
#: :class:`Reexplain` sends, without ``explain``): a record's page draws that document's text or image. It raises
#: :class:`UnreadableInputError` for an input it cannot read (the page then says the input's size).
ReadInput = Callable[[str, str, "Mapping[str, Any] | bytes"], Mapping[str, Any]]


class ApiError(Exception):
    """A records request refused.

    Attributes:
        code: The error's code (``invalid_record_id``, ``record_not_found``, ...).
        status: The HTTP status.
        message: What was wrong.
    """

    def __init__(self, code: str, status: int, message: str) -> None:
        """Create the error."""
        super().__init__(f"{code}: {message}")
        self.code = code
        self.status = status
        self.message = message

    def reply(self) -> ApiReply:
        """The error as a reply."""
        return _json(self.status, {"error": {"code": self.code, "message": self.message, "http_status": self.status}})


def _json(status: int, document: Any) -> ApiReply:
    return ApiReply(status, json.dumps(document, ensure_ascii=False).encode("utf-8"))


def is_records_path(path: str) -> bool:
    """Whether ``path`` (with or without its query) is one of the records routes' paths."""
    route = urlsplit(path).path
    return route == PREFIX or route.startswith(PREFIX + "/")


def bearer(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (None when there is none)."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


class RecordsApi:
    """The records routes over one store (see the module docstring).

    Attributes:
        store: The store read (and erased) through.
    """

    def __init__(
        self,
        store: RecordStore,
        *,
        key: str,
        inference_keys: Collection[str] = (),
        versions: Mapping[str, str | None] | None = None,
        reexplain: Reexplain | None = None,
        read_input: ReadInput | None = None,
    ) -> None:
        """The routes over ``store``.

        Args:
            store: The records store (a SQL store: the HTTP sink cannot be read).
            key: The records key every request must bring.
            inference_keys: The inference keys (answered 403, not 401).
            versions: The models served here and their versions (None when the door does not know them).
            reexplain: How the door explains a stored input again (None: re-explanation is not offered).
            read_input: How the door reads a stored input as its task's document, for a record's page (None: the
                page draws a JSON input as it is, and says the size of a raw one).
        """
        if not key:
            raise ValueError("the records routes need a records key")
        self.store = store
        self._key = key
        self._inference_keys = tuple(inference_keys)
        self._versions = versions
        self._reexplain = reexplain
        self._read_input = read_input

    def respond(self, method: str, target: str, authorization: str | None, body: bytes = b"") -> ApiReply | None:
        """Answer a records request.

        Args:
            method: The HTTP method.
            target: The path with its query (``/v1/records?model=sentiment``).
            authorization: The ``Authorization`` header.
            body: The request body.

        Returns:
            The reply; None when ``target`` is not a records route (the door answers it as before).
        """
        if not is_records_path(target):
            return None
        try:
            self._check_key(authorization)
            return self._route(method.upper(), target, body)
        except ApiError as error:
            return error.reply()
        except WriteOnlyStoreError as error:
            return ApiError("records_not_readable", 501, str(error)).reply()
        except StoreUnavailableError as error:
            return ApiError("records_unavailable", 503, str(error)).reply()

    def _check_key(self, authorization: str | None) -> None:
        token = bearer(authorization)
        if token is not None and hmac.compare_digest(token.encode(), self._key.encode()):
            return
        if token is not None and any(hmac.compare_digest(token.encode(), key.encode()) for key in self._inference_keys):
            raise ApiError("forbidden", 403, "the inference key cannot read records: send the records key")
        raise ApiError(
            "unauthenticated", 401, "send the records key (key_file.json, 'records') as 'Authorization: Bearer <key>'"
        )

    def _route(self, method: str, target: str, body: bytes) -> ApiReply:
        parts = urlsplit(target)
        rest = parts.path[len(PREFIX) :].strip("/")
        if not rest:
            if method != "GET":
                raise ApiError("method_not_allowed", 405, f"{method} {PREFIX}: use GET")
            return self._list(parts.query)
        segments = rest.split("/")
        record_id = _record_id(segments[0])
        action = "/".join(segments[1:])
        if action == "" and method == "GET":
            return _json(200, self._get(record_id).event)
        if action == "" and method == "DELETE":
            return _json(200, {"id": record_id, "erased": self.store.erase(record_id)})
        if action == "page" and method == "GET":
            page = record_page(self._get(record_id), self._read_input)
            return ApiReply(200, page.encode("utf-8"), "text/html; charset=utf-8")
        if action == "explain" and method == "POST":
            return self._explain(record_id, body)
        if action in ("", "page", "explain"):
            raise ApiError("method_not_allowed", 405, f"{method} is not a method of {parts.path}")
        raise ApiError("invalid_record_id", 400, f"{parts.path} is not a records route: a record id has no '/'")

    def _get(self, record_id: str) -> StoredRecord:
        stored = self.store.get(record_id)
        if stored is None:
            raise ApiError("record_not_found", 404, f"no record {record_id!r}")
        return stored

    def _list(self, query: str) -> ApiReply:
        params = {name: values[-1] for name, values in parse_qs(query, keep_blank_values=True).items()}
        unknown = sorted(set(params) - {"model", "since", "until", "limit", "cursor"})
        if unknown:
            raise ApiError("invalid_request", 400, f"unknown parameter(s) {', '.join(unknown)}")
        try:
            since = parse_time(params["since"]) if params.get("since") else None
            until = parse_time(params["until"]) if params.get("until") else None
            limit_text = params.get("limit") or str(DEFAULT_LIMIT)
            if not limit_text.isdigit():
                raise ValueError(f"limit must be an integer, not {limit_text[:20]!r}")
            page = self.store.list(
                model=params.get("model") or None,
                since=since,
                until=until,
                limit=int(limit_text),
                cursor=params.get("cursor") or None,
            )
        except ValueError as error:
            raise ApiError("invalid_request", 400, str(error)) from None
        return _json(
            200, {"object": "list", "data": [stored.event for stored in page.records], "next_cursor": page.next_cursor}
        )

    def _explain(self, record_id: str, body: bytes) -> ApiReply:
        if self._reexplain is None:
            raise ApiError("method_not_allowed", 405, "this door does not explain stored records again")
        try:
            request = json.loads(body or b"{}")
        except ValueError as error:
            raise ApiError("invalid_json", 400, f"the body is not JSON: {error}") from None
        explain = request.get("explain") if isinstance(request, dict) else None
        if not isinstance(explain, dict) or not isinstance(explain.get("method"), str):
            raise ApiError("invalid_request", 400, 'send {"explain": {"method": "<method>", ...}}')
        unknown = sorted(set(request) - {"explain"})
        if unknown:
            raise ApiError("invalid_request", 400, f"unknown field(s) {', '.join(unknown)}; send only 'explain'")
        stored = self._get(record_id)
        data = stored.event.get("data") or {}
        try:
            kept = None if stored.erased else recorded_input(stored.event)
        except (binascii.Error, ValueError, TypeError) as error:
            raise ApiError(
                "unreadable_input", 422, f"record {record_id!r}: its kept input is corrupt: {error}"
            ) from None
        if kept is None:
            mode = ((data.get("input") or {}).get("payload")) if not stored.erased else "erased"
            raise ApiError(
                "payload_not_kept", 409, f"record {record_id!r} did not keep its input (payload: {mode}); "
                "only records kept with payload full can be explained again",
            )  # fmt: skip
        model = str((data.get("model") or {}).get("name") or stored.model)
        recorded_version = (data.get("model") or {}).get("version")
        if self._versions is not None and model not in self._versions:
            raise ApiError("model_not_found", 404, f"model {model!r} is not served here")
        served = self._versions.get(model) if self._versions is not None else None
        if served != recorded_version:
            raise ApiError(
                "model_version_changed", 409,
                f"record {record_id!r} was answered by {model} version {recorded_version}; {served} is served now",
            )  # fmt: skip
        given = KeptInput(model, str(data.get("task") or ""), str(data.get("door") or ""), kept, explain, record_id)
        try:
            done = self._reexplain(given)
        except UnreadableInputError as error:
            raise ApiError(
                "unreadable_input", 422, f"record {record_id!r}: its input cannot be explained again: {error}"
            ) from None
        failed = done.answer.get("error")
        status = int(failed.get("http_status", 500)) if isinstance(failed, Mapping) else 200
        return _json(status, {"id": done.record_id, "parent": record_id, "answer": dict(done.answer)})


def _record_id(segment: str) -> str:
    try:
        return check_record_id(unquote(segment))
    except InvalidRecordIdError as error:
        raise ApiError("invalid_record_id", 400, str(error)) from None


def _input_text(document: Mapping[str, Any] | bytes | None, kept: Mapping[str, Any]) -> str:
    if isinstance(document, Mapping):
        for name in ("text", "prompt", "inputs"):
            value = document.get(name)
            if isinstance(value, str):
                return value
        messages = document.get("messages")
        if isinstance(messages, list):
            return "\n".join(str(m.get("content", "")) for m in messages if isinstance(m, Mapping))
        return json.dumps(document, ensure_ascii=False)[:2000]
    if isinstance(document, bytes):
        return f"(an input of {len(document)} bytes)"
    return f"(the input was not kept: payload {kept.get('payload', 'none')})"


def _page_input(stored: StoredRecord, read_input: ReadInput | None) -> Mapping[str, Any] | bytes | None:
    """A record's kept input for its page: as the door reads it where it can, else as it was kept (None: not kept or
    corrupt)."""
    data = stored.event.get("data") or {}
    try:
        document = recorded_input(stored.event)
    except (binascii.Error, ValueError, TypeError):
        return None
    if document is None or read_input is None:
        return document
    model = str((data.get("model") or {}).get("name") or stored.model)
    try:
        return read_input(model, str(data.get("task") or ""), document)
    except UnreadableInputError:
        return document


def record_page(stored: StoredRecord, read_input: ReadInput | None = None) -> str:
    """The HTML page of a record: what ``explain --html`` draws for its answer (text heatmap, image patches,
    entities, generated steps with citations), titled with the record's id, model and time.

    Args:
        stored: The stored record.
        read_input: How the door reads a stored input as its task's document (a raw image or text body, a gRPC
            row's ``ExplainRequest``, an OIP row): its text or image is drawn; None, or an input it cannot read: a
            JSON input is drawn as it is, a raw one as its size.

    Returns:
        The HTML document.
    """
    event = stored.event
    data = event.get("data") or {}
    title = f"record {stored.id}: {stored.model}, {stored.time}"
    if stored.erased:
        erased_at = html.escape(str(data.get("erased_at")))
        return (
            f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title></head>'
            f"<body><h1>{html.escape(title)}</h1><p>erased at {erased_at}</p></body></html>"
        )
    kept = data.get("input") or {}
    document = _page_input(stored, read_input)
    text = _input_text(document, kept)
    answer: dict[str, Any] = dict(data.get("prediction") or {})
    if data.get("explanation") is not None:
        answer["explanation"] = data["explanation"]
    if data.get("error") is not None:
        answer = {"error": data["error"]}
    from explain_client.results import Prediction, ServiceError

    if data.get("task") == "generation":
        from explain_client.generation import Generation
        from explain_client.generation_render import html_generation_page

        generated: Any
        try:
            generated = Generation.from_dict(answer)
        except (ServiceError, RecordsError, KeyError, TypeError, ValueError) as error:
            generated = error
        return html_generation_page([(text, generated)], title)
    from explain_client.render import html_page

    result: Any
    try:
        result = Prediction.from_dict(answer)
    except (ServiceError, KeyError, TypeError, ValueError) as error:
        result = error
    image = None
    if isinstance(document, Mapping) and isinstance(document.get("image"), str):
        import base64
        import binascii

        try:
            image = base64.b64decode(document["image"], validate=True)
        except (binascii.Error, ValueError):
            image = None
        text = "(image)"
    return html_page([(text, [result])], title, [image])


__all__ = [
    "PREFIX",
    "ApiError",
    "ApiReply",
    "KeptInput",
    "ReadInput",
    "RecordsApi",
    "Reexplain",
    "Reexplained",
    "UnreadableInputError",
    "bearer",
    "is_records_path",
    "record_page",
]
