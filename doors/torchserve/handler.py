"""The TorchServe handler contract, row by row, for every task: ``initialize`` once, then ``handle`` per batch.

TorchServe glue only: the task's verbs (:class:`serving_core.task.Task`, found by the archive's ``handler.task``
through :func:`serving_core.task.get_task`) do the work. ``handle`` decodes each row on its own (an undecodable row
gets its own error), serves the valid rows with one ``service.run``, encodes each row in the encoding it came in, sets
each row's REST status and content type, and records the metrics. Each row gets its request id before it is decoded
(:func:`doors.torchserve.row_records.request_ids`) and its record after it is encoded, before the batch's answers
leave (:func:`doors.torchserve.row_records.record_rows`; a row the store refuses is answered ``records_unavailable``);
each served row is handed to the model's monitor (:mod:`monitoring.serving`), whose canaries run between batches.
It never uses ``BaseHandler.handle``/``explain_handle``, which decide for the whole batch from row 0 and explain row 0
only. No per-request state is stored on ``self``.

Every answer carries its row's id, the id of its record (:func:`doors.torchserve.row_records.answer_ids`): JSON
``"id"`` (errors included), protobuf ``ExplainResponse.request_id`` (:func:`serving_core.wire.with_id`, through
:meth:`serving_core.task.Task.encode`), and the ``X-Request-Id`` response header. The log lines of a batch and of a
failed row name the rows' ids (never request text).

A row that asks for a stream (a generation request with ``"stream": true``; :mod:`serving_core.streaming`) is sent its
token events as the service writes them, each as one JSON line to its client alone (TorchServe's intermediate
responses: REST chunks, gRPC ``StreamPredictions`` messages); the handler's answer for that row is its last event.
Every event of the stream carries the row's ``id``, so that a gRPC caller, which sees no header, has it from the
first.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from monitoring.monitor import Monitor
from monitoring.serving import start_monitor
from records.recorder import Recorder
from serving_core import metrics, tracing
from serving_core.config import ConfigError, HandlerConfig
from serving_core.deadlines import headers_deadline
from serving_core.errors import RowError
from serving_core.loading import worker_device
from serving_core.pools import POOL_NICENESS, is_pool, model_of
from serving_core.streaming import JSON_LINES, RowStream, json_line
from serving_core.task import Service, Task, get_task
from serving_core.wire import CONTENT_TYPES, Encoding, encode, error_document, row_encoding, with_id

from .row_records import answer_ids, record_rows, request_ids, row_headers

logger = logging.getLogger(__name__)


def _explain_header(context: Any, index: int) -> bool:
    value = context.get_request_header(index, "explain")
    return isinstance(value, str) and value.strip().lower() == "true"


def _decoded(task: Task[Any, Any], row: dict[str, Any], context: Any, index: int, config: HandlerConfig) -> Any:
    """Row ``index`` decoded, due by the earlier of its body's deadline and its ``Explain-Deadline-Ms`` header's.

    Raises:
        RowError: for what is wrong with the row or the header.
    """
    decoded = task.decode_row(row, _explain_header(context, index), config)
    deadline = headers_deadline(row_headers(context, index, row))  # gRPC Predictions: an entry of the input map
    return task.with_deadline(decoded, deadline)


def _send_event(context: Any, index: int, request_id: str, event: dict[str, Any]) -> None:
    """Send one event of row ``index``'s stream to its client now, with the row's ``id``, as a chunk of TorchServe's
    REST answer (one JSON line) or a message of its gRPC ``StreamPredictions`` (TorchServe's
    ``send_intermediate_predict_response``, for this row only: the batch's other rows are not told)."""
    from ts.handler_utils.utils import send_intermediate_predict_response

    context.set_response_content_type(index, JSON_LINES)
    request = {index: context.request_ids[index]}
    send_intermediate_predict_response({index: json_line(with_id(event, request_id))}, request,
                                       "Intermediate Prediction success", 200, context)  # fmt: skip


def _refused(context: Any, index: int, error: RowError, encoding: Encoding, request_id: str) -> bytes:
    """Row ``index``'s answer replaced by ``error`` (its status and content type set), in the encoding it came in,
    with its id."""
    context.set_response_status(error.http_status, error.phrase, index)
    context.set_response_content_type(index, CONTENT_TYPES[encoding])
    return encode(_Failed(encoding, error), dict, lambda outcome, response: None, request_id)


@dataclass(frozen=True)
class _Failed:
    """A row's outcome that is only its error (what :func:`serving_core.wire.encode` reads)."""

    encoding: Encoding
    error: RowError


def lower_priority(niceness: int = POOL_NICENESS) -> None:
    """Lower this worker process's CPU priority by ``niceness`` (an explanation pool's worker, which TorchServe runs
    in a process of its own); where the system refuses, the worker runs at its priority and says so."""
    try:
        os.nice(niceness)
    except OSError as error:
        logger.warning("could not lower the explanation pool worker's priority: %s", error)


class ExplanationHandler:
    """Base class of the handler entry points: the generic ``doors/torchserve/entry.py`` serves the archive's
    ``handler.task``; the task entry files (``text_handler.py``, ``image_handler.py``, ``token_handler.py``,
    ``generation_handler.py``, named by their tasks' records) name their task, nothing else, and refuse another.

    Attributes:
        task: the task this entry point serves (``""``: the one the archive's ``handler.task`` names).
    """

    task: str = ""

    def __init__(self) -> None:
        """Create an uninitialised handler (TorchServe calls :meth:`initialize`)."""
        self.initialized = False
        self.config: HandlerConfig | None = None
        self.service: Service[Any, Any] | None = None
        self.model_name = ""
        self.recorder: Recorder | None = None
        self.monitor: Monitor | None = None
        self._serving = threading.Lock()  # held around service.run: the monitor's canaries run between batches

    def initialize(self, context: Any) -> None:
        """Read the ``handler:`` config from ``model-config.yaml``, open the model's recorder (its ``records:`` section,
        else the deployment's ``EXPLAIN_RECORDS``), load the model and start its monitor (``handler.monitor``; absent:
        on with the defaults, ``false``: off; :func:`monitoring.serving.start_monitor`).

        Raises:
            ConfigError: if the config is invalid or its task is not this handler's.
            records.settings.SettingsError: if the records settings are not usable.
            ValueError: if the monitor setting, or its baseline or canary file, is not valid.
        """
        config = HandlerConfig.from_model_yaml(context.model_yaml_config)
        if self.task and config.task != self.task:
            raise ConfigError(f"handler.task is {config.task!r} but this is the {self.task} handler")
        properties = context.system_properties
        model_dir = Path(properties.get("model_dir", ".")) / config.model_dir
        gpu_id = properties.get("gpu_id")
        device = worker_device(config, None if gpu_id is None else int(gpu_id))
        self.model_name = model_of(str(context.model_name))  # an explanation pool's metrics are its model's
        if is_pool(str(context.model_name)):
            lower_priority()  # this worker process serves the pool alone: predictions go first on shared cores
        self.recorder = Recorder.open(self.model_name, config.records)
        self.service = get_task(config.task).load(config, model_dir, device)
        self.monitor = start_monitor(self.model_name, get_task(config.task), config, self.service, config.monitor,
                                     base=Path(properties.get("model_dir", ".")),
                                     is_idle=lambda: not self._serving.locked(), lock=self._serving)  # fmt: skip
        self.config = config
        metrics.check_multiprocess()
        self.initialized = True

    def handle(self, data: list[dict[str, Any]], context: Any) -> list[bytes]:
        """Serve one TorchServe batch: exactly one response per row, in order."""
        if self.service is None or self.config is None:
            raise RuntimeError("handler used before initialize()")
        config = self.config
        task: Task[Any, Any] = get_task(config.task)
        metrics.observe_batch(self.model_name, len(data))
        encodings = [row_encoding(row) for row in data]
        given = request_ids(context, data)  # a refused id: the row's error
        ids = answer_ids(context, given)  # each row's answer and record id
        spans = [  # each row in its caller's trace (REST headers; gRPC: entries of the input map)
            tracing.start_row_span(row_headers(context, index, row), f"TorchServe {task.name}")
            for index, row in enumerate(data)
        ]
        decoded: list[Any] = []
        streams: dict[int, RowStream] = {}
        for index, row in enumerate(data):
            refused = given[index]
            if isinstance(refused, RowError):  # its X-Request-Id is not a valid id
                decoded.append(refused)
                continue
            try:
                with tracing.within(spans[index]), tracing.stage("decode"):
                    decoded.append(_decoded(task, row, context, index, config))
            except RowError as error:
                decoded.append(error)
                continue
            if task.streams(decoded[index]):
                streams[index] = RowStream(partial(_send_event, context, index, ids[index]))
                decoded[index] = task.with_listener(decoded[index], streams[index].listener)
        links = [tracing.span_context(span) for span in spans]
        with self._serving, tracing.batch_span(links, attributes={"explain.batch_rows": len(data)}):
            outcomes, timings = self.service.run(decoded, encodings)
        metrics.observe_generated_tokens(self.model_name, timings.tokens)
        responses: list[bytes] = []
        answers: list[dict[str, Any]] = []
        for index, outcome in enumerate(outcomes):
            started = time.perf_counter()
            with tracing.within(spans[index]), tracing.stage("encode"):
                answer = error_document(outcome.error) if outcome.error is not None else task.to_dict(outcome, config)
                answers.append(answer)
                if index in streams:  # its last event: the answer, or the error keeping the text sent
                    body = json_line(with_id(streams[index].final(answer), ids[index]))
                    context.set_response_content_type(index, JSON_LINES)
                else:
                    body = task.encode(outcome, config, ids[index])
                    context.set_response_content_type(index, CONTENT_TYPES[outcome.encoding])
            encode_seconds = time.perf_counter() - started
            with tracing.within(spans[index]):
                tracing.record_explanations([outcome])
            tracing.end_span(spans[index])
            started_stream = index in streams and streams[index].sent > 0  # its status went with its first event
            if outcome.error is not None and not started_stream:
                context.set_response_status(outcome.error.http_status, outcome.error.phrase, index)
            if outcome.error is not None:
                logger.info("%s: row %s failed: %s", self.model_name, ids[index], outcome.error.code)
                logger.debug("row %s: %s", ids[index], outcome.error.message)
            task.observe(self.model_name, decoded[index], outcome, timings, encode_seconds)
            if self.monitor is not None:
                self.monitor.observe(decoded[index], outcome)
            responses.append(body)
        refusals = record_rows(self.recorder, task=config.task, version=config.model_version, context=context,
                               data=data, answers=answers, ids=ids)  # fmt: skip
        for index, refusal in enumerate(refusals):
            if refusal is not None:  # the store failed and on_store_error is refuse: no record, no answer
                responses[index] = _refused(context, index, refusal, encodings[index], ids[index])
        logger.info("%s: batch of %d %s rows: %s", self.model_name, len(data), task.name, " ".join(ids))
        return responses
