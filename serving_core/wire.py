"""The wire envelope every task shares: how a row came in, and how its answer goes back.

A row arrives as JSON (a REST body, or gRPC ``input["body"]``) or as a serialized ``ExplainRequest``
(``proto/explain.proto``, gRPC ``input["request"]``) and is answered in the same encoding. This module holds what is
the same for every task: telling the two apart (:func:`row_encoding`), parsing JSON with the error table's code
(:func:`parse_json`), rounding scores for JSON (:func:`rounded`), the error answer in either encoding, and the JSON
dump or protobuf serialization around a task's own document (:func:`encode`). A task writes only its own fields.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from explain_client.protos import explain_messages, read_options, write_options

from .errors import RowError


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
    return [rounded(value) for value in values]


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


def encode(
    outcome: Answered,
    to_dict: Callable[[Any], dict[str, Any]],
    to_proto: Callable[[Any, Any], None],
) -> bytes:
    """Encode one row's answer in the encoding its request came in.

    Args:
        outcome: the row's outcome (any task's).
        to_dict: the task's JSON document of a served outcome.
        to_proto: fills an ``ExplainResponse`` from a served outcome (``to_proto(outcome, response)``).

    Returns:
        The JSON bytes, or the serialized ``ExplainResponse``; a failed row's error in either form.
    """
    if outcome.encoding is Encoding.JSON:
        document = error_document(outcome.error) if outcome.error is not None else to_dict(outcome)
        return json.dumps(document, separators=(",", ":")).encode("utf-8")
    response = explain_messages().ExplainResponse()
    if outcome.error is not None:
        error = outcome.error
        response.error.code = error.code
        response.error.http_status = error.http_status
        response.error.grpc_code = error.kind.grpc_code
        response.error.message = error.message
    else:
        to_proto(outcome, response)
    return bytes(response.SerializeToString())
