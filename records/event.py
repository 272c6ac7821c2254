"""The record: one CloudEvents 1.0 event per answered row, errors included.

The envelope (CloudEvents 1.0 context attributes):

- ``specversion`` ``1.0``; ``id`` the row's record id (:func:`records.ids.row_id`: the request id, plus ``-<index>``
  for each row of a multi-row request); ``source`` ``/doors/<door>/models/<model>``; ``type``
  :data:`RECORD_TYPE`; ``time`` when the row was answered (RFC 3339, UTC, microseconds); ``datacontenttype``
  ``application/json``; and ``traceparent`` (the distributed-tracing extension) when the caller sent one.

The data (what a reviewer needs): ``model`` (``name``, and ``version``: the archive's fingerprint), ``task``,
``door``, ``method`` and ``options`` (of the explanation, or those asked for when the row failed; ``null`` and ``{}``
for a prediction), ``traceparent``, ``parent`` (the record id a re-explanation derives from), ``prediction`` (the
answer without its explanation and error; ``null`` on an error), ``explanation`` (as answered), ``error`` (the
answer's error object: ``code``, ``http_status``, ``grpc_code``, ``message``), ``timings`` (seconds, as the door
measured them), and ``input`` by the store's payload mode (:class:`Payload`):

- ``full``: ``{"payload": "full", "document": {...}}`` (a JSON request), or ``{"payload": "full", "base64": "..."}``
  (raw bytes);
- ``hash``: ``{"payload": "hash", "sha256": "..."}``, the SHA-256 of the store's salt (32 random bytes, kept in the
  store) followed by the input (a document as its canonical JSON, see :func:`canonical_json`; bytes as they are):
  with the salt, the input a caller claims was sent can be checked (:func:`input_matches`), without the store
  keeping it;
- ``none``: ``{"payload": "none"}``.

:func:`build_record` makes a :class:`Record` from what a door has; the store completes the ``input`` by its own
payload mode and salt when it writes (:meth:`Record.event_for`); :func:`recorded_input` reads a ``full`` input back
(to explain a stored prediction again).
"""

from __future__ import annotations

import base64
import enum
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from .errors import RecordsError, SettingsError
from .ids import check_record_id, check_request_id, row_id

#: The CloudEvents version of every record.
SPECVERSION = "1.0"
#: The CloudEvents ``type`` of every record.
RECORD_TYPE = "org.explain.prediction.v1"
#: The CloudEvents ``datacontenttype`` of every record.
DATACONTENTTYPE = "application/json"

#: What a record's input may be: a JSON document, or the raw bytes the door received.
Input = Mapping[str, Any] | bytes | None


class Payload(enum.Enum):
    """How much of a row's input a record keeps."""

    FULL = "full"
    HASH = "hash"
    NONE = "none"

    @classmethod
    def parse(cls, value: object) -> Payload:
        """The mode named by ``value`` (a :class:`Payload` or its name).

        Raises:
            SettingsError: ``value`` is not ``full``, ``hash`` or ``none``.
        """
        if isinstance(value, Payload):
            return value
        if isinstance(value, str):
            for mode in cls:
                if value.strip().lower() == mode.value:
                    return mode
        raise SettingsError(f"payload {value!r} is not one of full, hash, none")


def canonical_json(value: Any) -> str:
    """The canonical JSON text of ``value``: keys sorted, no spaces, UTF-8 characters as they are, no NaN.

    Raises:
        RecordsError: ``value`` is not JSON-able (an object, a NaN or an infinity).
    """
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise RecordsError(f"a record must be JSON: {error}") from error


def format_time(moment: datetime) -> str:
    """``moment`` as a record's ``time``: RFC 3339 in UTC with microseconds, e.g. ``2026-12-04T19:04:24.123456Z``.

    A naive ``moment`` is taken as UTC.
    """
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: str) -> datetime:
    """An ISO 8601 date or time (``2026-12-04``, ``2026-12-04T19:04``, ``...Z``, ``...+01:00``) as an aware UTC
    datetime; one without a zone is UTC.

    Raises:
        ValueError: ``text`` is not an ISO 8601 date or time.
    """
    value = text.strip()
    try:
        moment = datetime.fromisoformat(value[:-1] + "+00:00" if value.endswith(("Z", "z")) else value)
    except ValueError:
        raise ValueError(
            f"{text!r} is not an ISO 8601 date or time (e.g. 2026-12-04 or 2026-12-04T19:04:00Z)"
        ) from None
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def input_bytes(content: Mapping[str, Any] | bytes) -> bytes:
    """The bytes a hash covers: a document's canonical JSON (UTF-8), or the bytes as they are."""
    return bytes(content) if isinstance(content, bytes | bytearray) else canonical_json(content).encode("utf-8")


def input_digest(content: Mapping[str, Any] | bytes, salt: str) -> str:
    """The salted SHA-256 (hex) a ``hash`` record keeps of ``content``.

    Args:
        content: The input document or bytes.
        salt: The store's salt (hex).

    Returns:
        ``sha256(salt bytes + input bytes)`` in hex.
    """
    return hashlib.sha256(bytes.fromhex(salt) + input_bytes(content)).hexdigest()


def input_matches(event: Mapping[str, Any], content: Mapping[str, Any] | bytes, salt: str) -> bool:
    """Whether ``content`` is the input a stored record saw (``full``: equal; ``hash``: the same salted digest).

    Args:
        event: A stored record.
        content: The input a caller claims was sent.
        salt: The salt of the store the record is in.

    Returns:
        True when the record proves that input; False when it differs or the record kept nothing of it.
    """
    kept = (event.get("data") or {}).get("input") or {}
    if kept.get("payload") == Payload.HASH.value:
        return bool(kept.get("sha256") == input_digest(content, salt))
    if kept.get("payload") == Payload.FULL.value:
        if "document" in kept:
            return not isinstance(content, bytes | bytearray) and canonical_json(kept["document"]) == canonical_json(
                content
            )
        return isinstance(content, bytes | bytearray) and base64.b64decode(kept.get("base64", "")) == bytes(content)
    return False


def recorded_input(event: Mapping[str, Any]) -> Mapping[str, Any] | bytes | None:
    """The input a stored record kept whole (``payload: full``): its document or bytes; None when it kept only a hash,
    nothing, or was erased (what a re-explanation needs before it can run).

    Args:
        event: A stored record.

    Returns:
        The input document, the input bytes, or None.
    """
    kept = (event.get("data") or {}).get("input") or {}
    if kept.get("payload") != Payload.FULL.value:
        return None
    if "document" in kept:
        return dict(kept["document"])
    return base64.b64decode(kept.get("base64", ""))


def kept_input(content: Input, payload: Payload, salt: str) -> dict[str, Any] | None:
    """A record's ``data.input`` for ``content`` by ``payload`` (None when the door had no input to record)."""
    if content is None:
        return None
    if payload is Payload.NONE:
        return {"payload": payload.value}
    if payload is Payload.HASH:
        return {"payload": payload.value, "sha256": input_digest(content, salt)}
    if isinstance(content, bytes | bytearray):
        return {"payload": payload.value, "base64": base64.b64encode(bytes(content)).decode("ascii")}
    return {"payload": payload.value, "document": dict(content)}


@dataclass(frozen=True)
class Record:
    """One answered row, ready for a store.

    Attributes:
        event: The CloudEvent, its ``data.input`` not yet filled in (the store does that by its payload mode).
        input: The row's input as the door had it (a JSON document or bytes), or None.
    """

    event: Mapping[str, Any]
    input: Input = None

    @property
    def id(self) -> str:
        """The record id (the CloudEvents ``id``)."""
        return str(self.event["id"])

    @property
    def model(self) -> str:
        """The model's name."""
        return str(self.event["data"]["model"]["name"])

    @property
    def time(self) -> str:
        """When the row was answered (the CloudEvents ``time``)."""
        return str(self.event["time"])

    def event_for(self, payload: Payload, salt: str) -> dict[str, Any]:
        """The complete event a store keeps: :attr:`event` with ``data.input`` by ``payload`` and ``salt``.

        Args:
            payload: The store's payload mode.
            salt: The store's salt (hex), for ``hash``.

        Returns:
            A new event (this record is unchanged).
        """
        data = dict(self.event["data"])
        data["input"] = kept_input(self.input, payload, salt)
        return {**self.event, "data": data}


def _method_and_options(answer: Mapping[str, Any], content: Input) -> tuple[str | None, dict[str, Any]]:
    explanation = answer.get("explanation")
    if isinstance(explanation, Mapping) and explanation.get("method"):
        options = explanation.get("options")
        return str(explanation["method"]), dict(options) if isinstance(options, Mapping) else {}
    asked = content.get("explain") if isinstance(content, Mapping) else None
    if isinstance(asked, Mapping) and asked.get("method"):
        return str(asked["method"]), {key: value for key, value in asked.items() if key != "method"}
    return None, {}


def build_record(
    *,
    model: str,
    version: str | None,
    task: str,
    door: str,
    request_id: str,
    index: int | None,
    answer: Mapping[str, Any],
    input: Input,
    timings: Mapping[str, float] | None = None,
    traceparent: str | None = None,
    parent: str | None = None,
    time: datetime | None = None,
) -> Record:
    """The record of one answered row, from what a door has.

    Args:
        model: The model's name.
        version: The model's version: its archive's fingerprint (None when the door does not know it).
        task: The task's name (``classification``, ``token_classification``, ``generation``).
        door: The door that answered (``torchserve``, ``kserve``, ``ray``, ``openai``).
        request_id: The request's id (:func:`records.ids.request_id`).
        index: The row's index in a multi-row request, None for a single-row request.
        answer: The task's answer document for the row, as a JSON-able dict (an error answer is ``{"error": {...}}``).
        input: The row's input: its JSON document, or the bytes the door received; None when there is none.
        timings: Seconds the door measured (e.g. ``{"queue": 0.001, "model": 0.02}``).
        traceparent: The W3C ``traceparent`` the caller sent, if any.
        parent: The record id this row re-explains, if it does.
        time: When the row was answered (default: now).

    Returns:
        The :class:`Record`.

    Raises:
        InvalidRecordIdError: the request id (or ``parent``) is not a valid id.
        RecordsError: the answer, input or timings are not JSON-able.
    """
    check_request_id(request_id)
    if parent is not None:
        check_record_id(parent)
    method, options = _method_and_options(answer, input)
    error = answer.get("error")
    prediction = None if error is not None else {k: v for k, v in answer.items() if k not in ("explanation", "error")}
    event: dict[str, Any] = {
        "specversion": SPECVERSION,
        "id": row_id(request_id, index),
        "source": f"/doors/{door}/models/{model}",
        "type": RECORD_TYPE,
        "time": format_time(time or datetime.now(UTC)),
        "datacontenttype": DATACONTENTTYPE,
        "data": {
            "model": {"name": model, "version": version},
            "task": task,
            "door": door,
            "method": method,
            "options": options,
            "traceparent": traceparent,
            "parent": parent,
            "prediction": prediction,
            "explanation": answer.get("explanation"),
            "error": error,
            "timings": dict(timings or {}),
        },
    }
    if traceparent:
        event["traceparent"] = traceparent
    canonical_json(event)
    if isinstance(input, Mapping):
        canonical_json(input)
    return Record(event, input)


__all__ = [
    "DATACONTENTTYPE",
    "RECORD_TYPE",
    "SPECVERSION",
    "Input",
    "Payload",
    "Record",
    "build_record",
    "canonical_json",
    "format_time",
    "input_digest",
    "input_matches",
    "kept_input",
    "parse_time",
    "recorded_input",
]
