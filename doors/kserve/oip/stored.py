"""A stored OIP row as the JSON document of its task: how the KServe door explains an OIP ``infer`` row's record
again (``POST /v1/records/{id}/explain``).

The door records an OIP row's input as the OIP request of that row alone
(:func:`~doors.kserve.oip.tensors.row_requests`: ``{"inputs": [{"name", "datatype", "shape", "data"}], "parameters":
{...}}``, a ``bytes`` element that is not UTF-8 as ``{"b64": ...}``). :func:`oip_row_document` reads it back into an
:class:`~doors.kserve.oip.tensors.OipRequest` without what it asked to explain (the ``explain_*`` parameters and per-row
inputs), decodes it with the model's own codec (:func:`~doors.kserve.oip.codecs.codec_for`: the same checks as the
online route, no second decoder) and writes the decoded row's input as the document the task's REST route takes
(:func:`row_document`), to which the re-explanation adds its own ``explain``. A task served by the generic codec of JSON
documents carries its document in the row already. :func:`stored_document` reads any kept input of a model served by
this door: an OIP row as above, any other by :func:`serving_core.stored_input.task_document`.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from typing import Any

from records.api import UnreadableInputError
from serving_core.config import HandlerConfig
from serving_core.errors import RowError
from serving_core.stored_input import CALL_FIELDS, is_oip_row, task_document
from serving_core.tasks.classify_schema import DecodedRow
from serving_core.tasks.generation_schema import GenerationRow

from .asks import is_explain_input
from .codecs import codec_for
from .documents import DOCUMENT, DocumentCodec
from .tensors import OipRequest, Tensor, text_value

#: The prefix of every parameter of the explain extension (``explain_method``, ``explain_option_<name>``,
#: ``explain_deadline_ms``, generation's ``explain_steps``...): what a row asked to explain, dropped when it is
#: explained again.
EXPLAIN_PARAMETERS = "explain_"


def stored_request(document: Mapping[str, Any]) -> OipRequest:
    """A stored OIP row as an :class:`OipRequest` without its explain inputs and parameters.

    Raises:
        UnreadableInputError: a tensor that is not one (a wrong datatype, shape or element).
    """
    inputs: dict[str, Tensor] = {}
    for tensor in document.get("inputs") or []:
        name = str(tensor["name"])
        if is_explain_input(name):
            continue
        try:
            data = [_element(value) for value in tensor["data"]]
            inputs[name] = Tensor(name, str(tensor["datatype"]), tuple(int(size) for size in tensor["shape"]), data)
        except (TypeError, ValueError, binascii.Error) as error:
            raise UnreadableInputError(f"the stored OIP input {name!r} is not a tensor: {error}") from None
    parameters = document.get("parameters") or {}
    if not isinstance(parameters, Mapping):
        raise UnreadableInputError("the stored OIP parameters are not an object")
    kept = {key: value for key, value in parameters.items() if not str(key).startswith(EXPLAIN_PARAMETERS)}
    return OipRequest(inputs, kept)


def _element(value: Any) -> Any:
    """A stored element as the door received it (``{"b64": ...}``: the bytes)."""
    if isinstance(value, Mapping):
        if set(value) != {"b64"} or not isinstance(value["b64"], str):
            raise ValueError(f"an element is a value or {{'b64': ...}}, not {sorted(value)}")
        return base64.b64decode(value["b64"], validate=True)
    return value


def oip_row_document(document: Mapping[str, Any], config: HandlerConfig) -> dict[str, Any]:
    """The JSON document of a stored OIP row (the module docstring), for the model of ``config``.

    Raises:
        UnreadableInputError: the row is not a request the model's codec takes (its code and message).
    """
    request = stored_request(document)
    codec = codec_for(config)
    try:
        if isinstance(codec, DocumentCodec):
            values = request.inputs[DOCUMENT].rows() if DOCUMENT in request.inputs else []
            if len(values) != 1:
                raise RowError("invalid_request", f"the stored row has no single {DOCUMENT!r} element")
            parsed = json.loads(text_value(values[0], f"{DOCUMENT}[0]"))
            if not isinstance(parsed, Mapping):
                raise RowError("invalid_request", f"{DOCUMENT}[0] is not a JSON object")
            return {key: value for key, value in parsed.items() if key not in CALL_FIELDS}
        rows = codec.decode(request, config)
    except RowError as error:
        raise UnreadableInputError(
            f"the stored OIP row is not a request of this model: [{error.code}] {error.message}"
        ) from None
    except ValueError as error:
        raise UnreadableInputError(f"the stored OIP row is not a request of this model: {error}") from None
    if len(rows) != 1:
        raise UnreadableInputError(f"the stored OIP row holds {len(rows)} rows, not one")
    row = rows[0]
    if isinstance(row, RowError):
        raise UnreadableInputError(f"the stored OIP row is not a request of this model: [{row.code}] {row.message}")
    return row_document(row)


def row_document(row: Any) -> dict[str, Any]:
    """A decoded row's input as its task's JSON document (what it asks to explain left out): a classifier's or token
    classifier's ``text`` (and ``text_pair``) or ``image`` (base64); a generation row's ``prompt`` or ``messages``,
    ``documents``, ``max_new_tokens`` (unless it explains a given continuation), ``generation`` (its sampling),
    ``continuation``/``continuation_ids``, ``logprobs`` and ``stop``.

    Raises:
        UnreadableInputError: a row of another kind.
    """
    if isinstance(row, DecodedRow):
        if row.image is not None:
            return {"image": base64.b64encode(row.image).decode("ascii")}
        document: dict[str, Any] = {"text": row.text}
        if row.text_pair is not None:
            document["text_pair"] = row.text_pair
        return document
    if isinstance(row, GenerationRow):
        document = {}
        if row.messages is not None:
            document["messages"] = [{"role": message.role, "content": message.content} for message in row.messages]
        else:
            document["prompt"] = row.prompt
        if row.documents:
            document["documents"] = [{"title": given.title, "text": given.text} for given in row.documents]
        if not row.given:
            document["max_new_tokens"] = row.max_new_tokens
        if row.sampling:
            document["generation"] = dict(row.sampling)
        if row.continuation is not None:
            document["continuation"] = row.continuation
        if row.continuation_ids is not None:
            document["continuation_ids"] = list(row.continuation_ids)
        if row.logprobs is not None:
            document["logprobs"] = row.logprobs
        if row.stop:
            document["stop"] = list(row.stop)
        return document
    raise UnreadableInputError(f"a decoded {type(row).__name__} has no JSON document")


def stored_document(kept: Mapping[str, Any] | bytes, config: HandlerConfig) -> dict[str, Any]:
    """A kept input as the JSON document of the model's task: an OIP row's record through the model's OIP codec
    (:func:`oip_row_document`), any other (a v1 instance, a generation document, a record
    another door made, raw bytes) by :func:`serving_core.stored_input.task_document`.

    Raises:
        UnreadableInputError: the input is not a request of the model's task.
    """
    if isinstance(kept, Mapping) and is_oip_row(kept):
        return oip_row_document(kept, config)
    return task_document(kept, config.task)


__all__ = ["EXPLAIN_PARAMETERS", "oip_row_document", "row_document", "stored_document", "stored_request"]
