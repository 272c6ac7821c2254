"""The OIP explain extension's request side, shared by every task's codec: which inputs a request may carry, and what
each row asks to explain (the request parameters, overridden row by row by per-row inputs of the same names).

- Request parameters ``explain_method`` (string; absent = prediction only, ``"default"`` = the model's default
  method), ``explain_target`` (int64 class index, or a label name; classifiers) and ``explain_option_<name>`` (int64
  for an integer option, double for a real-valued one such as ``explain_option_stdev``).
- Optional per-row inputs of the same names (``explain_method`` BYTES ``[B]``, ``explain_target`` INT64 ``[B]``,
  ``explain_option_<name>`` INT64 or FP64 ``[B]``) override the parameters row by row (``""`` / a negative value =
  not set).
- Request parameter ``explain_deadline_ms`` (int64, the Unix time in milliseconds by which the answer is due): every
  row's deadline, for every task (:func:`doors.kserve.oip.codecs.decode_request` applies it; docs/SERVING.md, "Time
  budgets and deadlines").
- A task may read parameters of its own (generation: ``explain_steps``): its codec names them.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from serving_core.config import HandlerConfig
from serving_core.errors import RowError

from .tensors import OipRequest, int_value, option_value, text_value

#: Request parameter / per-row input naming the method (``"default"``: the model's default method).
EXPLAIN_METHOD = "explain_method"
#: Request parameter / per-row input naming the explained class (int64 index or a label name).
EXPLAIN_TARGET = "explain_target"
#: Request parameter carrying the deadline of every row of the request (Unix milliseconds).
EXPLAIN_DEADLINE = "explain_deadline_ms"
#: Prefix of the request parameters / per-row inputs that carry a method option (``explain_option_start_layer``).
OPTION_PREFIX = "explain_option_"
#: The value of ``explain_method`` that means the model's default method.
DEFAULT_METHOD = "default"

Row = TypeVar("Row")

#: The error code of a request without its task's main input.
_MISSING = {"text": "missing_text", "image": "missing_image", "prompt": "missing_prompt"}


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
        code = _MISSING.get(required, "invalid_request")
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


def _parameter_asks(parameters: Mapping[str, Any], config: HandlerConfig, own: Collection[str]) -> RowAsk:
    unknown = sorted(
        name
        for name in parameters
        if name.startswith("explain_") and name not in (EXPLAIN_METHOD, EXPLAIN_TARGET, EXPLAIN_DEADLINE, *own)
        and not name.startswith(OPTION_PREFIX)
    )  # fmt: skip
    if unknown:
        reads = ", ".join([EXPLAIN_METHOD, EXPLAIN_TARGET, EXPLAIN_DEADLINE, *sorted(own)])
        raise RowError(
            "invalid_request",
            f"unknown parameter(s) {unknown}; the explain extension reads {reads} and {OPTION_PREFIX}<name>",
        )
    method = parameters.get(EXPLAIN_METHOD)
    if method is not None and not isinstance(method, str):
        raise RowError("invalid_request", f"parameter {EXPLAIN_METHOD} must be a string, got {method!r}")
    target = parameters.get(EXPLAIN_TARGET)
    options: dict[str, Any] = {}
    for name, value in parameters.items():
        if name.startswith(OPTION_PREFIX):
            options[name[len(OPTION_PREFIX) :]] = option_value(value, f"parameter {name}")
    return RowAsk(_resolve_method(method, config), _parameter_target(target) if target is not None else None, options)


def _resolve_method(method: str | None, config: HandlerConfig) -> str | None:
    if method is None or method == "":
        return None
    return config.default_method if method == DEFAULT_METHOD else method


def row_asks(
    request: OipRequest, batch: int, config: HandlerConfig, own: Collection[str] = ()
) -> list[RowAsk | RowError]:
    """What each row asks for: the request parameters, overridden row by row by the per-row explain inputs.

    Args:
        request: the request.
        batch: its number of rows.
        config: the model's handler config.
        own: ``explain_*`` parameters the task's codec reads itself (accepted here, not interpreted).

    Raises:
        RowError: if a parameter or a per-row input is malformed for the whole request (wrong type or length).
    """
    base = _parameter_asks(request.parameters, config, own)
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
                value = text_value(columns[EXPLAIN_METHOD][row], f"{EXPLAIN_METHOD}[{row}]")
                method = _resolve_method(value, config) if value else method
            if EXPLAIN_TARGET in columns:
                value = columns[EXPLAIN_TARGET][row]
                if isinstance(value, bytes | bytearray | str):
                    label = text_value(value, f"{EXPLAIN_TARGET}[{row}]")
                    target, explicit = (label, True) if label else (target, explicit)
                else:
                    number = int_value(value, f"{EXPLAIN_TARGET}[{row}]")
                    target, explicit = (number, True) if number >= 0 else (target, explicit)
            for name, values in columns.items():
                if name.startswith(OPTION_PREFIX):
                    option = option_value(values[row], f"{name}[{row}]")
                    if option >= 0:
                        options[name[len(OPTION_PREFIX) :]] = option
                        explicit = True
            if method is None and not explicit and EXPLAIN_METHOD in columns:
                target, options = None, {}  # a row left unexplained on purpose: the parameters' target is not for it
            asks.append(RowAsk(method, target, options))
        except RowError as error:
            asks.append(error)
    return asks


def decode_rows(
    batch: int, asks: Sequence[RowAsk | RowError], build: Callable[[int, RowAsk], Row]
) -> list[Row | RowError]:
    """Decode each row with ``build`` (which raises :class:`RowError` for a bad row): one row or error per row."""
    rows: list[Row | RowError] = []
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
