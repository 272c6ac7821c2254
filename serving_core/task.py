"""The task contract: what every served task (classification, token classification, generation, ...) implements.

A door (TorchServe's handler, the KServe/OIP and v1 codecs, Ray Serve replicas) never branches on the task: it asks the
registry (:mod:`serving_core.registry`) for the model's :class:`Task` and calls its verbs:

1. :meth:`Task.load` once: the task's service (the checkpoint, its tokenizer or processor) on a device;
2. :meth:`Task.decode` per row: the row's request without its envelope (:class:`serving_core.wire.Body`: a JSON
   document, a text body, a raw image, or a parsed ``ExplainRequest``) into the task's typed row, or a
   :class:`~serving_core.errors.RowError`. TorchServe's row envelope is removed once for every task by
   :func:`serving_core.wire.read_row` (:meth:`Task.read`, :meth:`Task.decode_row`); the other doors hand JSON
   documents (:meth:`Task.decode_document`);
3. ``service.run(rows, encodings)`` per batch (:class:`Service`): one outcome per row, in order, and the batch's shared
   :class:`BatchTimings`;
4. :meth:`Task.encode` per row: the outcome in the encoding its request came in (the envelope, the error answer, the
   answer's id and the JSON/protobuf choice are :mod:`serving_core.wire`'s; the task writes only its own fields,
   :meth:`Task.to_dict` and :meth:`Task.to_proto`);
5. :meth:`Task.observe` per row: the explanation metrics (:mod:`serving_core.metrics`).

A row that :meth:`Task.streams` (a generation request with ``"stream": true``) is given a listener by its door
(:meth:`Task.with_listener`): the service sends it the row's token events as they are written, and the door sends the
row's last event, its answer or its error, once ``service.run`` returns (:mod:`serving_core.streaming`).

Adding a task: write one module with a :class:`Task` subclass (and its service), and add one record to
:data:`serving_core.registry.TASKS` (its :class:`~serving_core.registry.TaskFacts`: every fact the packager, the config
validation and the doors need; :func:`get_task` finds the task through it). A task defined outside this project is
served without editing any module: ``handler.task`` is then the ``module:attribute`` of its record. docs/SERVING.md
("Adding a task") says the rest.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from . import metrics, wire
from .errors import RowError
from .registry import task_facts
from .streaming import Listener
from .wire import Encoding

if TYPE_CHECKING:
    import torch

    from explainers import Deadline

    from .config import HandlerConfig


@dataclass(frozen=True)
class BatchTimings:
    """Shared stage seconds of one served batch.

    Attributes:
        forward: the explanation (or prediction) forward passes.
        backward: the backward passes (0 if no row needed gradients).
        generate: generation (causal LMs; 0 for the other tasks).
        tokens: tokens written by generation (given continuations not counted).
    """

    forward: float = 0.0
    backward: float = 0.0
    generate: float = 0.0
    tokens: int = 0


class Outcome(Protocol):
    """What the contract needs of every task's outcome of one row."""

    @property
    def encoding(self) -> Encoding:
        """The encoding the row came in (and is answered in)."""
        ...

    @property
    def error(self) -> RowError | None:
        """The row's error (``None`` when it was served)."""
        ...

    @property
    def method(self) -> str | None:
        """The method that explained the row (``None``: not explained)."""
        ...

    @property
    def attribution_seconds(self) -> float:
        """Seconds of the row's own attribution (its share of the method's work after the shared passes)."""
        ...


Row = TypeVar("Row")
Result = TypeVar("Result", bound=Outcome)
RowIn = TypeVar("RowIn", contravariant=True)
ResultOut = TypeVar("ResultOut", bound=Outcome, covariant=True)


class Service(Protocol[RowIn, ResultOut]):
    """A loaded model of one task: serves a batch of decoded rows."""

    #: What the model answers (classifiers: ``single_label``, ``multi_label`` or ``regression``; else the task).
    head_type: str

    def run(
        self, rows: Sequence[RowIn | RowError], encodings: Sequence[Encoding]
    ) -> tuple[Sequence[ResultOut], BatchTimings]:
        """Serve a batch: one outcome per row (a row given as its error keeps it), in order."""
        ...


class Task(ABC, Generic[Row, Result]):
    """One servable task: how its rows are decoded, served, encoded and observed (see the module docstring).

    Attributes:
        name: the ``handler.task`` value of the models this task serves.
        main_input: the request field that carries the row's input (``text``, ``image``, ``prompt``).
    """

    name: str
    main_input: str

    @abstractmethod
    def load(self, config: HandlerConfig, model_dir: Path, device: torch.device) -> Service[Row, Result]:
        """Load the checkpoint folder ``model_dir`` (local safetensors only, eval mode) for serving on ``device``.

        Raises:
            ValueError: if the checkpoint does not match the config (labels, tokenizer) or is not supported.
        """

    @abstractmethod
    def decode(self, body: wire.Body, explain_header: bool, config: HandlerConfig) -> Row:
        """Decode one row's request, its envelope removed.

        Args:
            body: the request: a JSON document, a text, an image's bytes or a parsed ``ExplainRequest`` (or nothing:
                an empty request).
            explain_header: the route asks for an explanation (``/explanations/{model}``, v1 ``:explain``): an absent
                ``explain`` means the model's default method.
            config: the model's handler config.

        Raises:
            RowError: with the error table's code for what is wrong.
        """

    def read(self, row: Mapping[str, Any], config: HandlerConfig) -> wire.Body:
        """TorchServe's row envelope removed (``{"body": ...}``/``{"data": ...}`` or gRPC ``{"request": ...}``):
        :func:`serving_core.wire.read_row`, where a body that is not JSON is the row's text. Tasks that take images,
        or that take a text only from a ``text/*`` body, override it.

        Raises:
            RowError: for an envelope that cannot be decoded.
        """
        return wire.read_row(row)

    def decode_row(self, row: Mapping[str, Any], explain_header: bool, config: HandlerConfig) -> Row:
        """Decode one TorchServe row: :meth:`read`, then :meth:`decode`.

        Raises:
            RowError: with the error table's code for what is wrong.
        """
        return self.decode(self.read(row, config), explain_header, config)

    def decode_document(self, document: Mapping[str, Any], explain_header: bool, config: HandlerConfig) -> Row:
        """Decode one row given as its JSON document (the KServe v1, OIP and OpenAI doors): :meth:`decode`.

        Raises:
            RowError: with the error table's code for what is wrong.
        """
        return self.decode(wire.Body(document=document), explain_header, config)

    @abstractmethod
    def requested_method(self, row: Row) -> str | None:
        """The method a decoded row asks for (``None``: none), for the metrics of a row that then failed."""

    @abstractmethod
    def with_explanation(self, row: Row, config: HandlerConfig) -> Row:
        """The row asking for the model's default method if it asks for none (KServe v1 ``:explain``)."""

    def streams(self, row: Row) -> bool:
        """Whether a decoded row asks to be answered as a stream of events (:mod:`serving_core.streaming`); a task
        that does not stream: never."""
        return False

    def with_listener(self, row: Row, listener: Listener) -> Row:
        """The row sending its token events to ``listener`` as they are written (a door sets it on a row that
        :meth:`streams`). A task that does not stream has none to send: the row unchanged."""
        return row

    @abstractmethod
    def with_deadline(self, row: Row, deadline: Deadline | None) -> Row:
        """The row due by the earlier of its own deadline and ``deadline``, the one its door received (a REST header,
        a gRPC call's deadline, a request parameter; ``None``: the row unchanged)."""

    def with_deadlines(self, rows: Sequence[Row | RowError], deadline: Deadline | None) -> list[Row | RowError]:
        """:meth:`with_deadline` of every decoded row of a request (a row's error stays as it is)."""
        if deadline is None:
            return list(rows)
        return [row if isinstance(row, RowError) else self.with_deadline(row, deadline) for row in rows]

    @abstractmethod
    def to_dict(self, outcome: Result, config: HandlerConfig) -> dict[str, Any]:
        """The JSON document of a served row (docs/SERVING.md gives each task's)."""

    @abstractmethod
    def to_proto(self, outcome: Result, response: Any, config: HandlerConfig) -> None:
        """Fill an ``ExplainResponse`` (proto/explain.proto) with a served row's answer."""

    def encode(self, outcome: Result, config: HandlerConfig, request_id: str | None = None) -> bytes:
        """One row's answer in the encoding its request came in (JSON or a serialized ``ExplainResponse``), carrying
        ``request_id`` (JSON ``id``, protobuf ``request_id``: :func:`serving_core.wire.with_id`) when given."""
        return wire.encode(
            outcome,
            lambda served: self.to_dict(served, config),
            lambda served, reply: self.to_proto(served, reply, config),
            request_id,
        )

    def stages(self, outcome: Result, timings: BatchTimings, encode_seconds: float) -> dict[str, float]:
        """The stage seconds of a served row for :func:`serving_core.metrics.observe_row` (the batch's shared passes,
        its own attribution, its encoding). Tasks whose stages differ override it."""
        stages = {"forward": timings.forward, "encode": encode_seconds}
        if outcome.method is not None:
            stages["attribution"] = outcome.attribution_seconds
            if timings.backward > 0 and metrics.needs_gradients(outcome.method):
                stages["backward"] = timings.backward
        return stages

    def observe(
        self, model: str, row: Row | RowError, outcome: Result, timings: BatchTimings, encode_seconds: float
    ) -> None:
        """Record one answered row: its error (with the method it asked for), or its stages."""
        if outcome.error is not None:
            requested = outcome.method if isinstance(row, RowError) else self.requested_method(row)
            metrics.observe_error(model, metrics.metric_method(requested), outcome.error.code)
            return
        metrics.observe_row(model, outcome.method, self.stages(outcome, timings, encode_seconds))


def get_task(name: str) -> Task[Any, Any]:
    """The task ``name`` (a model's ``handler.task``): the :class:`Task` its record
    (:func:`serving_core.registry.task_facts`) names, imported on first use.

    Raises:
        KeyError: naming the registered tasks, if ``name`` is not one (nor a record's ``module:attribute``).
        TypeError: if the record does not name a task of the record's name (a broken record).
    """
    facts = task_facts(name)
    module_name, _, attribute = facts.task.partition(":")
    task = getattr(importlib.import_module(module_name), attribute)
    if not isinstance(task, Task) or task.name != facts.name:
        raise TypeError(f"task record {name!r}: {facts.task!r} is not the Task named {facts.name!r}")
    return task
