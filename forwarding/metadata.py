"""The gRPC call's metadata a TorchServe handler must see, carried into the request itself.

TorchServe hands a handler a gRPC ``Predictions``/``StreamPredictions`` call's input map as the row and drops the
call's metadata, so a caller's ``x-request-id`` (the answer's and the record's id) and W3C trace context
(``traceparent``, ``tracestate``) would never reach the handler. The forwarder in front of TorchServe
(:mod:`forwarding.forwarder`) copies them into the ``PredictionsRequest``'s input map, where the handler reads a gRPC
row's headers (:func:`doors.torchserve.row_records.row_value`; the row's span:
:func:`serving_core.tracing.start_row_span`):

- ``x-request-id``: only a valid request id (:func:`records.ids.check_request_id`: 1-128 characters of letters, digits
  and ``. _ : -``, nothing path-like); any other value refuses the call (``INVALID_ARGUMENT``), so nothing else rides
  into the row;
- ``traceparent`` (and its ``tracestate``): the forwarder's own span while it traces (the worker's spans become its
  children), else the caller's; only a well-formed one (:func:`serving_core.tracing.valid_trace_headers`).

An entry the caller already put in the input map is kept (a caller calling TorchServe directly names its id there);
a request that is not a ``PredictionsRequest`` passes unchanged (TorchServe answers it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from explain_client.protos import inference_stubs
from records import InvalidRecordIdError
from records.ids import check_request_id
from serving_core import tracing
from serving_core.recording import REQUEST_ID_HEADER, header

#: The input map entry (and gRPC metadata key) of the caller's request id.
REQUEST_ID_ENTRY = REQUEST_ID_HEADER.lower()


def carried_entries(metadata: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> dict[str, str]:
    """The input map entries a call's metadata gives: its valid ``x-request-id`` and the trace context to send on
    (:func:`serving_core.tracing.outgoing_headers`, well-formed only).

    Raises:
        InvalidRecordIdError: an ``x-request-id`` that is not a valid request id (the forwarder refuses the call with
            ``INVALID_ARGUMENT``).
    """
    pairs = list(metadata.items()) if isinstance(metadata, Mapping) else list(metadata)
    entries = tracing.valid_trace_headers(tracing.outgoing_headers(pairs))
    given = header(dict(pairs), REQUEST_ID_HEADER)
    if given is not None:
        try:
            entries[REQUEST_ID_ENTRY] = check_request_id(given)
        except InvalidRecordIdError as error:
            raise InvalidRecordIdError(f"{REQUEST_ID_ENTRY}: {error}") from None
    return entries


def parse_predictions_request(request: bytes) -> Any | None:
    """A serialized TorchServe ``PredictionsRequest`` parsed; None when the bytes are not one."""
    messages, _ = inference_stubs()
    message = messages.PredictionsRequest()
    try:
        message.ParseFromString(request)
    except Exception:  # protobuf raises DecodeError, a plain Exception subclass
        return None
    return message


def carry_metadata(request: bytes, metadata: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> bytes:
    """A serialized ``PredictionsRequest`` with :func:`carried_entries` of the call's metadata added to its input map
    (an entry the map already has, in any case, is kept); the bytes unchanged when there is nothing to add or they do
    not parse.

    Raises:
        InvalidRecordIdError: an ``x-request-id`` that is not a valid request id.
    """
    entries = carried_entries(metadata)
    if not entries:
        return request
    message = parse_predictions_request(request)
    if message is None:
        return request
    present = {key.lower() for key in message.input}
    added = {name: value for name, value in entries.items() if name not in present}
    if not added:
        return request
    for name, value in added.items():
        message.input[name] = value.encode("ascii")
    return bytes(message.SerializeToString())


__all__ = ["REQUEST_ID_ENTRY", "carried_entries", "carry_metadata", "parse_predictions_request"]
