"""The OpenAI API on TorchServe's door: ``POST /v1/chat/completions``, ``POST /v1/completions`` and ``GET /v1/models``
answered by the router (:mod:`doors.torchserve.router`) on the public inference port, each choice one
``POST /predictions/{model}`` to TorchServe behind it with the caller's token, translated both ways by
:mod:`serving_core.openai_api` (the same translation as the KServe door's).

The choices of a request go to TorchServe together (they batch there, each with its own seed), identical ones once.
The caller's ``Authorization: Bearer <token>`` is passed as it is and TorchServe checks it; its refusal (400,
``InvalidKeyException``) is answered as OpenAI does, 401 ``unauthenticated``. TorchServe's own errors become the error
table's: 404 ``model_not_found``, 413 ``request_too_large``, 503 ``unavailable``, anything else ``internal``; a
choice's row error keeps its code and status. A stream is sent once TorchServe has answered every choice (TorchServe
answers a row whole), so an error is always an HTTP status, never a broken stream.
"""

from __future__ import annotations

import http.client
import json
import logging
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import quote, urlsplit

from forwarding import Reply, Upstream
from serving_core import tracing
from serving_core.openai_api import (
    OpenAIError,
    Translated,
    chat_request,
    completion_answer,
    completion_request,
    events,
    model_list,
    row_failure,
    stream_chunks,
    trace_usage,
    with_deadline_header,
)

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
        answers = self._answers(translated, authorization, upstream, headers)
        if translated.stream:
            chunks = stream_chunks(translated, answers)
            trace_usage(translated, answers)
            return Reply(200, events(chunks), "text/event-stream")
        document = completion_answer(translated, answers)
        trace_usage(translated, answers)
        return _json(200, document)

    def _answers(
        self,
        translated: Translated,
        authorization: str | None,
        upstream: Upstream,
        incoming: Mapping[str, str] | None = None,
    ) -> list[dict[str, Any]]:
        """Each choice's generation answer from TorchServe (identical documents sent once, all at once), each
        request in the trace of the router's span (or the caller's, ``incoming`` headers, while tracing is off).

        Raises:
            OpenAIError: TorchServe's refusal of a request (its token, its queue), as the error table says.
        """
        documents, index = translated.distinct()
        bodies = [json.dumps(document, separators=(",", ":")).encode() for document in documents]
        path = f"/predictions/{quote(translated.model, safe='')}"
        headers = {"Content-Type": "application/json", **tracing.outgoing_headers(incoming)}
        if authorization is not None:
            headers["Authorization"] = authorization

        def predict(body: bytes) -> dict[str, Any]:
            response, payload = upstream.request("POST", self._path(path, body), body, headers)
            return _upstream_answer(response.status, payload)

        answers = list(self._pool.map(predict, bodies))
        return [answers[position] for position in index]

    def _check_token(self, authorization: str | None, upstream: Upstream) -> None:
        """Raise ``unauthenticated`` unless TorchServe accepts the token (its ``/ping`` checks it)."""
        headers = {"Authorization": authorization} if authorization is not None else {}
        response, payload = upstream.request("GET", "/ping", None, headers)
        if response.status != 200:
            _upstream_answer(response.status, payload)


def _json(status: int, document: Mapping[str, Any]) -> Reply:
    return Reply(status, json.dumps(document, separators=(",", ":")).encode("utf-8"))


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
