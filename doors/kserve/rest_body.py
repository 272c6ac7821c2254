"""The REST body of an OIP ``infer`` request, read as every OIP client sends it, into KServe's ``InferRequest``.

KServe's REST route hands the data plane the raw body whenever the request is not marked as JSON; KServe alone then
requires the ``Inference-Header-Content-Length`` header and reads every BYTES element of the binary data extension as
UTF-8 text. NVIDIA's ``tritonclient`` (the most used OIP client) sends no ``Content-Type`` at all, and sends BYTES
inputs (a PNG, a prompt) in the binary extension by default, so this module reads the body itself:

- no ``Inference-Header-Content-Length``: the whole body is the JSON request (the OIP's JSON form, whatever the
  ``Content-Type``);
- with it: that many bytes of JSON, then each input without ``data`` as its ``binary_data_size`` bytes, in the order
  of the inputs — BYTES elements length-prefixed (4 bytes, little-endian) and kept as **bytes** (text is decoded by the
  task codec, an image stays the file it is), the other datatypes little-endian in row-major order;
- ``Content-Encoding: gzip`` or ``deflate`` (``tritonclient``'s ``request_compression_algorithm``): the body is
  decompressed first, up to the same size bound as an uncompressed body.

The result is KServe's own ``InferRequest``, built by its JSON path (``InferRequest.from_inference_request``), so the
door serves a binary request exactly as the same request in JSON. A malformed body raises ``invalid_request``.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Mapping
from typing import Any

import numpy as np
import orjson
from kserve.constants.constants import INFERENCE_CONTENT_LENGTH_HEADER
from kserve.protocol.infer_type import InferRequest
from kserve.protocol.rest.v2_datamodels import InferenceRequest
from kserve.utils.numpy_codec import to_np_dtype
from pydantic import ValidationError

from serving_core.errors import RowError

#: The ``Content-Encoding`` values a request body may have (``identity``: none) → the zlib window of its format.
_ENCODINGS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


def infer_request_from_body(body: bytes, headers: Mapping[str, str], model_name: str, limit: int) -> InferRequest:
    """The OIP ``infer`` request of a raw REST body (the module docstring says which forms are read).

    Args:
        body: the request body as received.
        headers: the request headers, names in lower case (as KServe's REST route passes them).
        model_name: the model the request is for.
        limit: the most bytes the body may have once decompressed.

    Returns:
        KServe's request, BYTES elements of binary inputs as ``bytes``.

    Raises:
        RowError: ``invalid_request`` for a body that is not such a request, ``request_too_large`` for one that
            decompresses to more than ``limit`` bytes.
    """
    body = decompressed(body, headers.get("content-encoding", ""), limit)
    declared = headers.get(INFERENCE_CONTENT_LENGTH_HEADER)
    if declared is None:
        document = _json_object(body, "the request body")
    else:
        if not declared.strip().isdigit() or int(declared) > len(body):
            message = f"header {INFERENCE_CONTENT_LENGTH_HEADER}: {declared!r} is not a length within the body"
            raise RowError("invalid_request", f"{message} ({len(body)} bytes)")
        length = int(declared)
        document = _json_object(body[:length], "the request's JSON header")
        _read_binary_inputs(document, memoryview(body)[length:])
    try:
        request = InferenceRequest.model_validate(document)
    except ValidationError as error:
        problems = "; ".join(f"{'.'.join(str(part) for part in e['loc'])}: {e['msg']}" for e in error.errors())
        raise RowError("invalid_request", f"not an OIP inference request: {problems}") from None
    return InferRequest.from_inference_request(request, model_name)


def decompressed(body: bytes, encoding: str, limit: int) -> bytes:
    """``body`` decoded from its ``Content-Encoding`` (``""`` or ``identity``: as it is).

    Raises:
        RowError: ``invalid_request`` for another encoding or a corrupt body, ``request_too_large`` when it
            decompresses to more than ``limit`` bytes.
    """
    name = encoding.strip().lower()
    if name in ("", "identity"):
        return body
    if name not in _ENCODINGS:
        raise RowError("invalid_request", f"Content-Encoding {encoding!r} is not one of gzip, deflate, identity")
    inflater = zlib.decompressobj(_ENCODINGS[name])
    try:
        data = inflater.decompress(body, limit + 1)
    except zlib.error as error:
        raise RowError("invalid_request", f"the {name} body cannot be decompressed: {error}") from None
    if len(data) > limit:
        raise RowError("request_too_large", f"the request body exceeds {limit} bytes once decompressed")
    if not inflater.eof:
        raise RowError("invalid_request", f"the {name} body is truncated")
    return data


def _json_object(data: bytes | memoryview, what: str) -> dict[str, Any]:
    try:
        document = orjson.loads(data)
    except orjson.JSONDecodeError as error:
        raise RowError("invalid_request", f"{what} is not JSON: {error}") from None
    if not isinstance(document, dict):
        raise RowError("invalid_request", f"{what} must be a JSON object, got {type(document).__name__}")
    return document


def _read_binary_inputs(document: dict[str, Any], tail: memoryview) -> None:
    """Fill in the ``data`` of each input sent in the binary extension, from ``tail`` (the bytes after the JSON)."""
    inputs = document.get("inputs")
    if not isinstance(inputs, list):
        raise RowError("invalid_request", "the request's JSON header has no list of 'inputs'")
    offset = 0
    for index, tensor in enumerate(inputs):
        if not isinstance(tensor, dict) or "data" in tensor:
            continue  # JSON data (or not a tensor: the request's validation says what is wrong)
        name = tensor.get("name", f"#{index}")
        parameters = tensor.get("parameters") or {}
        size = parameters.get("binary_data_size") if isinstance(parameters, dict) else None
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise RowError("invalid_request", f"input {name!r} has neither 'data' nor a 'binary_data_size' parameter")
        if offset + size > len(tail):
            message = f"input {name!r}: binary_data_size {size} goes past the end of the body"
            raise RowError("invalid_request", f"{message} ({len(tail) - offset} bytes left)")
        tensor["data"] = binary_elements(bytes(tail[offset : offset + size]), tensor.get("datatype"), name)
        offset += size
    if offset != len(tail):
        raise RowError("invalid_request", f"{len(tail) - offset} bytes follow the binary data of the inputs")


def binary_elements(raw: bytes, datatype: Any, name: str) -> list[Any]:
    """The elements of one input's binary data, flat in row-major order: ``bytes`` for BYTES (each element's 4-byte
    little-endian length, then its bytes), Python numbers or booleans for the other datatypes.

    Raises:
        RowError: ``invalid_request`` for an unknown datatype or data that does not split into whole elements.
    """
    if datatype == "BYTES":
        elements: list[Any] = []
        offset = 0
        while offset < len(raw):
            if offset + 4 > len(raw):
                raise RowError("invalid_request", f"input {name!r}: a BYTES element's length is cut short")
            (length,) = struct.unpack_from("<I", raw, offset)
            offset += 4
            if offset + length > len(raw):
                raise RowError("invalid_request", f"input {name!r}: a BYTES element of {length} bytes is cut short")
            elements.append(raw[offset : offset + length])
            offset += length
        return elements
    dtype = to_np_dtype(datatype) if isinstance(datatype, str) else None
    if dtype is None:
        raise RowError("invalid_request", f"input {name!r}: datatype {datatype!r} is not an OIP datatype")
    itemsize = np.dtype(dtype).itemsize
    if len(raw) % itemsize:
        raise RowError("invalid_request", f"input {name!r}: {len(raw)} bytes are not whole {datatype} elements")
    values: list[Any] = np.frombuffer(raw, dtype=np.dtype(dtype).newbyteorder("<")).tolist()
    return values
