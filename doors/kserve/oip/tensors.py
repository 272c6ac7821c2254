"""OIP tensors as plain Python: an input or output tensor, its metadata form, a request's inputs and parameters, and
the helpers every task's codec uses to read rows out of tensors and write padded outputs.

Nothing here imports a server: the KServe model (:mod:`doors.kserve.kserve_model`) converts KServe's own request and
response types to and from :class:`Tensor` at the edge.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from serving_core.errors import RowError

#: Most rows one OIP request may carry (requests are bounded; larger batches: send several requests).
MAX_ROWS = 64
#: The OIP datatypes this service reads and writes.
DATATYPES = frozenset({"BYTES", "FP32", "FP64", "INT64", "INT32", "BOOL"})


@dataclass(frozen=True)
class Tensor:
    """One OIP input or output tensor: ``data`` is flat, in row-major order (``prod(shape)`` elements).

    Raises:
        ValueError: if the datatype is not one of :data:`DATATYPES` or ``data`` does not fill ``shape``.
    """

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: Sequence[Any]

    def __post_init__(self) -> None:
        """Check the datatype and the element count."""
        if self.datatype not in DATATYPES:
            raise ValueError(f"tensor {self.name!r}: datatype {self.datatype} is not one of {sorted(DATATYPES)}")
        if any(size < 0 for size in self.shape) or len(self.data) != math.prod(self.shape):
            raise ValueError(f"tensor {self.name!r}: shape {list(self.shape)} does not hold {len(self.data)} elements")

    def rows(self) -> list[Any]:
        """The elements of a ``[B]`` (or ``[B, 1]``) tensor, one per row."""
        return list(self.data)


@dataclass(frozen=True)
class TensorSpec:
    """A tensor in the model metadata (``-1`` = a variable dimension)."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    optional: bool = False

    def to_dict(self) -> dict[str, Any]:
        """The OIP metadata form (``{"name", "datatype", "shape"}``)."""
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}


@dataclass(frozen=True)
class OipRequest:
    """The parts of an OIP inference request this service reads: its inputs by name and its parameters (plain
    Python values: ``str``, ``int``, ``bool``, ``float``)."""

    inputs: Mapping[str, Tensor]
    parameters: Mapping[str, Any] = field(default_factory=dict)


def row_requests(request: OipRequest, rows: int) -> list[dict[str, Any]]:
    """Each row of a request of ``rows`` rows as the OIP request of that row alone (JSON, what a record keeps as the
    row's input): ``{"inputs": [{"name", "datatype", "shape", "data"}], "parameters": {...}}``, in the request's
    input order, with each input of ``rows`` rows (shape ``[rows, ...]``) cut to the row's elements (shape
    ``[1, ...]``) and any other input (one value for every row) whole; the request's parameters as they are. A
    ``bytes`` element (gRPC, the binary data extension) is its text when it is UTF-8, else ``{"b64": "<base64>"}``."""
    documents: list[dict[str, Any]] = []
    for row in range(rows):
        inputs = []
        for tensor in request.inputs.values():
            shape, data = list(tensor.shape), list(tensor.data)
            if rows > 1 and shape and shape[0] == rows:
                width = math.prod(shape[1:])
                shape, data = [1, *shape[1:]], data[row * width : (row + 1) * width]
            inputs.append({"name": tensor.name, "datatype": tensor.datatype, "shape": shape,
                           "data": [_json_element(value) for value in data]})  # fmt: skip
        documents.append({"inputs": inputs, "parameters": {key: _json_element(value)
                                                           for key, value in request.parameters.items()}})  # fmt: skip
    return documents


def _json_element(value: Any) -> Any:
    if isinstance(value, bytes | bytearray):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return {"b64": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def padded(rows: Sequence[Sequence[Any] | None], fill: Any) -> tuple[int, list[Any]]:
    """Rows padded to the longest with ``fill``: (width, flat row-major data)."""
    width = max((len(row) for row in rows if row is not None), default=0)
    data: list[Any] = []
    for row in rows:
        values = list(row or [])
        data += values + [fill] * (width - len(values))
    return width, data


def batch_size(request: OipRequest, name: str) -> int:
    """The batch size ``B`` of the request's main input ``name`` (shape ``[B]`` or ``[B, 1]``).

    Raises:
        RowError: if the shape is not of that form or ``B`` is 0 or above :data:`MAX_ROWS`.
    """
    tensor = request.inputs[name]
    shape = tensor.shape
    if not shape or math.prod(shape[1:]) != 1:
        message = f"input {name!r} must have shape [B] (one element per row), got {list(shape)}"
        raise RowError("invalid_request", message)
    if not 0 < shape[0] <= MAX_ROWS:
        raise RowError("invalid_request", f"input {name!r} has {shape[0]} rows; send 1 to {MAX_ROWS} per request")
    return shape[0]


def text_value(value: Any, name: str) -> str:
    """A BYTES element as text.

    Raises:
        RowError: ``non_utf8`` for bytes that are not UTF-8, ``invalid_request`` for a non-BYTES element.
    """
    if isinstance(value, bytes | bytearray):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError as error:
            raise RowError("non_utf8", f"{name} is not UTF-8 ({error.reason} at byte {error.start})") from None
    if isinstance(value, str):
        return value
    raise RowError("invalid_request", f"{name} must be BYTES (a string), got {type(value).__name__}")


def int_value(value: Any, name: str) -> int:
    """An INT64 element or parameter.

    Raises:
        RowError: ``invalid_request`` if it is not an integer.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise RowError("invalid_request", f"{name} must be INT64, got {value!r}")
    return value


def option_value(value: Any, name: str) -> int | float:
    """A method option's element or parameter: INT64 for an integer option, FP64 (or INT64) for a real-valued one.

    Raises:
        RowError: ``invalid_option`` if it is not a number.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RowError("invalid_option", f"{name} must be INT64 or FP64, got {value!r}")
    return value


def error_outputs(errors: Sequence[RowError | None]) -> list[Tensor]:
    """``error_code`` and ``error_message`` (BYTES ``[B]``, ``""`` for the rows that were served)."""
    batch = len(errors)
    codes = [error.code if error is not None else "" for error in errors]
    messages = [error.message if error is not None else "" for error in errors]
    return [Tensor("error_code", "BYTES", (batch,), codes), Tensor("error_message", "BYTES", (batch,), messages)]


def error_specs() -> list[TensorSpec]:
    """The metadata of :func:`error_outputs`."""
    return [TensorSpec("error_code", "BYTES", (-1,), optional=True),
            TensorSpec("error_message", "BYTES", (-1,), optional=True)]  # fmt: skip
