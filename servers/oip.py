"""The Open Inference Protocol (OIP, "v2") with this service's **explain extension**, as pure functions.

OIP tensors and parameters come in, :class:`~handlers.schema.DecodedRow` rows (or a per-row
:class:`~handlers.errors.RowError`) go out to the serving core; the core's :class:`~handlers.schema.RowOutcome` rows
come back and become OIP output tensors. Nothing here imports a server: the KServe model (:mod:`servers.kserve_model`)
converts KServe's own request/response types to and from :class:`Tensor` at the edge.

The extension (docs/SERVING.md, "Open Inference Protocol"), for text models:

- inputs ``text`` (BYTES ``[B]``) and, for sentence-pair models, ``text_pair`` (BYTES ``[B]``, ``""`` = no pair);
  images: ``image`` (BYTES ``[B]``, each element the encoded PNG/JPEG file, raw bytes or base64 text);
- request parameters ``explain_method`` (string; absent = prediction only, ``"default"`` = the model's default
  method), ``explain_target`` (int64 class index, or a label name) and ``explain_option_<name>`` (int64);
- optional per-row inputs of the same names (``explain_method`` BYTES ``[B]``, ``explain_target`` INT64 ``[B]``,
  ``explain_option_<name>`` INT64 ``[B]``) override the parameters row by row (``""`` / ``-1`` = not set);
- outputs ``label`` (BYTES ``[B]``), ``label_id`` (INT64 ``[B]``), ``probabilities`` (FP32 ``[B, C]``) and, when a
  row is explained, ``tokens`` (BYTES ``[B, n]``) and ``scores`` (FP32 ``[B, n]``), rows padded to the longest with
  ``""`` and 0, ``explain_method`` (BYTES ``[B]``, ``""`` for rows not explained) and ``explain_target``; images:
  ``scores`` (FP32 ``[B, grid_h, grid_w]``).

Each task (the ``task`` of the model's handler config) is one :class:`TaskCodec` in :data:`CODECS`; a new task
(token classification, generation) is a new codec registered with :func:`register_codec`, not a new branch here.
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from handlers.config import HandlerConfig
from handlers.errors import RowError
from handlers.pools import IMAGE_MAGIC
from handlers.schema import DecodedRow, RowOutcome, decode_fields

#: Request parameter / per-row input naming the method (``"default"``: the model's default method).
EXPLAIN_METHOD = "explain_method"
#: Request parameter / per-row input naming the explained class (int64 index or a label name).
EXPLAIN_TARGET = "explain_target"
#: Prefix of the request parameters / per-row inputs that carry a method option (``explain_option_start_layer``).
OPTION_PREFIX = "explain_option_"
#: The value of ``explain_method`` that means the model's default method.
DEFAULT_METHOD = "default"
#: The name this extension has in the server metadata's ``extensions`` list.
EXTENSION = "explain"
#: Most rows one OIP request may carry (requests are bounded; larger batches: send several requests).
MAX_ROWS = 64
#: The OIP datatypes this service reads and writes.
DATATYPES = frozenset({"BYTES", "FP32", "INT64", "INT32", "BOOL"})


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


class TaskCodec(Protocol):
    """How one task's rows travel over the OIP: its tensors, and the conversion to and from rows."""

    task: str

    def input_specs(self, config: HandlerConfig) -> list[TensorSpec]:
        """The inputs this task reads (metadata)."""
        ...

    def output_specs(self, config: HandlerConfig, head_type: str) -> list[TensorSpec]:
        """The outputs this task may write (metadata)."""
        ...

    def decode(self, request: OipRequest, config: HandlerConfig) -> list[DecodedRow | RowError]:
        """One decoded row (or its error) per element of the request's batch.

        Raises:
            RowError: if the request as a whole is malformed (missing or unknown inputs, wrong datatype or shape).
        """
        ...

    def encode(self, outcomes: Sequence[RowOutcome]) -> list[Tensor]:
        """The task's own outputs for the rows (its explanation tensors only when some row is explained)."""
        ...


#: Task name (the handler config's ``task``) → its codec.
CODECS: dict[str, TaskCodec] = {}


def register_codec(codec: TaskCodec) -> TaskCodec:
    """Register ``codec`` under its task name (a task is registered once).

    Raises:
        ValueError: if the task already has a codec.
    """
    if codec.task in CODECS:
        raise ValueError(f"task {codec.task!r} already has an OIP codec")
    CODECS[codec.task] = codec
    return codec


def codec_for(config: HandlerConfig) -> TaskCodec:
    """The codec of the model's task.

    Raises:
        KeyError: naming the tasks that have one.
    """
    if config.task not in CODECS:
        raise KeyError(f"no OIP codec for task {config.task!r}; codecs: {sorted(CODECS)}")
    return CODECS[config.task]


def decode_request(request: OipRequest, config: HandlerConfig) -> list[DecodedRow | RowError]:
    """Decode an OIP request into one row (or its error) per batch element, by the model's task codec.

    Raises:
        RowError: if the request as a whole is malformed.
    """
    return codec_for(config).decode(request, config)


def encode_response(outcomes: Sequence[RowOutcome], config: HandlerConfig) -> list[Tensor]:
    """The OIP outputs of a request's rows.

    Raises:
        RowError: the first row's error when no row of the request could be served (the door answers it with the
            error's HTTP status / gRPC code); when some rows were served, the failed ones are reported in the
            ``error_code`` and ``error_message`` outputs instead.
    """
    served = [outcome for outcome in outcomes if outcome.error is None]
    if not served:
        first = outcomes[0].error
        assert first is not None
        if len(outcomes) == 1:
            raise first
        raise RowError(first.code, f"row 0: {first.message} (no row of the request could be served)")
    outputs = prediction_outputs(outcomes, config.labels, served[0].head_type)
    outputs += codec_for(config).encode(outcomes)
    if any(outcome.method is not None for outcome in served):
        outputs += explained_outputs(outcomes)
    if len(served) < len(outcomes):
        outputs += error_outputs(outcomes)
    return outputs


# -- shared pieces of the codecs ---------------------------------------------------------------------------------


def prediction_outputs(outcomes: Sequence[RowOutcome], labels: Sequence[str], head_type: str) -> list[Tensor]:
    """``label``, ``label_id``, ``probabilities`` (``predicted`` for multi-label heads; ``value`` for regression);
    failed rows get ``""``, -1 and zeros."""
    batch = len(outcomes)
    if head_type == "regression":
        values = [float(o.value) if o.error is None and o.value is not None else 0.0 for o in outcomes]
        return [Tensor("value", "FP32", (batch,), values)]
    width = len(labels)
    names: list[str] = []
    ids: list[int] = []
    probabilities: list[float] = []
    predicted: list[bool] = []
    for outcome in outcomes:
        served = outcome.error is None
        names.append(labels[outcome.label_id] if served else "")
        ids.append(outcome.label_id if served else -1)
        probabilities += outcome.probabilities if served else [0.0] * width
        chosen = set(outcome.predicted) if served else set()
        predicted += [index in chosen for index in range(width)]
    outputs = [
        Tensor("label", "BYTES", (batch,), names),
        Tensor("label_id", "INT64", (batch,), ids),
        Tensor("probabilities", "FP32", (batch, width), probabilities),
    ]
    if head_type == "multi_label":
        outputs.append(Tensor("predicted", "BOOL", (batch, width), predicted))
    return outputs


def explained_outputs(outcomes: Sequence[RowOutcome]) -> list[Tensor]:
    """``explain_method`` (``""`` where a row is not explained), ``explain_target`` (-1) and one
    ``explain_option_<name>`` per option any row used (-1 where a row has none)."""
    batch = len(outcomes)
    explained = [o.error is None and o.method is not None for o in outcomes]
    methods = [o.method if ok else "" for o, ok in zip(outcomes, explained, strict=True)]
    targets = [o.target if ok else -1 for o, ok in zip(outcomes, explained, strict=True)]
    outputs = [Tensor(EXPLAIN_METHOD, "BYTES", (batch,), methods), Tensor(EXPLAIN_TARGET, "INT64", (batch,), targets)]
    names = sorted({name for o, ok in zip(outcomes, explained, strict=True) if ok for name in o.options})
    for name in names:
        values = [int(o.options.get(name, -1)) if ok else -1 for o, ok in zip(outcomes, explained, strict=True)]
        outputs.append(Tensor(f"{OPTION_PREFIX}{name}", "INT64", (batch,), values))
    return outputs


def error_outputs(outcomes: Sequence[RowOutcome]) -> list[Tensor]:
    """``error_code`` and ``error_message`` (BYTES ``[B]``, ``""`` for the rows that were served)."""
    batch = len(outcomes)
    codes = [o.error.code if o.error is not None else "" for o in outcomes]
    messages = [o.error.message if o.error is not None else "" for o in outcomes]
    return [Tensor("error_code", "BYTES", (batch,), codes), Tensor("error_message", "BYTES", (batch,), messages)]


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


def is_explain_input(name: str) -> bool:
    """Whether ``name`` is one of the per-row explain inputs (``explain_method``, ``explain_target``,
    ``explain_option_<name>``)."""
    return name in (EXPLAIN_METHOD, EXPLAIN_TARGET) or name.startswith(OPTION_PREFIX)


def check_inputs(request: OipRequest, required: str, allowed: set[str], other_task: Mapping[str, str]) -> None:
    """Check the request's input names and datatypes.

    Args:
        request: the request.
        required: the input every request of this task must have.
        allowed: the other inputs this task reads (besides the per-row explain inputs).
        other_task: input names of other tasks → the error message that says which input to send instead.

    Raises:
        RowError: ``unsupported_input`` for another task's input, ``missing_text``/``missing_image`` without the
            required input, ``invalid_request`` for unknown inputs or wrong datatypes.
    """
    names = set(request.inputs)
    for name, message in other_task.items():
        if name in names:
            raise RowError("unsupported_input", message)
    if required not in names:
        code = "missing_text" if required == "text" else "missing_image" if required == "image" else "invalid_request"
        raise RowError(code, f"missing input {required!r} (BYTES, shape [B])")
    explain_inputs = {name for name in names if is_explain_input(name)}
    unknown = sorted(names - allowed - {required} - explain_inputs)
    if unknown:
        known = sorted({required, *allowed, EXPLAIN_METHOD, EXPLAIN_TARGET, f"{OPTION_PREFIX}<name>"})
        raise RowError("invalid_request", f"unknown input(s) {unknown}; inputs: {known}")
    for name in {required, *allowed} & names:
        if request.inputs[name].datatype != "BYTES":
            raise RowError("invalid_request", f"input {name!r} must be BYTES, got {request.inputs[name].datatype}")


@dataclass(frozen=True)
class RowAsk:
    """What one row asks for (before the method, target and options are validated)."""

    method: str | None = None
    target: Any = None
    options: Mapping[str, Any] = field(default_factory=dict)


def _parameter_target(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | str):
        message = f"{EXPLAIN_TARGET} must be an int64 class index or a label name, got {value!r}"
        raise RowError("invalid_target", message)
    return value


def _parameter_asks(parameters: Mapping[str, Any], config: HandlerConfig) -> RowAsk:
    unknown = sorted(
        name
        for name in parameters
        if name.startswith("explain_") and name not in (EXPLAIN_METHOD, EXPLAIN_TARGET)
        and not name.startswith(OPTION_PREFIX)
    )  # fmt: skip
    if unknown:
        raise RowError(
            "invalid_request",
            f"unknown parameter(s) {unknown}; the explain extension reads {EXPLAIN_METHOD}, {EXPLAIN_TARGET} and "
            f"{OPTION_PREFIX}<name>",
        )
    method = parameters.get(EXPLAIN_METHOD)
    if method is not None and not isinstance(method, str):
        raise RowError("invalid_request", f"parameter {EXPLAIN_METHOD} must be a string, got {method!r}")
    target = parameters.get(EXPLAIN_TARGET)
    options: dict[str, Any] = {}
    for name, value in parameters.items():
        if name.startswith(OPTION_PREFIX):
            if isinstance(value, bool) or not isinstance(value, int):
                raise RowError("invalid_option", f"parameter {name} must be an int64, got {value!r}")
            options[name[len(OPTION_PREFIX) :]] = value
    return RowAsk(_resolve_method(method, config), _parameter_target(target) if target is not None else None, options)


def _resolve_method(method: str | None, config: HandlerConfig) -> str | None:
    if method is None or method == "":
        return None
    return config.default_method if method == DEFAULT_METHOD else method


def _text_value(value: Any, name: str) -> str:
    if isinstance(value, bytes | bytearray):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError as error:
            raise RowError("non_utf8", f"{name} is not UTF-8 ({error.reason} at byte {error.start})") from None
    if isinstance(value, str):
        return value
    raise RowError("invalid_request", f"{name} must be BYTES (a string), got {type(value).__name__}")


def _int_value(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise RowError("invalid_request", f"{name} must be INT64, got {value!r}")
    return value


def row_asks(request: OipRequest, batch: int, config: HandlerConfig) -> list[RowAsk | RowError]:
    """What each row asks for: the request parameters, overridden row by row by the per-row explain inputs.

    Raises:
        RowError: if a parameter or a per-row input is malformed for the whole request (wrong type or length).
    """
    base = _parameter_asks(request.parameters, config)
    columns: dict[str, list[Any]] = {}
    for name, tensor in request.inputs.items():
        if is_explain_input(name):
            if len(tensor.data) != batch:
                raise RowError("invalid_request", f"input {name!r} must have one element per row ({batch})")
            columns[name] = tensor.rows()
    asks: list[RowAsk | RowError] = []
    for row in range(batch):
        try:
            method, target, options = base.method, base.target, dict(base.options)
            explicit = False  # a per-row target or option was set for this row
            if EXPLAIN_METHOD in columns:
                value = _text_value(columns[EXPLAIN_METHOD][row], f"{EXPLAIN_METHOD}[{row}]")
                method = _resolve_method(value, config) if value else method
            if EXPLAIN_TARGET in columns:
                value = columns[EXPLAIN_TARGET][row]
                if isinstance(value, bytes | bytearray | str):
                    label = _text_value(value, f"{EXPLAIN_TARGET}[{row}]")
                    target, explicit = (label, True) if label else (target, explicit)
                else:
                    number = _int_value(value, f"{EXPLAIN_TARGET}[{row}]")
                    target, explicit = (number, True) if number >= 0 else (target, explicit)
            for name, values in columns.items():
                if name.startswith(OPTION_PREFIX):
                    number = _int_value(values[row], f"{name}[{row}]")
                    if number >= 0:
                        options[name[len(OPTION_PREFIX) :]] = number
                        explicit = True
            if method is None and not explicit and EXPLAIN_METHOD in columns:
                target, options = None, {}  # a row left unexplained on purpose: the parameters' target is not for it
            asks.append(RowAsk(method, target, options))
        except RowError as error:
            asks.append(error)
    return asks


def decode_rows(
    batch: int, asks: Sequence[RowAsk | RowError], build: Callable[[int, RowAsk], DecodedRow]
) -> list[DecodedRow | RowError]:
    """Decode each row with ``build`` (which raises :class:`RowError` for a bad row): one row or error per row."""
    rows: list[DecodedRow | RowError] = []
    for row in range(batch):
        ask = asks[row]
        if isinstance(ask, RowError):
            rows.append(ask)
            continue
        try:
            rows.append(build(row, ask))
        except RowError as error:
            rows.append(error)
    return rows


# -- the codecs --------------------------------------------------------------------------------------------------


class TextCodec:
    """Sequence classifiers: ``text`` (+ ``text_pair``) in; tokens and per-token scores out."""

    task = "text"

    def input_specs(self, config: HandlerConfig) -> list[TensorSpec]:
        """``text`` and the optional ``text_pair`` and per-row explain inputs."""
        return [
            TensorSpec("text", "BYTES", (-1,)),
            TensorSpec("text_pair", "BYTES", (-1,), optional=True),
            *_explain_input_specs(),
        ]

    def output_specs(self, config: HandlerConfig, head_type: str) -> list[TensorSpec]:
        """The prediction outputs, then the explanation and error outputs."""
        return [
            *_prediction_specs(head_type),
            TensorSpec("truncated", "BOOL", (-1,)),
            TensorSpec("tokens", "BYTES", (-1, -1), optional=True),
            TensorSpec("scores", "FP32", (-1, -1), optional=True),
            TensorSpec("special_tokens", "BOOL", (-1, -1), optional=True),
            TensorSpec("segments", "INT32", (-1, -1), optional=True),
            *_explained_specs(),
        ]

    def decode(self, request: OipRequest, config: HandlerConfig) -> list[DecodedRow | RowError]:
        """One row per element of ``text`` (and ``text_pair``)."""
        check_inputs(request, "text", {"text_pair"}, {"image": "this is a text model: send input 'text', not 'image'"})
        batch = batch_size(request, "text")
        texts = request.inputs["text"].rows()
        pairs: list[Any] = [None] * batch
        if "text_pair" in request.inputs:
            pairs = request.inputs["text_pair"].rows()
            if len(pairs) != batch:
                raise RowError("invalid_request", f"input 'text_pair' must have as many rows as 'text' ({batch})")
        asks = row_asks(request, batch, config)

        def build(row: int, ask: RowAsk) -> DecodedRow:
            text = _text_value(texts[row], f"text[{row}]")
            pair = _text_value(pairs[row], f"text_pair[{row}]") if pairs[row] is not None else None
            return decode_fields(
                config, text=text, text_pair=pair or None, method=ask.method, target=ask.target, options=ask.options
            )

        return decode_rows(batch, asks, build)

    def encode(self, outcomes: Sequence[RowOutcome]) -> list[Tensor]:
        """``truncated``; when some row is explained, ``tokens``, ``scores``, ``special_tokens`` (and ``segments``
        for pairs), padded to the longest row."""
        batch = len(outcomes)
        outputs = [Tensor("truncated", "BOOL", (batch,), [o.error is None and o.truncated for o in outcomes])]
        explained = [o.error is None and o.method is not None for o in outcomes]
        if not any(explained):
            return outputs
        rows = [o if ok else None for o, ok in zip(outcomes, explained, strict=True)]
        width, token_data = padded([o.tokens if o else None for o in rows], "")
        _, score_data = padded([o.scores if o else None for o in rows], 0.0)
        _, special = padded([o.special_tokens if o else None for o in rows], False)
        outputs += [
            Tensor("tokens", "BYTES", (batch, width), token_data),
            Tensor("scores", "FP32", (batch, width), score_data),
            Tensor("special_tokens", "BOOL", (batch, width), special),
        ]
        if any(o is not None and o.segments is not None for o in rows):
            _, segments = padded([o.segments if o else None for o in rows], -1)
            outputs.append(Tensor("segments", "INT32", (batch, width), segments))
        return outputs


class ImageCodec:
    """Image classifiers: ``image`` (encoded PNG/JPEG) in; a patch grid of scores out."""

    task = "image"

    def input_specs(self, config: HandlerConfig) -> list[TensorSpec]:
        """``image`` and the per-row explain inputs."""
        return [TensorSpec("image", "BYTES", (-1,)), *_explain_input_specs()]

    def output_specs(self, config: HandlerConfig, head_type: str) -> list[TensorSpec]:
        """The prediction outputs, then the explanation and error outputs."""
        return [*_prediction_specs(head_type), TensorSpec("scores", "FP32", (-1, -1, -1), optional=True),
                *_explained_specs()]  # fmt: skip

    def decode(self, request: OipRequest, config: HandlerConfig) -> list[DecodedRow | RowError]:
        """One row per element of ``image``: raw file bytes, or the file as base64 text (REST JSON)."""
        message = "this is an image model: send input 'image', not 'text'"
        check_inputs(request, "image", set(), {"text": message, "text_pair": message})
        batch = batch_size(request, "image")
        images = request.inputs["image"].rows()
        asks = row_asks(request, batch, config)

        def build(row: int, ask: RowAsk) -> DecodedRow:
            image = _image_bytes(images[row], row, config)
            return decode_fields(config, image=image, method=ask.method, target=ask.target, options=ask.options)

        return decode_rows(batch, asks, build)

    def encode(self, outcomes: Sequence[RowOutcome]) -> list[Tensor]:
        """When some row is explained, ``scores`` ``[B, grid_h, grid_w]`` (zeros for rows not explained)."""
        if not any(o.error is None and o.method is not None for o in outcomes):
            return []
        grids = {o.grid for o in outcomes if o.error is None and o.method is not None and o.grid is not None}
        height, width = grids.pop() if len(grids) == 1 else (0, 0)
        cells = height * width
        data: list[float] = []
        for outcome in outcomes:
            explained = outcome.error is None and outcome.method is not None and outcome.scores is not None
            data += list(outcome.scores or []) if explained else [0.0] * cells
        return [Tensor("scores", "FP32", (len(outcomes), height, width), data)]


def _image_bytes(value: Any, row: int, config: HandlerConfig) -> bytes:
    """A row's image: raw bytes as they are, base64 text (REST JSON cannot carry raw bytes) decoded."""
    if isinstance(value, bytes | bytearray):
        value = bytes(value)
        if value.startswith(IMAGE_MAGIC):
            return value
        try:
            text = value.decode("ascii")
        except UnicodeDecodeError:
            return value  # neither an image nor base64: the service answers invalid_image
    elif isinstance(value, str):
        text = value
    else:
        raise RowError("invalid_request", f"image[{row}] must be BYTES, got {type(value).__name__}")
    if len(text) * 3 // 4 > config.max_image_bytes:
        raise RowError("image_too_large", f"image[{row}] exceeds the limit of {config.max_image_bytes} bytes")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise RowError("invalid_image", f"image[{row}] is neither a PNG/JPEG file nor valid base64") from None


def _explain_input_specs() -> list[TensorSpec]:
    return [TensorSpec(EXPLAIN_METHOD, "BYTES", (-1,), optional=True),
            TensorSpec(EXPLAIN_TARGET, "INT64", (-1,), optional=True)]  # fmt: skip


def _prediction_specs(head_type: str) -> list[TensorSpec]:
    if head_type == "regression":
        return [TensorSpec("value", "FP32", (-1,))]
    specs = [TensorSpec("label", "BYTES", (-1,)), TensorSpec("label_id", "INT64", (-1,)),
             TensorSpec("probabilities", "FP32", (-1, -1))]  # fmt: skip
    if head_type == "multi_label":
        specs.append(TensorSpec("predicted", "BOOL", (-1, -1)))
    return specs


def _explained_specs() -> list[TensorSpec]:
    return [
        TensorSpec(EXPLAIN_METHOD, "BYTES", (-1,), optional=True),
        TensorSpec(EXPLAIN_TARGET, "INT64", (-1,), optional=True),
        TensorSpec("error_code", "BYTES", (-1,), optional=True),
        TensorSpec("error_message", "BYTES", (-1,), optional=True),
    ]


register_codec(TextCodec())
register_codec(ImageCodec())
