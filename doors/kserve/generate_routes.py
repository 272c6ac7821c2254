"""The OIP generate extension on the KServe door, for causal LMs (Triton's shape; KServe 0.21's server has no generate
route of its own): ``POST /v2/models/{model}/generate`` answers a request whole,
``POST /v2/models/{model}/generate_stream`` as server-sent events of JSON documents, one per event as the tokens are
written (docs/SERVING.md, "Streaming").

The request is a JSON object: ``text_input`` (the prompt; or the generation task's own ``prompt``, ``messages``,
``documents``), ``parameters`` (``max_tokens`` or ``max_new_tokens``, ``temperature``, ``top_p``, ``top_k``, ``seed``,
``do_sample``, ``stop``, ``logprobs``), an optional ``id``, and any other field of the generation task's JSON document
(``explain``, ``deadline_ms``; or the ``Explain-Deadline-Ms`` header). Each answer document has ``id`` (the request's
``id``, else its ``X-Request-Id``: the id its record has), ``model_name``, ``model_version`` and ``text_output`` (the
whole text, or in a stream the event's new characters), then the generation answer's fields (a stream: the event's,
with ``event``: ``token``, then ``answer`` with the explanation). An error is ``{"error": message, "code": ...}``
under the error table's HTTP status before the first event, the last event of a stream after it (with the ``text``
sent so far). The request is recorded (its input: the generation document it became) before its answer, or its
stream's last event, leaves.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from serving_core.errors import RowError
from serving_core.openai_api import OpenAIError, with_deadline_header
from serving_core.openai_api.streams import sse
from serving_core.streaming import ERROR

from .kserve_model import ExplainModel, RequestError, RetryableError
from .row_records import RequestRecords

#: ``parameters`` → the generation document's fields (the sampling settings go into its ``generation``).
_FIELDS = {"max_tokens": "max_new_tokens", "max_new_tokens": "max_new_tokens", "stop": "stop", "logprobs": "logprobs"}
_SAMPLING = ("do_sample", "temperature", "top_k", "top_p", "seed")


def generation_document(request: Any) -> dict[str, Any]:
    """The generation task's JSON document of a generate request.

    Raises:
        RowError: ``invalid_request`` for a request that is not an object, or an unknown parameter.
    """
    if not isinstance(request, Mapping):
        raise RowError("invalid_request", "a generate request is a JSON object: {'text_input': ..., 'parameters': {}}")
    document = {key: value for key, value in request.items() if key not in ("text_input", "parameters", "id")}
    if "text_input" in request:
        document["prompt"] = request["text_input"]
    parameters = request.get("parameters") or {}
    if not isinstance(parameters, Mapping):
        raise RowError("invalid_request", "'parameters' must be an object")
    sampling = dict(document.get("generation") or {})
    for name, value in parameters.items():
        if name in _FIELDS:
            document[_FIELDS[name]] = value
        elif name in _SAMPLING:
            sampling[name] = value
        elif name != "stream":
            known = ", ".join([*_FIELDS, *_SAMPLING, "stream"])
            raise RowError("invalid_request", f"unknown generate parameter {name!r}; known: {known}")
    if sampling:
        document["generation"] = sampling
    return document


def add_generate_routes(app: FastAPI, models: Mapping[str, ExplainModel]) -> None:
    """Add ``/v2/models/{model}/generate`` and ``/generate_stream`` to ``app`` for the generation models of
    ``models``."""
    generation = {name: model for name, model in models.items() if model.settings.config.task == "generation"}

    async def generate(model_name: str, request: Request) -> Response:
        return await _answer(model_name, request, generation, stream=False)

    async def generate_stream(model_name: str, request: Request) -> Response:
        return await _answer(model_name, request, generation, stream=True)

    app.add_api_route("/v2/models/{model_name}/generate", generate, methods=["POST"])
    app.add_api_route("/v2/models/{model_name}/generate_stream", generate_stream, methods=["POST"])


def _error(error: RowError) -> JSONResponse:
    return JSONResponse({"error": error.message, "code": error.code}, status_code=error.http_status)


def _document(name: str, request_id: str, event: Mapping[str, Any], text: str) -> dict[str, Any]:
    """One answer document: the request's ``id``, the model, ``text_output``, then the event's (or answer's)
    fields; an error: its ``error`` message and ``code``, and the ``text`` sent before it."""
    if isinstance(event.get("error"), Mapping):
        error = event["error"]
        return {"id": request_id, "model_name": name, "model_version": "", "error": error.get("message"),
                "code": error.get("code"), "event": ERROR, "text": event.get("text", "")}  # fmt: skip
    return {"id": request_id, "model_name": name, "model_version": "", "text_output": text, **event}


async def _answer(name: str, request: Request, models: Mapping[str, ExplainModel], stream: bool) -> Response:
    model = models.get(name)
    try:
        if model is None:
            raise RowError("model_not_found", f"no generation model {name!r} is served; served: {', '.join(models)}")
        try:
            body = json.loads(await request.body())
        except (UnicodeDecodeError, ValueError) as error:
            raise RowError("invalid_json", f"the body is not JSON: {error}") from None
        except RequestError as error:  # the door's body limit, raised while the body is read
            raise error.error from None
        try:
            document = generation_document(with_deadline_header(body, dict(request.headers)))
        except OpenAIError as error:
            raise RowError(error.code, error.message) from None
        given = body.get("id") if isinstance(body.get("id"), str) else None
        request_id = model.request_id(given, request.headers)
        records = RequestRecords.of(request_id, [dict(document)], request.headers, refuse=False)
        if not stream:
            answer = (await model.answer_documents([document], records))[0]
            if isinstance(answer.get("error"), Mapping):
                raise RowError(str(answer["error"]["code"]), str(answer["error"]["message"]))
            return JSONResponse(_document(name, request_id, answer, answer["text"]))
        events = model.stream_documents([{**document, "stream": True}], records)
        first = await anext(events, None)
    except RowError as error:
        return _error(error)
    except RequestError as error:  # an invalid id
        return _error(error.error)
    except RetryableError as error:
        return JSONResponse(error.to_dict(), status_code=error.http_status)
    if first is not None and first[1].get("event") == ERROR:
        await events.aclose()
        failed = first[1]["error"]
        return JSONResponse({"error": failed.get("message"), "code": failed.get("code")},
                            status_code=int(failed.get("http_status") or 500))  # fmt: skip

    async def chunks() -> AsyncIterator[bytes]:
        pending = [] if first is None else [first]
        try:
            while True:
                _, event = pending.pop() if pending else await anext(events)
                text = str(event.get("text", "")) if event.get("event") == "token" else ""
                yield sse(_document(name, request_id, event, text))
        except StopAsyncIteration:
            return
        except RetryableError as error:
            yield sse({"id": request_id, "model_name": name, "model_version": "", **error.to_dict(), "event": ERROR})
        finally:
            await events.aclose()

    return StreamingResponse(chunks(), media_type="text/event-stream")
