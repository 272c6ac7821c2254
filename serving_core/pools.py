"""Explanation pools: which requests a model's own explanation workers serve, and what that pool is called.

A model served with an explanation pool (``explanation_workers`` in a models file, ``explanationPool:`` in a profile;
docs/SERVING.md, "Predictions next to explanations") is registered twice from the same archive: ``<name>`` serves
predictions, ``<name>.explain`` (:func:`pool_name`; a dot never appears in a served name, so it cannot clash) serves
the requests that ask for an explanation, each pool with its own workers and batch settings. A router in front of the
server (:mod:`doors.torchserve.router`) sends each request to one of them with :func:`asks_for_explanation`;
clients call ``<name>`` as before.

Both pools run the same handler on the same archive, so a request sent to the other pool gets the same answer, only
later: the decision only needs to be right for requests that are valid. An undecodable request goes to the prediction
pool, whose handler answers it with the error it would get anyway.

This module is plain Python (no torch, no TorchServe): the router imports it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

#: Suffix of an explanation pool's served name.
POOL_SUFFIX = ".explain"
#: How much an explanation pool's worker process lowers its CPU priority (``os.nice``) when it loads: on cores shared
#: with the prediction workers, a prediction is scheduled before an explanation's next slice (a niceness of 10 weighs
#: about a tenth of the default's under Linux's scheduler), so predictions keep their latency while explanations run.
POOL_NICENESS = 10

#: The first bytes of a PNG and of a JPEG: a raw image body (the handlers read it as an image, too).
IMAGE_MAGIC = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff")


def pool_name(model: str) -> str:
    """The served name of ``model``'s explanation pool."""
    return model + POOL_SUFFIX


def is_pool(served: str) -> bool:
    """Whether a served name is an explanation pool's."""
    return served.endswith(POOL_SUFFIX)


def model_of(served: str) -> str:
    """The model a served name belongs to: ``sentiment`` for ``sentiment`` and for ``sentiment.explain`` (metrics
    are labelled by model, whichever pool answered)."""
    return served[: -len(POOL_SUFFIX)] if served.endswith(POOL_SUFFIX) else served


def asks_for_explanation(fields: Mapping[str, bytes | str], explanations_route: bool = False) -> bool:
    """Whether a request asks for an explanation, as the tasks' decoders would read it
    (:mod:`serving_core.tasks.classify_schema`, :mod:`serving_core.tasks.generation_schema`).

    Args:
        fields: the request as a TorchServe row sees it: ``{"body": <REST body>}``, or a gRPC ``PredictionsRequest``'s
            ``input`` map (``"body"``/``"data"``: the JSON document; ``"request"``: a serialized ``ExplainRequest``).
        explanations_route: the REST route was ``/explanations/{model}`` (an absent ``explain`` means the default
            method there).

    Returns:
        ``True`` for a route or document that asks for an explanation (``explain`` present and not ``false``/``null``;
        a conditional one, ``{"below": 0.8}``, too: whether it is explained is known only after the prediction);
        ``False`` for a prediction only and for anything that does not decode.
    """
    if explanations_route:
        return True
    if "request" in fields:
        return _protobuf_asks(fields["request"])
    raw = fields.get("body", fields.get("data"))
    if isinstance(raw, str):
        raw = raw.encode("utf-8")
    if not isinstance(raw, bytes | bytearray) or bytes(raw[:8]).startswith(IMAGE_MAGIC):
        return False
    try:
        document = json.loads(raw)
    except (UnicodeDecodeError, ValueError):
        return False
    if not isinstance(document, Mapping):
        return False
    explain = document.get("explain")
    return explain is not None and explain is not False


def _protobuf_asks(payload: bytes | str) -> bool:
    from explain_client.protos import explain_messages

    message = explain_messages().ExplainRequest()
    try:
        message.ParseFromString(payload.encode("latin-1") if isinstance(payload, str) else bytes(payload))
    except Exception:  # protobuf raises DecodeError, a plain Exception subclass
        return False
    if message.HasField("explain"):
        return True
    return message.HasField("generation") and message.generation.HasField("explain")
