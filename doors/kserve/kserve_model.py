"""The KServe door: a ``kserve.Model`` answering OIP v2 ``infer`` (REST and gRPC, with the explain extension) and
KServe v1 ``:predict`` / ``:explain``, over a :class:`~doors.kserve.backends.Backend` (in-process or Ray Serve).

Thin by design: KServe's request types become :class:`~doors.kserve.oip.OipRequest` at the edge, the task codec
(:mod:`doors.kserve.oip`) or the v1 functions (:mod:`doors.kserve.v1`) turn them into rows, the backend serves them, and
the outcomes go back the same way. A request none of whose rows could be served raises :class:`RequestError`, which
the server maps to the error table's HTTP status and gRPC code; a request with some good rows is answered, its
failed rows named in the ``error_code``/``error_message`` outputs (v1: their ``error`` objects). Every task is served
the same way: the model's task has an OIP codec (its own, or the generic codec of JSON documents:
:func:`doors.kserve.oip.codec_for`) and the v1 functions hand its JSON documents to the task
(:meth:`serving_core.task.Task.decode_document`) and use its answer. The project's explanation metrics
(``explain_stage_seconds`` and the others of :mod:`serving_core.metrics`) are recorded here, in the door's process,
for either backend, next to KServe's own ``request_*_seconds`` histograms on ``/metrics``. The LLM routes beside OIP
(the OpenAI API, the generate extension) serve JSON documents (:meth:`ExplainModel.answer_documents`) or their streams
of events (:meth:`ExplainModel.stream_documents`).

Every request has an id (:meth:`ExplainModel.request_id`: an OIP request's own ``id``, else its ``X-Request-Id``,
else one made), which its answer carries (OIP ``id``, v1 ``id`` and each instance's record id in ``ids``), and its
answered rows, errors included, are recorded (:mod:`doors.kserve.row_records`) before the answer (or a stream's last
event) leaves: in this process for the in-process backend, on the replica that served them for Ray Serve.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Any

import grpc
import numpy as np
from grpc_interceptor.exceptions import GrpcException
from kserve import Model
from kserve.errors import InvalidInput
from kserve.protocol.infer_type import InferOutput, InferRequest, InferResponse, to_http_parameters

from records import new_request_id, records_settings
from records.recorder import Recorder
from serving_core import metrics, tracing, wire
from serving_core.deadlines import headers_deadline
from serving_core.errors import RowError
from serving_core.recording import REQUEST_ID_HEADER, door_request_id, refused_answers, served_version
from serving_core.streaming import RowStream, answer_events
from serving_core.task import get_task

from . import oip, v1
from .backends import Backend, UnavailableError
from .batching import Served
from .request_ids import oip_request_id
from .row_records import RequestRecords, commit

logger = logging.getLogger(__name__)


class RequestError(GrpcException):
    """A request answered with an error of the error table: its HTTP status on REST, its gRPC code on gRPC."""

    def __init__(self, error: RowError) -> None:
        """Wrap the row error (``details`` is ``[code] message``)."""
        super().__init__(f"[{error.code}] {error.message}", grpc.StatusCode[error.kind.grpc_code])
        self.error = error
        self.http_status = error.http_status

    def to_dict(self) -> dict[str, Any]:
        """The REST error body: KServe's ``{"error": message}`` plus the error table's ``code``."""
        return {"error": self.details, "code": self.error.code}


class RetryableError(GrpcException):
    """The request could not be served now (a replica died with it in flight): HTTP 503 / gRPC ``UNAVAILABLE``."""

    http_status = 503

    def __init__(self, message: str) -> None:
        """Create the error."""
        super().__init__(message, grpc.StatusCode.UNAVAILABLE)

    def to_dict(self) -> dict[str, Any]:
        """The REST error body."""
        return {"error": self.details, "code": "unavailable"}


def to_oip_request(request: InferRequest) -> oip.OipRequest:
    """KServe's request (from REST JSON, REST binary or gRPC) as plain tensors and parameters.

    Raises:
        RowError: ``invalid_request`` for a repeated input name, an unsupported datatype or data that does not
            fill the shape.
    """
    inputs: dict[str, oip.Tensor] = {}
    for tensor in request.inputs:
        if tensor.name in inputs:
            raise RowError("invalid_request", f"input {tensor.name!r} is given twice")
        try:
            data = tensor.as_numpy().reshape(-1).tolist()
            inputs[tensor.name] = oip.Tensor(tensor.name, tensor.datatype, tuple(int(n) for n in tensor.shape), data)
        except (ValueError, TypeError, InvalidInput) as error:
            raise RowError("invalid_request", f"input {tensor.name!r}: {error}") from None
    return oip.OipRequest(inputs, to_http_parameters(request.parameters or {}))


#: OIP datatype → the numpy dtype of its elements (BYTES: Python ``str``/``bytes`` objects).
_NUMPY = {"BYTES": np.object_, "FP32": np.float32, "FP64": np.float64, "INT64": np.int64, "INT32": np.int32,
          "BOOL": np.bool_}  # fmt: skip


def _rest_document(request: InferRequest) -> dict[str, Any] | None:
    """An OIP request as its REST JSON document (what a record keeps of a request refused as a whole); None when it
    cannot be written as JSON (binary tensors)."""
    try:
        document, _ = request.to_rest()
        json.dumps(document)  # a gRPC request's tensors may hold bytes or arrays, which a JSON record cannot keep
    except Exception:  # a request the door refused may be malformed in any way: keep no input then
        return None
    return document if isinstance(document, dict) else None


def to_infer_response(name: str, request: InferRequest, outputs: Sequence[oip.Tensor]) -> InferResponse:
    """KServe's response for the outputs, in the request's transport and binary conventions (:func:`infer_output`)."""
    return InferResponse(
        response_id=request.id or str(uuid.uuid4()),
        model_name=name,
        infer_outputs=[infer_output(tensor, request) for tensor in outputs],
        from_grpc=request.from_grpc,
        use_binary_outputs=request.use_binary_outputs,
        requested_outputs=request.request_outputs,
    )


def infer_output(tensor: oip.Tensor, request: InferRequest) -> InferOutput:
    """One output as KServe writes it for ``request``.

    REST: a numpy array of the tensor's datatype and shape, which KServe writes as JSON ``data`` or, for an output
    asked for in the binary data extension (``binary_data`` on a requested output, the request parameter
    ``binary_data_output``), as ``binary_data_size`` bytes after the JSON (``Inference-Header-Content-Length``), an
    empty tensor included. gRPC: a list in the typed ``contents``, or, when the request sent raw inputs (as
    ``tritonclient.grpc`` does), the tensor's bytes in ``raw_output_contents`` (an empty tensor included: one entry
    per output).
    """
    shape = list(tensor.shape)
    if not request.from_grpc:
        return InferOutput(name=tensor.name, shape=shape, datatype=tensor.datatype, data=_array(tensor))
    output = InferOutput(name=tensor.name, shape=shape, datatype=tensor.datatype, data=list(tensor.data))
    if request.use_binary_outputs:
        output.set_data_from_numpy(_array(tensor), binary_data=True)
    return output


def _array(tensor: oip.Tensor) -> np.ndarray:
    """The tensor's elements as a numpy array of its datatype and shape."""
    return np.array(list(tensor.data), dtype=_NUMPY[tensor.datatype]).reshape(tensor.shape)


class ExplainModel(Model):
    """One served model (``kserve.Model``) over its backend."""

    def __init__(self, backend: Backend) -> None:
        """Name the model after its settings; :meth:`load` loads the backend."""
        super().__init__(backend.settings.name)
        self.backend = backend
        self.settings = backend.settings
        self.head_type = "single_label"
        self.ready = False
        self.recorder: Recorder | None = None
        self.version: str | None = None

    def load(self) -> bool:
        """Load the backend's model (every task has an OIP codec: its own, or the generic one of JSON documents) and
        open its recorder (its ``records:`` section, else the deployment's ``EXPLAIN_RECORDS``). Where the backend
        records the rows where it serves them (Ray Serve replicas), the door's recorder writes only the requests it
        refuses as a whole (:meth:`_record_refusal`)."""
        section = self.settings.config.records
        if self.backend.records:
            records_settings(section, where=f"model {self.name}: records")  # refused here, before the replicas start
        self.recorder = Recorder.open(self.name, section)
        self.version = served_version(self.settings.archive)
        self.head_type = self.backend.load()
        self.ready = True
        return self.ready

    def stop(self) -> None:
        """Release the backend (KServe calls it when the model is unloaded)."""
        self.backend.close()

    def get_input_types(self) -> list[dict[str, Any]]:
        """OIP model metadata: the inputs."""
        return [spec.to_dict() for spec in oip.codec_for(self.settings.config).input_specs(self.settings.config)]

    def get_output_types(self) -> list[dict[str, Any]]:
        """OIP model metadata: the outputs."""
        codec = oip.codec_for(self.settings.config)
        return [spec.to_dict() for spec in codec.output_specs(self.settings.config, self.head_type)]

    async def predict(self, payload: Any, headers: dict[str, str] | None = None) -> Any:
        """OIP ``infer`` (an ``InferRequest``, over REST or gRPC) or v1 ``:predict`` (a dict); an
        ``Explain-Deadline-Ms`` header (gRPC: metadata) is every row's deadline."""
        if isinstance(payload, InferRequest):
            return await self._infer(payload, headers)
        return await self._v1(payload, explain=False, headers=headers)

    async def explain(self, payload: Any, headers: dict[str, str] | None = None) -> Any:
        """v1 ``:explain``: every instance explained."""
        return await self._v1(payload, explain=True, headers=headers)

    async def _infer(self, request: InferRequest, headers: Mapping[str, str] | None = None) -> InferResponse:
        config = self.settings.config
        request_id = self.request_id(oip_request_id(request.id, headers), headers)
        try:
            with tracing.stage("decode"):
                received = to_oip_request(request)
                rows = oip.decode_request(received, config, headers_deadline(headers))
        except RowError as error:
            metrics.observe_error(self.name, None, error.code)
            await self._record_refusal(request_id, error, _rest_document(request), headers)
            raise RequestError(error) from None
        records = RequestRecords.of(request_id, oip.row_requests(received, len(rows)), headers)
        served = await self._serve(rows, records)
        started = time.perf_counter()
        try:
            with tracing.stage("encode"):
                outputs = oip.encode_response(served.outcomes, config)
        except RowError as error:
            await self._commit(served, records)
            raise RequestError(error) from None
        finally:
            self._observe(rows, served, time.perf_counter() - started)
        await self._commit(served, records)
        request.id = request_id  # the answer's id (gRPC too): the record's, or its rows' ``<id>-<index>``
        return to_infer_response(self.name, request, outputs)

    async def _v1(self, payload: Any, explain: bool, headers: Mapping[str, str] | None = None) -> dict[str, Any]:
        config = self.settings.config
        request_id = self.request_id(None, headers)
        try:
            deadline = headers_deadline(headers)
            with tracing.stage("decode"):
                rows = get_task(config.task).with_deadlines(v1.decode_instances(payload, config, explain), deadline)
        except RowError as error:
            metrics.observe_error(self.name, None, error.code)
            await self._record_refusal(request_id, error, payload if isinstance(payload, Mapping) else None, headers)
            raise RequestError(error) from None
        records = RequestRecords.of(request_id, v1.instance_documents(payload, config), headers)
        served = await self._serve(rows, records)
        started = time.perf_counter()
        try:
            with tracing.stage("encode"):
                answer = v1.encode_predictions(served.outcomes, config, explain)
        except RowError as error:
            await self._commit(served, records)
            raise RequestError(error) from None
        finally:
            self._observe(rows, served, time.perf_counter() - started)
        await self._commit(served, records)
        return {"id": request_id, "ids": records.ids, **answer}

    def request_id(self, given: str | None, headers: Mapping[str, Any] | None) -> str:
        """A request's id: ``given`` (an OIP request's own id), else its ``X-Request-Id``, else a new one.

        Raises:
            RequestError: ``invalid_request`` when the id is not a valid one (path-like, too long).
        """
        try:
            return door_request_id({REQUEST_ID_HEADER: given} if given else headers)
        except RowError as error:
            raise RequestError(error) from None

    async def answer_documents(
        self, documents: Sequence[Mapping[str, Any]], records: RequestRecords | None = None
    ) -> list[dict[str, Any]]:
        """JSON documents of the model's task (what the TorchServe door takes as a body) served together, each one's
        JSON answer as that door gives it (a failed row: ``{"error": {...}}``): how the OpenAI API's choices are
        served (:mod:`doors.kserve.openai_routes`). Their records: ``records`` (default: one per document under a
        new request id); a refused record makes its document's answer ``records_unavailable``.

        Raises:
            RetryableError: if no replica could serve them now.
        """
        config = self.settings.config
        task = get_task(config.task)
        if records is None:
            records = RequestRecords.of(new_request_id(), [dict(document) for document in documents], refuse=False)
        rows: list[Any] = []
        for document in documents:
            try:
                rows.append(task.decode_document(document, False, config))
            except RowError as error:
                rows.append(error)
        served = await self._serve(rows, records)
        started = time.perf_counter()
        answers = self._answers(served)
        self._observe(rows, served, time.perf_counter() - started)
        refusals = await self._commit(served, records, answers)
        return [dict(answer) for answer in refused_answers(answers, refusals)]

    async def stream_documents(
        self, documents: Sequence[Mapping[str, Any]], records: RequestRecords | None = None
    ) -> AsyncGenerator[tuple[int, dict[str, Any]], None]:
        """JSON documents of the model's task served together as streams (:mod:`serving_core.streaming`): each
        document's events ``(document, event)`` as they are written, its last event once it is served (a document
        that does not stream, or a backend that cannot: its answer's events then). Their records (``records``, as
        :meth:`answer_documents`) are committed before any document's last event leaves; a refused record makes
        that last event a ``records_unavailable`` error event.

        Raises:
            RetryableError: if no replica could serve them now.
        """
        config = self.settings.config
        task = get_task(config.task)
        if records is None:
            records = RequestRecords.of(new_request_id(), [dict(document) for document in documents], refuse=False)
        loop = asyncio.get_running_loop()
        arrived: asyncio.Queue[tuple[int, dict[str, Any]]] = asyncio.Queue()
        rows: list[Any] = []
        streams: dict[int, RowStream] = {}
        for index, document in enumerate(documents):
            try:
                row = task.decode_document(document, False, config)
            except RowError as error:
                rows.append(error)
                continue
            if self.backend.streams and task.streams(row):

                def send(event: dict[str, Any], index: int = index) -> None:
                    loop.call_soon_threadsafe(arrived.put_nowait, (index, event))

                streams[index] = RowStream(send)
                row = task.with_listener(row, streams[index].listener)
            rows.append(row)
        serving = asyncio.ensure_future(self._serve(rows, records))
        while True:
            getter = asyncio.ensure_future(arrived.get())
            await asyncio.wait({getter, serving}, return_when=asyncio.FIRST_COMPLETED)
            if not getter.done():
                getter.cancel()
                break
            yield getter.result()
        while not arrived.empty():  # sent before the batch was answered
            yield arrived.get_nowait()
        served = serving.result()
        started = time.perf_counter()
        answers = self._answers(served)
        self._observe(rows, served, time.perf_counter() - started)
        refusals = await self._commit(served, records, answers)
        for index, answer in enumerate(refused_answers(answers, refusals)):
            for event in [streams[index].final(answer)] if index in streams else answer_events(answer):
                yield index, event

    async def _serve(self, rows: list[Any], records: RequestRecords) -> Served:
        logger.debug("%s: request %s, %d rows", self.name, records.request_id, len(rows))
        try:
            served = await self.backend.serve(rows, records)
        except UnavailableError as error:
            logger.warning("%s: request %s not served: %s", self.name, records.request_id, error)
            raise RetryableError(str(error)) from None
        failed = [outcome.error.code for outcome in served.outcomes if outcome.error is not None]
        if failed:
            logger.info("%s: request %s: %d of %d rows failed (%s)", self.name, records.request_id, len(failed),
                        len(rows), ", ".join(sorted(set(failed))))  # fmt: skip
        if served.first:
            metrics.observe_batch(self.name, served.batch_rows)
            metrics.observe_generated_tokens(self.name, served.timings.tokens)
        return served

    def _answers(self, served: Served) -> list[dict[str, Any]]:
        """Each served row's JSON answer document (a failed row: ``{"error": {...}}``)."""
        config = self.settings.config
        task = get_task(config.task)
        return [
            wire.error_document(outcome.error) if outcome.error is not None else task.to_dict(outcome, config)
            for outcome in served.outcomes
        ]

    async def _commit(
        self, served: Served, records: RequestRecords, answers: Sequence[Mapping[str, Any]] | None = None
    ) -> list[RowError | None]:
        """The request's records committed before its answer leaves: by the backend where its rows were served (a
        Ray Serve replica: ``served.refusals``), else here (:func:`doors.kserve.row_records.commit`), in a thread: the
        wait for the commit leaves the event loop free for the door's other requests, whose batches then share the
        writer's transactions (group commit, :mod:`records.writer`).

        Returns:
            Per served row, None or the error to answer instead (``records_unavailable``).

        Raises:
            RequestError: the store's refusal for the whole request, when ``records.refuse``.
        """
        refusals = served.refusals
        if refusals is None:
            if self.recorder is None:
                return [None] * len(served.outcomes)
            committed: list[RowError | None] = await asyncio.to_thread(
                commit, self.recorder, records, self._answers(served) if answers is None else answers,
                task=self.settings.config.task, door=self.backend.door, version=self.version,
            )  # fmt: skip
            refusals = committed
        refused = next((refusal for refusal in refusals if refusal is not None), None)
        if records.refuse and refused is not None:
            raise RequestError(refused)
        return list(refusals)

    async def _record_refusal(
        self, request_id: str, error: RowError, received: Mapping[str, Any] | None, headers: Mapping[str, str] | None
    ) -> None:
        """A request refused as a whole (it could not be decoded) is an answered row too: its error is recorded under
        the request's id, with what it sent (as the payload setting keeps it), before the refusal leaves. A store that
        fails here is logged and counted by the recorder; the caller gets the request's own error."""
        if self.recorder is None:
            return
        records = RequestRecords.of(request_id, [dict(received) if received is not None else None], headers)
        try:
            await asyncio.to_thread(
                commit, self.recorder, records, [wire.error_document(error)],
                task=self.settings.config.task, door=self.backend.door, version=self.version,
            )  # fmt: skip
        except Exception:  # the refusal leaves whatever its record became: it must never turn into a server error
            logger.exception("%s: request %s: its refusal could not be recorded", self.name, request_id)

    def _observe(self, rows: Sequence[Any], served: Served, encode: float) -> None:
        """Record each row's error or stages (the encode time shared equally by the request's rows), and hand it to the
        model's monitor."""
        task = get_task(self.settings.config.task)
        share = encode / max(len(served.outcomes), 1)
        monitor = self.backend.monitor
        for row, outcome in zip(rows, served.outcomes, strict=True):
            task.observe(self.name, row, outcome, served.timings, share)
            if monitor is not None:
                monitor.observe(row, outcome)
