"""Answering a batch of a job's requests as the online routes answer them, through the serving core's batched path.

A loaded model (:class:`LoadedModel`: its task and service) answers a list of requests together: each request's rows
are decoded by the task (``task.decode_row({"body": document}, explain_route, config)``, as every door does), all rows
are served by ``service.run`` in slices of the batch size, and each answer is written as its route writes it:

- ``/predictions/<model>``, ``/explanations/<model>``: the task's JSON document (``task.to_dict``) with status 200, or
  a failed row's ``{"error": {...}}`` (:func:`serving_core.wire.error_document`) with its error table status, with
  the answer's ``id`` (the line's ``request_id``) as the route writes it (:func:`serving_core.wire.with_id`);
- ``/v1/chat/completions``, ``/v1/completions``: the request translated by :mod:`serving_core.openai_api` into one
  generation document per distinct choice, and the choices' answers assembled into OpenAI's ``chat.completion`` /
  ``text_completion`` object, or OpenAI's error object with its status. The answer's ``id`` is
  the line's ``request_id``, as the online routes answer a request of that ``X-Request-Id`` (so that a rerun or a Ray
  run writes the same line).

Streaming (``"stream": true``) is refused: a batch line is answered whole.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from serving_core import wire
from serving_core.errors import RowError
from serving_core.loading import worker_device
from serving_core.openai_api import OpenAIError, Translated, chat_request, completion_answer, completion_request
from serving_core.task import Service, Task, get_task
from serving_core.wire import Encoding

from .inputs import Request
from .models import BatchModel


@dataclass(frozen=True)
class Answer:
    """A request's answer as its online route gives it.

    Attributes:
        request: the request.
        request_id: the id of this answer (:func:`batch.lines.request_id`).
        status_code: the HTTP status.
        body: the JSON body.
    """

    request: Request
    request_id: str
    status_code: int
    body: Any


@dataclass
class _Pending:
    """A request being answered: its rows (a decode error is kept as its row), and how its answer is assembled."""

    request: Request
    request_id: str
    rows: list[Any]
    translated: Translated | None = None
    choices: list[int] = dataclasses.field(default_factory=list)
    failure: OpenAIError | None = None


class LoadedModel:
    """A job's model loaded once: answers batches of its requests (module docstring)."""

    def __init__(self, model: BatchModel, service: Service[Any, Any] | None = None) -> None:
        """Load the model's service on its device (``handler.device``, torch threads from ``handler.threads``),
        unless ``service`` is given (already loaded)."""
        self.model = model
        self.task: Task[Any, Any] = get_task(model.config.task)
        self.service = service or self.task.load(model.config, model.model_dir, worker_device(model.config))

    def answer(self, requests: Sequence[Request], request_ids: Sequence[str], batch_size: int) -> list[Answer]:
        """The requests' answers, in order, their rows served in slices of ``batch_size``."""
        pending = [self._decode(request, request_id) for request, request_id in zip(requests, request_ids, strict=True)]
        rows = [row for item in pending for row in item.rows]
        outcomes: list[Any] = []
        for start in range(0, len(rows), batch_size):
            chunk = rows[start : start + batch_size]
            served, _ = self.service.run(chunk, [Encoding.JSON] * len(chunk))
            outcomes.extend(served)
        answers = []
        position = 0
        for item in pending:
            documents = [self._document(outcome) for outcome in outcomes[position : position + len(item.rows)]]
            position += len(item.rows)
            answers.append(self._answer(item, documents))
        return answers

    def _decode(self, request: Request, request_id: str) -> _Pending:
        route = request.route
        if route.kind == "rest":
            return _Pending(request, request_id, [self._row(request.body, route.explain)])
        translate = chat_request if route.kind == "chat" else completion_request
        try:
            if self.model.config.task != "generation":
                raise OpenAIError(
                    "model_not_found",
                    f"no generation model {route.model!r} is served: it is a "
                    f"{self.model.config.task} model (send its lines to /predictions/{route.model})",
                )
            translated = translate(request.body)
            if translated.stream:
                raise OpenAIError(
                    "invalid_request", "'stream' is not supported in a batch: a line is answered whole", "stream"
                )
        except OpenAIError as error:
            return _Pending(request, request_id, [], failure=error)
        translated = dataclasses.replace(translated, id=request_id)
        documents, choices = translated.distinct()
        rows = [self._row(document, False) for document in documents]
        return _Pending(request, request_id, rows, translated, choices)

    def _row(self, body: Any, explain_route: bool) -> Any:
        try:
            return self.task.decode_row({"body": body}, explain_route, self.model.config)
        except RowError as error:
            return error

    def _document(self, outcome: Any) -> tuple[int, dict[str, Any]]:
        """A served row's status and JSON document, as the REST door answers it."""
        if outcome.error is not None:
            return outcome.error.http_status, wire.error_document(outcome.error)
        return 200, self.task.to_dict(outcome, self.model.config)

    def _answer(self, item: _Pending, documents: list[tuple[int, dict[str, Any]]]) -> Answer:
        if item.translated is None and item.failure is None:
            status, document = documents[0]
            return Answer(item.request, item.request_id, status, wire.with_id(document, item.request_id))
        try:
            if item.failure is not None:
                raise item.failure
            assert item.translated is not None
            answers = [documents[index][1] for index in item.choices]
            return Answer(item.request, item.request_id, 200, completion_answer(item.translated, answers))
        except OpenAIError as error:
            return Answer(item.request, item.request_id, error.status, error.to_dict())
