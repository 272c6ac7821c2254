"""The OpenAI API over the generation task, door-neutral: ``POST /v1/chat/completions``, ``POST /v1/completions``
and ``GET /v1/models`` translated to the generation task's JSON documents and back, for every door (TorchServe's
router, the KServe/Ray door) to route.

- :mod:`~serving_core.openai_api.requests`: an OpenAI request → one generation JSON document per choice
  (:class:`~serving_core.openai_api.requests.Translated`);
- :mod:`~serving_core.openai_api.answers`: the generation answers → the OpenAI answer, its stream chunks and
  server-sent events, the model list, the token usage (and its GenAI span attributes);
- :mod:`~serving_core.openai_api.streams`: a stream's chunks made from the generation task's events as they come
  (:mod:`serving_core.streaming`), as server-sent events;
- :mod:`~serving_core.openai_api.errors`: OpenAI's error shape with the error table's statuses and codes.

Plain Python (no torch): the router in front of TorchServe imports it. docs/SERVING.md, "OpenAI API".
"""

from .answers import completion_answer, events, model_list, trace_usage, usage
from .errors import OpenAIError, row_failure
from .requests import Translated, chat_request, completion_request, with_deadline_header
from .streams import ChunkStream, answered_events, opened, stream_chunks, streamed_events

__all__ = [
    "ChunkStream",
    "OpenAIError",
    "Translated",
    "answered_events",
    "chat_request",
    "completion_answer",
    "completion_request",
    "events",
    "model_list",
    "opened",
    "row_failure",
    "stream_chunks",
    "streamed_events",
    "trace_usage",
    "usage",
    "with_deadline_header",
]
