"""KServe's v1 protocol (``/v1/models/<name>:predict`` and ``:explain``), as pure functions over the JSON documents.

Request: ``{"instances": [...]}`` (or ``{"inputs": [...]}``); each instance is what the TorchServe door takes as a
JSON body (``{"text": ..., "text_pair": ..., "explain": {"method": ..., "target": ..., <option>: ...}}``, images
``{"image": "<base64>"}`` or TensorFlow Serving's ``{"image": {"b64": "<base64>"}}``), or for text models the text
itself as a string. ``:predict`` answers ``{"predictions": [...]}`` (an instance with ``explain`` gets its
explanation inside its prediction, as on TorchServe); ``:explain`` explains every instance (the model's default
method unless the instance names one) and answers ``{"predictions": [...], "explanations": [...]}``. Each prediction
and explanation is the TorchServe door's JSON (docs/SERVING.md, "Response"); a row that failed has
``{"error": {...}}`` in ``predictions`` and ``null`` in ``explanations``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from explainers import RowRequest
from handlers.config import HandlerConfig
from handlers.errors import RowError
from handlers.schema import DecodedRow, Encoding, RowOutcome, decode_fields, decode_row, outcome_to_dict

from .oip import MAX_ROWS


def decode_instances(payload: Any, config: HandlerConfig, explain: bool) -> list[DecodedRow | RowError]:
    """One decoded row (or its error) per instance.

    Args:
        payload: the parsed JSON body.
        config: the model's handler config.
        explain: ``True`` on ``:explain`` (an instance without ``explain`` gets the default method).

    Raises:
        RowError: if the body has no list of 1 to :data:`~servers.oip.MAX_ROWS` instances.
    """
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
    rows: list[DecodedRow | RowError] = []
    for instance in instances:
        try:
            rows.append(_decode_instance(instance, config, explain))
        except RowError as error:
            rows.append(error)
    return rows


def _decode_instance(instance: Any, config: HandlerConfig, explain: bool) -> DecodedRow:
    if isinstance(instance, str):
        if config.task != "text":
            raise RowError("unsupported_input", "this is an image model: send {'image': '<base64>'}")
        method = config.default_method if explain else None
        return decode_fields(config, text=instance, method=method)
    if not isinstance(instance, Mapping):
        raise RowError("invalid_request", f"an instance must be an object or a string, got {type(instance).__name__}")
    image = instance.get("image")
    if isinstance(image, Mapping) and set(image) == {"b64"}:
        instance = {**instance, "image": image["b64"]}
    row = decode_row({"body": instance}, explain, config)
    if explain and row.request.method is None:  # "explain": false on :explain still explains
        row = DecodedRow(Encoding.JSON, RowRequest(method=config.default_method), row.text, row.image, row.text_pair)
    return row


def encode_predictions(outcomes: Sequence[RowOutcome], labels: tuple[str, ...], explain: bool) -> dict[str, Any]:
    """The v1 answer: ``{"predictions": [...]}``, plus ``"explanations"`` on ``:explain``.

    Raises:
        RowError: the first row's error when no row could be served.
    """
    documents = [outcome_to_dict(outcome, labels) for outcome in outcomes]
    if all(outcome.error is not None for outcome in outcomes):
        first = outcomes[0].error
        assert first is not None
        raise first
    if not explain:
        return {"predictions": documents}
    predictions = [{key: value for key, value in doc.items() if key != "explanation"} for doc in documents]
    return {"predictions": predictions, "explanations": [doc.get("explanation") for doc in documents]}
