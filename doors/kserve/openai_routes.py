"""The OpenAI API on the KServe door (and on Ray Serve replicas behind it): ``POST /v1/chat/completions``,
``POST /v1/completions`` and ``GET /v1/models`` added to KServe's FastAPI application, each request translated by
:mod:`serving_core.openai_api` (the same translation as TorchServe's door) and its choices served together by the
model's backend (:meth:`doors.kserve.kserve_model.ExplainModel.answer_documents`), in this process or on the replicas.

``GET /v1/models`` answers both protocols that own the route: OpenAI's list (``object``, ``data``: the generation
models) and KServe v1's (``models``: every model). The door has no token (it binds loopback, or sits behind the
deployment's proxy): any API key is accepted. ``stream: true``: each choice's tokens are sent as they are written
(:meth:`~doors.kserve.kserve_model.ExplainModel.stream_documents`, made into chunks by
:mod:`serving_core.openai_api.streams`), the explanation in its last chunk; on Ray Serve, a choice's chunks once it is
served.

The answer's ``id`` (every chunk's, in a stream) is the request's id, echoed as ``X-Request-Id``: the caller's
``X-Request-Id`` when it sent one, else one made here. Each choice is recorded (:func:`choice_records`): a request of
one choice under that id, else choice ``i`` under ``<id>-<i>``; a stream's records are committed before the last
chunk of any choice leaves.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from records import new_request_id
from serving_core.openai_api import (
    ChunkStream,
    OpenAIError,
    Translated,
    chat_request,
    completion_answer,
    completion_request,
    model_list,
    row_failure,
    trace_usage,
    with_deadline_header,
)
from serving_core.openai_api.streams import DONE, sse
from serving_core.recording import REQUEST_ID_HEADER, TRACEPARENT_HEADER, header

from .kserve_model import ExplainModel, RequestError, RetryableError
from .row_records import RecordedRow, RequestRecords


def add_openai_routes(app: FastAPI, models: Mapping[str, ExplainModel]) -> None:
    """Add the OpenAI API's routes to ``app`` for ``models`` (call before KServe registers its own routes, so that
    ``GET /v1/models`` is this one)."""
    created = int(time.time())
    generation = {name: model for name, model in models.items() if model.settings.config.task == "generation"}

    async def chat_completions(request: Request) -> Response:
        return await _complete(request, chat_request, generation)

    async def completions(request: Request) -> Response:
        return await _complete(request, completion_request, generation)

    async def list_models() -> JSONResponse:
        document = model_list(generation, created)
        document["models"] = list(models)  # KServe v1's answer on the same route
        return JSONResponse(document)

    app.add_api_route("/v1/chat/completions", chat_completions, methods=["POST"])
    app.add_api_route("/v1/completions", completions, methods=["POST"])
    app.add_api_route("/v1/models", list_models, methods=["GET"])


async def _complete(
    request: Request, translate: Callable[[Any], Translated], models: Mapping[str, ExplainModel]
) -> Response:
    """One OpenAI completion request, answered whole or as server-sent events; errors in OpenAI's shape."""
    try:
        try:
            body = json.loads(await request.body())
        except (UnicodeDecodeError, ValueError) as error:
            raise OpenAIError("invalid_json", f"the body is not JSON: {error}") from None
        except RequestError as error:  # the door's body limit, raised while the body is read
            raise OpenAIError(error.error.code, error.error.message) from None
        translated = replace(translate(with_deadline_header(body, dict(request.headers))),
                             id=_request_id(request))  # fmt: skip
        model = models.get(translated.model)
        if model is None:
            served = ", ".join(models) or "none"
            raise OpenAIError(
                "model_not_found", f"no generation model {translated.model!r} is served; served: {served}"
            )
        documents, index = translated.distinct()
        records = choice_records(translated, index, request.headers)
        if translated.stream:
            return await _stream(translated, model, documents, index, records)
        try:
            answered = await model.answer_documents(documents, records)
        except RetryableError as error:
            raise OpenAIError("unavailable", str(error.details)) from None
        answers = [answered[position] for position in index]
        document = completion_answer(translated, answers)
        trace_usage(translated, answers)
        return JSONResponse(document)
    except OpenAIError as error:
        return JSONResponse(error.to_dict(), status_code=error.status)


def _request_id(request: Request) -> str:
    """The request's id: its ``X-Request-Id`` (:class:`~doors.kserve.request_ids.RequestIds` puts one there)."""
    return request.headers.get(REQUEST_ID_HEADER) or new_request_id()


def choice_records(translated: Translated, index: Sequence[int], headers: Mapping[str, str]) -> RequestRecords:
    """The records of an OpenAI request: one per choice, under the answer's ``id`` (one choice) or
    ``<id>-<choice index>``, each answered by its served document (``index``: :meth:`Translated.distinct`'s) and
    keeping its generation document as the input."""
    choices = len(translated.documents)
    rows = tuple(
        RecordedRow(source, choice if choices > 1 else None, dict(translated.documents[choice]))
        for choice, source in enumerate(index)
    )
    return RequestRecords(translated.id, rows, header(headers, TRACEPARENT_HEADER), refuse=False)


async def _stream(
    translated: Translated,
    model: ExplainModel,
    documents: Sequence[Mapping[str, Any]],
    index: Sequence[int],
    records: RequestRecords,
) -> Response:
    """The server-sent events of a streamed request, each chunk sent as its event comes; an error before the first
    chunk is an HTTP status (raised), after it an OpenAI ``error`` object ends the stream.

    Raises:
        OpenAIError: for an error before the first chunk.
    """
    events = model.stream_documents([{**document, "stream": True} for document in documents], records)
    try:
        first = await anext(events, None)
    except RetryableError as error:
        raise OpenAIError("unavailable", str(error.details)) from None
    if first is not None:
        failure = row_failure(first[1])
        if failure is not None:
            await events.aclose()
            raise failure

    async def chunks() -> AsyncIterator[bytes]:
        stream = ChunkStream(translated)
        pending = [] if first is None else [first]
        try:
            while True:
                document, event = pending.pop() if pending else await anext(events)
                for choice in (choice for choice, source in enumerate(index) if source == document):
                    for chunk in stream.event(choice, event):
                        yield sse(chunk)
                if stream.failed:
                    return
        except StopAsyncIteration:
            yield DONE
        except RetryableError as error:
            yield sse(OpenAIError("unavailable", str(error.details)).to_dict())
        finally:
            await events.aclose()

    return StreamingResponse(chunks(), media_type="text/event-stream")
