"""The task codecs of the OIP door: how each task's rows travel as OIP tensors, registered by task name.

A codec turns an :class:`~doors.kserve.oip.tensors.OipRequest` into the task's decoded rows (the same rows, checks and
errors as the task's own decoder: :class:`serving_core.task.Task`) and the served outcomes into output tensors. The
door (:mod:`doors.kserve.kserve_model`) calls :func:`decode_request` and :func:`encode_response` and never branches on
the task. A task with a codec of its own registers it here by task name (:func:`register_codec`); every other task is
served by the generic codec of JSON documents (:class:`~doors.kserve.oip.documents.DocumentCodec`), so a new task
needs no codec.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from explainers import Deadline
from serving_core.config import HandlerConfig
from serving_core.deadlines import decode_deadline_ms, earliest
from serving_core.errors import RowError
from serving_core.task import get_task

from .asks import EXPLAIN_DEADLINE
from .tensors import OipRequest, Tensor, TensorSpec, error_outputs


class TaskCodec(Protocol):
    """How one task's rows travel over the OIP: its tensors, and the conversion to and from rows."""

    task: str

    def input_specs(self, config: HandlerConfig) -> list[TensorSpec]:
        """The inputs this task reads (metadata)."""
        ...

    def output_specs(self, config: HandlerConfig, head_type: str) -> list[TensorSpec]:
        """The outputs this task may write (metadata)."""
        ...

    def decode(self, request: OipRequest, config: HandlerConfig) -> list[Any]:
        """One decoded row (or its :class:`~serving_core.errors.RowError`) per element of the request's batch.

        Raises:
            RowError: if the request as a whole is malformed (missing or unknown inputs, wrong datatype or shape).
        """
        ...

    def encode(self, outcomes: Sequence[Any], config: HandlerConfig) -> list[Tensor]:
        """The task's outputs for the rows (failed rows padded; explanation tensors only when some row is explained;
        the error outputs are added by :func:`encode_response`)."""
        ...


#: Task name (the handler config's ``task``) → its own codec (the tasks without one: :func:`codec_for`).
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
    """The codec of the model's task: its own (:data:`CODECS`), else the generic codec of JSON documents."""
    from .documents import DocumentCodec

    return CODECS.get(config.task) or DocumentCodec(config.task)


def decode_request(request: OipRequest, config: HandlerConfig, deadline: Deadline | None = None) -> list[Any]:
    """Decode an OIP request into one row (or its error) per batch element, by the model's task codec; each row is
    due by the earlier of the request's ``explain_deadline_ms`` parameter and ``deadline`` (the door's: a header).

    Raises:
        RowError: if the request as a whole is malformed (or its ``explain_deadline_ms`` is not Unix milliseconds).
    """
    rows = codec_for(config).decode(request, config)
    due = earliest(decode_deadline_ms(request.parameters.get(EXPLAIN_DEADLINE), EXPLAIN_DEADLINE), deadline)
    return get_task(config.task).with_deadlines(rows, due)


def encode_response(outcomes: Sequence[Any], config: HandlerConfig) -> list[Tensor]:
    """The OIP outputs of a request's rows.

    Raises:
        RowError: the first row's error when no row of the request could be served (the door answers it with the
            error's HTTP status / gRPC code); when some rows were served, the failed ones are reported in the
            ``error_code`` and ``error_message`` outputs instead.
    """
    errors: list[RowError | None] = [outcome.error for outcome in outcomes]
    if all(error is not None for error in errors):
        first = errors[0]
        assert first is not None
        if len(outcomes) == 1:
            raise first
        raise RowError(first.code, f"row 0: {first.message} (no row of the request could be served)")
    outputs = codec_for(config).encode(outcomes, config)
    if any(error is not None for error in errors):
        outputs += error_outputs(errors)
    return outputs
