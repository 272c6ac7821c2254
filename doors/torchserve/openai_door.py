"""The OpenAI API on TorchServe's door: ``POST /v1/chat/completions``, ``POST /v1/completions`` and ``GET /v1/models``
answered by the router (:mod:`doors.torchserve.router`) on the public inference port, each choice one
``POST /predictions/{model}`` to TorchServe behind it with the caller's token, translated both ways by
:mod:`serving_core.openai_api` (the same translation as the KServe door's).

The choices of a request go to TorchServe together (they batch there, each with its own seed), each its own
``/predictions`` call with its own ``X-Request-Id`` (:func:`choice_headers`), which TorchServe's handler records it
under: the answer's ``id`` is the request's id (the caller's ``X-Request-Id``, else one made here), echoed as the
answer's ``X-Request-Id``; a request of one choice is recorded under it, choice ``i`` of several under ``<id>-<i>``.
The caller's ``Authorization: Bearer <token>`` is passed as it is and TorchServe checks it; its refusal (400,
``InvalidKeyException``) is answered as OpenAI does, 401 ``unauthenticated``. TorchServe's own errors become the error
table's: 404 ``model_not_found``, 413 ``request_too_large``, 503 ``unavailable``, anything else ``internal``; a
choice's row error keeps its code and status.

``stream: true``: each choice is a streaming ``/predictions`` call (``"stream": true``: TorchServe sends its events as
the tokens are written, :mod:`serving_core.streaming`), and its events become OpenAI chunks as they arrive
(:mod:`serving_core.openai_api.streams`), the choices' chunks interleaved. An error before the first chunk is an HTTP
status as above; after it, an OpenAI ``error`` object event ends the stream.
"""

from __future__ import annotations

import http.client
import json
import logging
import queue
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any
from urllib.parse import quote, urlsplit

from forwarding import Reply, Upstream
from records import row_id
from records.ids import MAX_REQUEST_ID
from serving_core import tracing
from serving_core.errors import RowError
from serving_core.openai_api import (
    OpenAIError,
    Translated,
    chat_request,
    completion_answer,
    completion_request,
    model_list,
    opened,
    row_failure,
    streamed_events,
    trace_usage,
    with_deadline_header,
)
from serving_core.recording import REQUEST_ID_HEADER, door_request_id
from serving_core.streaming import read_lines

logger = logging.getLogger(__name__)

#: The routes answered here, by method and path.
_TRANSLATORS: dict[str, Callable[[Any], Translated]] = {
    "/v1/chat/completions": chat_request,
    "/v1/completions": completion_request,
}
MODELS_ROUTE = "/v1/models"
#: The most choices sent to TorchServe at once, over all requests (the router's own threads).
MAX_CONCURRENT_CHOICES = 32


class OpenAIRoutes:
    """The OpenAI API for the generation models ``models`` of the TorchServe behind the router."""

    def __init__(self, models: Iterable[str], predictions_path: Callable[[str, bytes], str], created: int) -> None:
        """Serve ``models``; ``predictions_path(path, body)`` is the router's routing of a ``/predictions`` request
        (to an explanation pool when it asks for an explanation); ``created`` is the models' ``created`` time."""
        self.models = tuple(models)
        self._path = predictions_path
        self._created = created
        self._pool = ThreadPoolExecutor(max_workers=MAX_CONCURRENT_CHOICES, thread_name_prefix="openai")

    def respond(
        self,
        method: str,
        path: str,
        authorization: str | None,
        body: bytes,
        upstream: Upstream,
        headers: Mapping[str, str] | None = None,
    ) -> Reply | None:
        """The answer of an OpenAI API request (``None`` for any other request: the router forwards it); ``headers``
        are the request's (its ``Explain-Deadline-Ms``)."""
        route = urlsplit(path).path.rstrip("/")
        if not (route == MODELS_ROUTE and method == "GET") and not (route in _TRANSLATORS and method == "POST"):
            return None
        try:
            if route == MODELS_ROUTE:
                self._check_token(authorization, upstream)
                return _json(200, model_list(self.models, self._created))
            return self._complete(_TRANSLATORS[route], body, authorization, upstream, headers)
        except OpenAIError as error:
            return _json(error.status, error.to_dict())
        except (OSError, http.client.HTTPException) as error:
            logger.warning("TorchServe did not answer an OpenAI API request: %s", error)
            unavailable = OpenAIError("unavailable", "the model server is not reachable right now; retry")
            return _json(unavailable.status, unavailable.to_dict())
        except Exception:
            logger.exception("OpenAI API request %s %s failed", method, route)
            return _json(500, OpenAIError("internal", "the request failed on the server; see the router log").to_dict())

    def refusal(self, path: str, status: int, message: str) -> Reply | None:
        """A refusal of a request to an OpenAI route by the router itself (a body over its bound) in OpenAI's shape;
        ``None`` for any other path."""
        route = urlsplit(path).path.rstrip("/")
        if route != MODELS_ROUTE and route not in _TRANSLATORS:
            return None
        code = "request_too_large" if status == 413 else "invalid_request"
        return _json(status, OpenAIError(code, message, status=status).to_dict())

    def _complete(self, translate: Callable[[Any], Translated], body: bytes, authorization: str | None,
                  upstream: Upstream, headers: Mapping[str, str] | None = None) -> Reply:  # fmt: skip
        try:
            translated = translate(with_deadline_header(json.loads(body), headers))
        except (UnicodeDecodeError, ValueError) as error:
            self._check_token(authorization, upstream)  # a wrong key is told so first, as OpenAI does
            raise OpenAIError("invalid_json", f"the body is not JSON: {error}") from None
        except OpenAIError:
            self._check_token(authorization, upstream)
            raise
        if translated.model not in self.models:
            self._check_token(authorization, upstream)  # a wrong token is told so first, as OpenAI does
            served = ", ".join(self.models) or "none"
            raise OpenAIError(
                "model_not_found", f"no generation model {translated.model!r} is served; served: {served}"
            )
        try:
            translated = replace(translated, id=door_request_id(headers))
            longest = choice_headers(translated, len(translated.documents) - 1)[REQUEST_ID_HEADER]
            if len(longest) > MAX_REQUEST_ID:  # each choice's id is a request id for TorchServe's handler
                raise RowError("invalid_request", f"{REQUEST_ID_HEADER} is too long for {len(translated.documents)} "
                               f"choices: {longest!r} is over {MAX_REQUEST_ID} characters")  # fmt: skip
        except RowError as error:
            self._check_token(authorization, upstream)
            raise OpenAIError(error.code, error.message) from None
        echoed = {REQUEST_ID_HEADER: translated.id}
        if translated.stream:
            streamed = opened(self._events(translated, authorization, upstream, headers))
            return Reply(200, streamed_events(translated, streamed), "text/event-stream", echoed)
        answers = self._answers(translated, authorization, upstream, headers)
        document = completion_answer(translated, answers)
        trace_usage(translated, answers)
        return _json(200, document, echoed)

    def _events(
        self,
        translated: Translated,
        authorization: str | None,
        upstream: Upstream,
        incoming: Mapping[str, str] | None = None,
    ) -> Iterator[tuple[int, Mapping[str, Any]]]:
        """Each choice's events ``(choice, event)`` as TorchServe streams them (each choice its own call, all at once,
        each with ``"stream": true`` and its record's id: :func:`choice_headers`); TorchServe's refusal of a choice
        (its token, its queue) is that choice's error event."""
        documents = translated.documents
        path = f"/predictions/{quote(translated.model, safe='')}"
        shared = {"Content-Type": "application/json", **tracing.outgoing_headers(incoming)}
        if authorization is not None:
            shared["Authorization"] = authorization
        arrived: queue.Queue[tuple[int, Mapping[str, Any] | None]] = queue.Queue()

        def read(document: int) -> None:
            body = json.dumps({**documents[document], "stream": True}, separators=(",", ":")).encode()
            headers = {**shared, **choice_headers(translated, document)}
            try:
                for event in _upstream_events(upstream, self._path(path, body), body, headers):
                    arrived.put((document, event))
            except OpenAIError as error:
                arrived.put((document, _error_event(error)))
            except (OSError, http.client.HTTPException) as error:
                logger.warning("TorchServe's stream broke: %s", error)
                unavailable = OpenAIError("unavailable", "the model server stopped answering; retry")
                arrived.put((document, _error_event(unavailable)))
            except Exception:
                logger.exception("reading TorchServe's stream failed")
                arrived.put((document, _error_event(OpenAIError("internal", "the stream failed on the router"))))
            finally:
                arrived.put((document, None))

        for document in range(len(documents)):
            self._pool.submit(read, document)
        left = len(documents)
        while left:
            document, event = arrived.get()
            if event is None:
                left -= 1
                continue
            yield document, event

    def _answers(
        self,
        translated: Translated,
        authorization: str | None,
        upstream: Upstream,
        incoming: Mapping[str, str] | None = None,
    ) -> list[dict[str, Any]]:
        """Each choice's generation answer from TorchServe (each choice its own call with its record's id,
        :func:`choice_headers`, all at once), each request in the trace of the router's span (or the caller's,
        ``incoming`` headers, while tracing is off).

        Raises:
            OpenAIError: TorchServe's refusal of a request (its token, its queue), as the error table says.
        """
        path = f"/predictions/{quote(translated.model, safe='')}"
        shared = {"Content-Type": "application/json", **tracing.outgoing_headers(incoming)}
        if authorization is not None:
            shared["Authorization"] = authorization

        def predict(choice: int) -> dict[str, Any]:
            body = json.dumps(translated.documents[choice], separators=(",", ":")).encode()
            headers = {**shared, **choice_headers(translated, choice)}
            response, payload = upstream.request("POST", self._path(path, body), body, headers)
            return _upstream_answer(response.status, payload)

        return list(self._pool.map(predict, range(len(translated.documents))))

    def _check_token(self, authorization: str | None, upstream: Upstream) -> None:
        """Raise ``unauthenticated`` unless TorchServe accepts the token (its ``/ping`` checks it)."""
        headers = {"Authorization": authorization} if authorization is not None else {}
        response, payload = upstream.request("GET", "/ping", None, headers)
        if response.status != 200:
            _upstream_answer(response.status, payload)


def _upstream_events(
    upstream: Upstream, path: str, body: bytes, headers: Mapping[str, str]
) -> Iterator[Mapping[str, Any]]:
    """The events of one streaming ``/predictions`` call, each as TorchServe sends it (JSON lines).

    Raises:
        OpenAIError: TorchServe's own refusal of the call (not an event), as :func:`_upstream_answer` says.
        OSError, http.client.HTTPException: if TorchServe cannot be reached or the stream breaks.
    """
    response, chunks = upstream.stream("POST", path, body, headers)
    if response.status == 200 and response.chunked:
        yield from read_lines(chunks)
        return
    payload = b"".join(chunks)
    try:
        document = json.loads(payload)
    except (UnicodeDecodeError, ValueError):
        document = None
    if isinstance(document, dict) and "event" in document:  # a row answered in one message: its answer or its error
        yield document
        return
    _upstream_answer(response.status, payload)  # raises for an error; a 200 that is not an event:
    raise OpenAIError("internal", "the model server answered a stream with a plain answer")


def choice_headers(translated: Translated, choice: int) -> dict[str, str]:
    """The ``X-Request-Id`` of a choice's ``/predictions`` call, the id TorchServe's handler records it under: the
    answer's ``id`` for a request of one choice, else ``<id>-<choice>``."""
    index = choice if len(translated.documents) > 1 else None
    return {REQUEST_ID_HEADER: row_id(translated.id, index)}


def _error_event(error: OpenAIError) -> dict[str, Any]:
    """A choice's error event (:mod:`serving_core.streaming`) for an :class:`OpenAIError`."""
    return {"event": "error", "error": {"code": error.code, "http_status": error.status, "message": error.message}}


def _json(status: int, document: Mapping[str, Any], headers: Mapping[str, str] | None = None) -> Reply:
    return Reply(status, json.dumps(document, separators=(",", ":")).encode("utf-8"), headers=dict(headers or {}))


def _upstream_answer(status: int, payload: bytes) -> dict[str, Any]:
    """TorchServe's answer to one choice: the generation answer, or its error as an :class:`OpenAIError`.

    Raises:
        OpenAIError: for a row error (its code and status) or TorchServe's own refusal.
    """
    try:
        document = json.loads(payload)
    except (UnicodeDecodeError, ValueError):
        document = None
    if status == 200 and isinstance(document, dict) and "error" not in document:
        return document
    if isinstance(document, Mapping):
        failure = row_failure(document)
        if failure is not None:
            raise failure
    message = str(document.get("message")) if isinstance(document, Mapping) else payload[:200].decode(errors="replace")
    kind = document.get("type") if isinstance(document, Mapping) else None
    if kind == "InvalidKeyException" or (status == 400 and message.startswith("Token Authori")):
        raise OpenAIError(
            "unauthenticated",
            "invalid API key: send the inference token (run/key_file.json, 'inference') as the key "
            "(Authorization: Bearer <token>)",
        )
    codes = {404: "model_not_found", 413: "request_too_large", 503: "unavailable"}
    raise OpenAIError(codes.get(status, "internal"), f"the model server answered {status}: {message}")
