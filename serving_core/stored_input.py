"""A stored input as the JSON document its task takes: what a re-explanation (``POST /v1/records/{id}/explain``, a
batch job's ``--from-records``) sends again, whatever encoding the input came in.

A record kept with payload ``full`` holds its input as a JSON document or as raw bytes (:func:`records.recorded_input`).
:func:`task_document` turns either into the task's JSON document, the request its TorchServe REST route takes
(docs/SERVING.md):

- a JSON document: as it is;
- an image file's bytes (a raw PNG/JPEG body, image tasks): ``{"image": "<base64>"}``;
- a serialized ``ExplainRequest`` (a TorchServe gRPC row, ``proto/explain.proto``): its JSON document
  (:func:`request_document`: ``text``/``text_pair``, ``image`` as base64, or the ``generation`` request's fields);
- a UTF-8 body that is JSON: that document; any other UTF-8 body (a ``text/plain`` request): the task's main text
  (``{"text": ...}``; generation: ``{"prompt": ...}``).

Bytes are read in that order. A text body is never a serialized ``ExplainRequest`` unless it parses as one that sets
its input and has no unknown field (a text that starts with a newline and the length of what follows).
What belongs to the original call rather than to its input (``explain``, ``deadline_ms``, ``stream``) is dropped: the
caller gives the new ``explain``. An input that is none of these raises :class:`records.api.UnreadableInputError`.

Door-neutral and torch-free: an input a door keeps in a form of its own (the KServe door's OIP rows,
:func:`is_oip_row`) is converted by that door (:mod:`doors.kserve.oip.stored`); :func:`task_document` refuses it.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

from explain_client.protos import explain_messages
from records.api import UnreadableInputError

from .errors import RowError
from .pools import IMAGE_MAGIC
from .registry import TASKS
from .wire import read_body

#: The fields of a JSON document that belong to the original call, not to its input: dropped before it is sent again.
CALL_FIELDS = ("explain", "deadline_ms", "stream")


def task_document(kept: Mapping[str, Any] | bytes, task: str) -> dict[str, Any]:
    """The JSON document of a stored input, for a model of ``task`` (the module docstring), without its call fields
    (:data:`CALL_FIELDS`).

    Args:
        kept: The stored input: a JSON document or raw bytes (:func:`records.recorded_input`).
        task: The model's task name (a record's ``data.task``).

    Raises:
        UnreadableInputError: the input is not a request the task takes (not UTF-8, not JSON, an empty body...).
    """
    if isinstance(kept, Mapping):
        if is_oip_row(kept):
            raise UnreadableInputError(
                "it is the OIP request of one row: the KServe door explains it again (with the model's OIP codec)"
            )
        document = dict(kept)
    elif isinstance(kept, bytes | bytearray):
        document = _bytes_document(bytes(kept), task)
    else:
        raise UnreadableInputError(f"a stored input is a JSON document or bytes, not {type(kept).__name__}")
    return {name: value for name, value in document.items() if name not in CALL_FIELDS}


def is_oip_row(document: Mapping[str, Any]) -> bool:
    """Whether a stored input is the OIP request of one row (a list of ``inputs`` tensors, as the KServe door records
    an OIP ``infer`` row), not a task document."""
    inputs = document.get("inputs")
    return (
        isinstance(inputs, list)
        and bool(inputs)
        and all(
            isinstance(tensor, Mapping) and {"name", "datatype", "shape", "data"} <= set(tensor) for tensor in inputs
        )
    )


def _kind(task: str) -> tuple[bool, bool]:
    """(image task, generation task) of ``task``: a registered task's facts; any other name (a task defined outside
    the project: never imported from what a store says) is taken as a text task."""
    facts = TASKS.get(task)
    if facts is None:
        return False, False
    return facts.input_kind == "image", facts.explained_as == "causal_lm"


def _bytes_document(data: bytes, task: str) -> dict[str, Any]:
    image, generation = _kind(task)
    if image and data.startswith(IMAGE_MAGIC):
        return {"image": base64.b64encode(data).decode("ascii")}
    message = explain_request(data)
    if message is not None:
        return request_document(message)
    try:
        body = read_body(data, "always")
    except RowError as error:
        raise UnreadableInputError(f"the stored input is not a request: {error.message}") from None
    if body.document is not None:
        return dict(body.document)
    if body.text is None or not body.text:
        raise UnreadableInputError("the stored input is empty")
    if image:
        raise UnreadableInputError(
            "the stored input of this image model is neither a PNG/JPEG file, a serialized ExplainRequest nor JSON"
        )
    return {"prompt" if generation else "text": body.text}


def explain_request(data: bytes) -> Any:
    """``data`` as a serialized ``ExplainRequest`` that sets its input (``text``, ``image`` or ``generation``) and
    holds no field the message does not know (its known fields fill every byte, in whatever order a client wrote
    them); None when it is not one."""
    message = explain_messages().ExplainRequest()
    try:
        message.ParseFromString(data)
    except Exception:  # protobuf raises DecodeError, a plain Exception subclass
        return None
    if message.WhichOneof("input") is None and not message.HasField("generation"):
        return None
    known = explain_messages().ExplainRequest()
    known.CopyFrom(message)
    known.DiscardUnknownFields()
    if known.ByteSize() != len(data):  # unknown fields: text that happened to parse, not a request
        return None
    return message


def request_document(message: Any) -> dict[str, Any]:
    """A parsed ``ExplainRequest`` as the JSON document of its input (its ``explain`` and ``deadline_ms`` left out:
    :data:`CALL_FIELDS`): ``{"text", "text_pair"}``, ``{"image": "<base64>"}`` or a generation request's fields
    (``prompt`` or ``messages``, ``documents``, ``max_new_tokens``, ``generation``, ``continuation``,
    ``continuation_ids``).

    Raises:
        UnreadableInputError: the message sets no input.
    """
    kind = message.WhichOneof("input")
    if kind == "text":
        document: dict[str, Any] = {"text": message.text}
        if message.text_pair:
            document["text_pair"] = message.text_pair
        return document
    if kind == "image":
        return {"image": base64.b64encode(bytes(message.image)).decode("ascii")}
    if not message.HasField("generation"):
        raise UnreadableInputError("the stored ExplainRequest sets no input (text, image or generation)")
    request = message.generation
    document = {}
    if request.messages:
        document["messages"] = [{"role": chat.role, "content": chat.content} for chat in request.messages]
    else:
        document["prompt"] = request.prompt
    if request.documents:
        document["documents"] = [
            {"title": given.title, "text": given.text} if given.title else given.text for given in request.documents
        ]
    if request.max_new_tokens:
        document["max_new_tokens"] = int(request.max_new_tokens)
    if request.HasField("sampling"):
        sampling = request.sampling
        settings: dict[str, Any] = {"do_sample": bool(sampling.do_sample)}
        for name in ("temperature", "top_k", "top_p", "seed"):
            if sampling.HasField(name):
                settings[name] = getattr(sampling, name)
        document["generation"] = settings
    if request.continuation:
        document["continuation"] = request.continuation
    if request.continuation_ids:
        document["continuation_ids"] = [int(token) for token in request.continuation_ids]
    return document


__all__ = ["CALL_FIELDS", "explain_request", "is_oip_row", "request_document", "task_document"]
