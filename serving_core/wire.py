"""The wire envelope every task shares: how a row came in, and how its answer goes back.

A row arrives as JSON (a REST body, or gRPC ``input["body"]``) or as a serialized ``ExplainRequest``
(``proto/explain.proto``, gRPC ``input["request"]``) and is answered in the same encoding. This module holds what is
the same for every task: telling the two apart (:func:`row_encoding`), TorchServe's row envelope decoded once for
every task (:func:`read_row`: the protobuf ``request``, or the ``body``/``data`` bytes → UTF-8 → JSON or text, into a
:class:`Body`), parsing JSON with the error table's code (:func:`parse_json`), rounding scores for JSON
(:func:`rounded`), the error answer in either encoding, the answer's id (:func:`with_id`: JSON ``id``, protobuf
``request_id``), and the JSON dump or protobuf serialization around a task's own document (:func:`encode`). A task
reads only its own fields and writes only its own fields; the other doors hand a task JSON documents directly
(:meth:`serving_core.task.Task.decode_document`).
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any, Literal, Protocol

from explain_client.protos import explain_messages, read_options, write_options

from .errors import RowError
from .pools import IMAGE_MAGIC


class Encoding(enum.Enum):
    """How a row came in, and so how its reply is encoded."""

    JSON = "json"
    PROTOBUF = "protobuf"


#: The HTTP content type of each encoding's reply.
CONTENT_TYPES = {Encoding.JSON: "application/json", Encoding.PROTOBUF: "application/x-protobuf"}


class Answered(Protocol):
    """What the envelope needs of any task's outcome: its encoding and its error, if any."""

    @property
    def encoding(self) -> Encoding:
        """The encoding the row came in (and is answered in)."""
        ...

    @property
    def error(self) -> RowError | None:
        """The row's error (``None`` when it was served)."""
        ...


def row_encoding(row: Mapping[str, Any]) -> Encoding:
    """The encoding of a raw row (decided before decoding, so even an undecodable row is answered in kind)."""
    return Encoding.PROTOBUF if "request" in row else Encoding.JSON


#: When a body that is not JSON is the row's text itself: ``always`` (bytes or text), ``text`` (only a body TorchServe
#: hands over as text, i.e. sent with a ``text/*`` content type; bytes must be JSON), ``never`` (it must be JSON).
PlainText = Literal["always", "text", "never"]


@dataclass(frozen=True)
class Body:
    """One row's request without its envelope: exactly one field set, or none (an empty request).

    Attributes:
        encoding: how the row came in (and is answered).
        message: the parsed ``ExplainRequest`` (protobuf rows).
        document: the JSON object (JSON rows).
        text: a body that is not JSON, taken as the row's text (see :data:`PlainText`).
        binary: an image file's bytes (a raw PNG/JPEG... body, where the task takes images).
    """

    encoding: Encoding = Encoding.JSON
    message: Any = None
    document: Mapping[str, Any] | None = None
    text: str | None = None
    binary: bytes | None = None

    @property
    def empty(self) -> bool:
        """The row carried no request at all."""
        return self.message is None and self.document is None and self.text is None and self.binary is None


def read_row(row: Mapping[str, Any], plain_text: PlainText = "always", images: bool = False) -> Body:
    """TorchServe's row envelope, decoded: gRPC ``request`` (a serialized ``ExplainRequest``) or the ``body``/``data``
    (:func:`read_body`).

    Raises:
        RowError: ``invalid_protobuf``, ``non_utf8``, ``invalid_json`` or ``invalid_request`` (a JSON body that is not
            an object, a body of an unsupported type).
    """
    if "request" in row:
        return Body(Encoding.PROTOBUF, message=parse_request(row["request"]))
    return read_body(row.get("body", row.get("data")), plain_text, images)


def read_body(raw: Any, plain_text: PlainText = "always", images: bool = False) -> Body:
    """A JSON row's body, as TorchServe hands it over (already-parsed JSON, text, or bytes), decoded.

    Args:
        raw: the body (``None``: an empty request, answered as the task says).
        plain_text: when a body that is not JSON is the row's text (:data:`PlainText`).
        images: bytes that start like a PNG or JPEG file (:data:`serving_core.pools.IMAGE_MAGIC`) are kept as bytes
            (``Body.binary``).

    Raises:
        RowError: ``non_utf8``, ``invalid_json`` or ``invalid_request``.
    """
    if raw is None:
        return Body()
    if isinstance(raw, bytearray):
        raw = bytes(raw)
    if isinstance(raw, bytes):
        if images and raw.startswith(IMAGE_MAGIC):
            return Body(binary=raw)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise RowError("non_utf8", f"the body is not UTF-8 ({error.reason} at byte {error.start})") from None
        if plain_text == "always" and not text.lstrip().startswith("{"):
            return Body(text=text)
        document = parse_json(text)
    elif isinstance(raw, str):
        if plain_text != "never" and not raw.lstrip().startswith("{"):
            return Body(text=raw)
        document = parse_json(raw)
    elif isinstance(raw, Mapping):
        document = raw
    else:
        raise RowError("invalid_request", f"unsupported body type {type(raw).__name__}")
    if not isinstance(document, Mapping):
        raise RowError("invalid_request", f"the JSON body must be an object, got {type(document).__name__}")
    return Body(document=document)


def parse_json(text: str) -> Any:
    """Parse a JSON body.

    Raises:
        RowError: ``invalid_json`` naming where the JSON breaks.
    """
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        message = f"invalid JSON: {error.msg} at line {error.lineno} column {error.colno}"
        raise RowError("invalid_json", message) from None


def rounded(value: float) -> float:
    """A float rounded to 6 significant digits, as every JSON answer writes scores and probabilities."""
    return float(f"{value:.6g}")


def rounded_list(values: Sequence[float]) -> list[float]:
    """:func:`rounded` of each value."""
    return list(map(float, map(format, values, repeat(".6g"))))  # rounded() of each, the loop in C: thousands of scores


def parse_request(payload: Any) -> Any:
    """Parse a serialized ``ExplainRequest`` (gRPC ``input["request"]``).

    Raises:
        RowError: ``invalid_protobuf`` if the bytes are not one.
    """
    message = explain_messages().ExplainRequest()
    try:
        message.ParseFromString(bytes(payload))
    except Exception as error:  # protobuf raises DecodeError, a plain Exception subclass
        raise RowError("invalid_protobuf", f"input['request'] is not a serialized ExplainRequest: {error}") from None
    return message


def proto_options(message: Any) -> dict[str, Any]:
    """The method options of a decoded message: its integer ``options`` and its real-valued ``float_options``.

    Raises:
        RowError: ``invalid_option`` when a name is in both maps.
    """
    try:
        return read_options(message)
    except ValueError as error:
        raise RowError("invalid_option", str(error)) from None


def fill_proto_options(message: Any, options: Mapping[str, Any]) -> None:
    """Write the options used into a reply message: integers into ``options``, real numbers into
    ``float_options``."""
    write_options(message, options)


def error_document(error: RowError) -> dict[str, Any]:
    """The JSON answer of a row that failed: ``{"error": {code, http_status, grpc_code, message}}``."""
    return {"error": error.to_dict()}


#: The JSON field of an answer's id (protobuf: ``ExplainResponse.request_id``).
ID_FIELD = "id"


def with_id(document: Mapping[str, Any], request_id: str | None) -> dict[str, Any]:
    """A JSON answer (or stream event) with its id as its first field, ``{"id": request_id, ...}``: the row's record
    id (the request id; ``<request id>-<index>`` for a row of a multi-row request). The one place a door's JSON
    answers get their id; ``request_id`` None: the document unchanged (a door that has no id to give)."""
    if request_id is None:
        return dict(document)
    return {ID_FIELD: request_id, **{key: value for key, value in document.items() if key != ID_FIELD}}


def encode(
    outcome: Answered,
    to_dict: Callable[[Any], dict[str, Any]],
    to_proto: Callable[[Any, Any], None],
    request_id: str | None = None,
) -> bytes:
    """Encode one row's answer in the encoding its request came in.

    Args:
        outcome: the row's outcome (any task's).
        to_dict: the task's JSON document of a served outcome.
        to_proto: fills an ``ExplainResponse`` from a served outcome (``to_proto(outcome, response)``).
        request_id: the answer's id (:func:`with_id`: JSON ``id``, protobuf ``request_id``), errors included;
            None: none.

    Returns:
        The JSON bytes, or the serialized ``ExplainResponse``; a failed row's error in either form.
    """
    if outcome.encoding is Encoding.JSON:
        document = error_document(outcome.error) if outcome.error is not None else to_dict(outcome)
        return json.dumps(with_id(document, request_id), separators=(",", ":")).encode("utf-8")
    response = explain_messages().ExplainResponse()
    if request_id is not None:
        response.request_id = request_id
    if outcome.error is not None:
        error = outcome.error
        response.error.code = error.code
        response.error.http_status = error.http_status
        response.error.grpc_code = error.kind.grpc_code
        response.error.message = error.message
    else:
        to_proto(outcome, response)
    return bytes(response.SerializeToString())
