"""KServe's v1 protocol (``/v1/models/<name>:predict`` and ``:explain``), as pure functions over the JSON documents,
for every task.

Request: ``{"instances": [...]}`` (or ``{"inputs": [...]}``); each instance is what the TorchServe door takes as a
JSON body for the model's task (classifiers: ``{"text": ..., "text_pair": ..., "explain": {"method": ..., "target":
..., <option>: ...}}``, images ``{"image": "<base64>"}`` or TensorFlow Serving's ``{"image": {"b64": "<base64>"}}``;
token classifiers ``{"text": ...}``; generation models ``{"prompt": ..., "max_new_tokens": ..., "explain": ...}``), or
the main input itself as a string (a text, or a prompt). ``:predict`` answers ``{"predictions": [...]}`` (an instance
with ``explain`` gets its explanation inside its prediction, as on TorchServe); ``:explain`` explains every instance
(the model's default method unless the instance names one) and answers ``{"predictions": [...], "explanations":
[...]}``. The door adds the request's ``id`` (its ``X-Request-Id``) and ``ids``, each instance's id in order: its
record's id (the request id for one instance, else ``<id>-<index>``). Each prediction is the TorchServe door's JSON
answer for the task (docs/SERVING.md) and each explanation its ``explanation`` object; a row that failed has
``{"error": {...}}`` in ``predictions`` and ``null`` in ``explanations``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from serving_core import wire
from serving_core.config import HandlerConfig
from serving_core.errors import RowError
from serving_core.task import get_task

from .oip import MAX_ROWS


def decode_instances(payload: Any, config: HandlerConfig, explain: bool) -> list[Any]:
    """One decoded row (or its :class:`~serving_core.errors.RowError`) per instance, by the model's task.

    Args:
        payload: the parsed JSON body.
        config: the model's handler config.
        explain: ``True`` on ``:explain`` (an instance without ``explain`` gets the default method).

    Raises:
        RowError: if the body has no list of 1 to :data:`~doors.kserve.oip.MAX_ROWS` instances.
    """
    rows: list[Any] = []
    for instance in _instances(payload):
        try:
            row = get_task(config.task).decode_document(instance_document(instance, config), explain, config)
            rows.append(get_task(config.task).with_explanation(row, config) if explain else row)
        except RowError as error:  # "explain": false on :explain still explains
            rows.append(error)
    return rows


def instance_documents(payload: Any, config: HandlerConfig) -> list[Mapping[str, Any] | None]:
    """Each instance as the task's JSON document (:func:`instance_document`; what a record keeps as its input), None
    for one that is not an instance."""
    documents: list[Mapping[str, Any] | None] = []
    for instance in _instances(payload):
        try:
            documents.append(dict(instance_document(instance, config)))
        except RowError:
            documents.append(None)
    return documents


def _instances(payload: Any) -> list[Any]:
    if isinstance(payload, bytes | str):  # a body sent without Content-Type: application/json
        try:
            payload = json.loads(payload)
        except ValueError as error:
            raise RowError("invalid_json", f"the body is not JSON: {error}") from None
    instances = payload.get("instances", payload.get("inputs")) if isinstance(payload, Mapping) else None
    if not isinstance(instances, list):
        raise RowError("invalid_request", 'the body must be a JSON object {"instances": [...]}')
    if not 0 < len(instances) <= MAX_ROWS:
        raise RowError("invalid_request", f"send 1 to {MAX_ROWS} instances per request, got {len(instances)}")
    return instances


def instance_document(instance: Any, config: HandlerConfig) -> Mapping[str, Any]:
    """An instance as the task's JSON document: a string is the task's main input, an image's ``{"b64": ...}`` its
    base64 text.

    Raises:
        RowError: for an instance that is neither an object nor a string, or a string sent to an image model.
    """
    task = get_task(config.task)
    if isinstance(instance, str):
        if task.main_input == "image":
            raise RowError("unsupported_input", "this is an image model: send {'image': '<base64>'}")
        instance = {task.main_input: instance}
    if not isinstance(instance, Mapping):
        raise RowError("invalid_request", f"an instance must be an object or a string, got {type(instance).__name__}")
    image = instance.get("image")
    if isinstance(image, Mapping) and set(image) == {"b64"}:
        instance = {**instance, "image": image["b64"]}
    return instance


def encode_predictions(outcomes: Sequence[Any], config: HandlerConfig, explain: bool) -> dict[str, Any]:
    """The v1 answer: ``{"predictions": [...]}``, plus ``"explanations"`` on ``:explain``.

    Raises:
        RowError: the first row's error when no row could be served.
    """
    if all(outcome.error is not None for outcome in outcomes):
        first = outcomes[0].error
        assert first is not None
        raise first
    task = get_task(config.task)
    documents = [
        wire.error_document(outcome.error) if outcome.error is not None else task.to_dict(outcome, config)
        for outcome in outcomes
    ]
    if not explain:
        return {"predictions": documents}
    predictions = [{key: value for key, value in doc.items() if key != "explanation"} for doc in documents]
    return {"predictions": predictions, "explanations": [doc.get("explanation") for doc in documents]}
