"""The OpenAI API over the generation task, door-neutral: ``POST /v1/chat/completions``, ``POST /v1/completions``
and ``GET /v1/models`` translated to the generation task's JSON documents and back, for every door (TorchServe's
router, the KServe/Ray door) to route.

- :mod:`~serving_core.openai_api.requests`: an OpenAI request → one generation JSON document per choice
  (:class:`~serving_core.openai_api.requests.Translated`);
- :mod:`~serving_core.openai_api.answers`: the generation answers → the OpenAI answer, its stream chunks and
  server-sent events, the model list, the token usage (and its GenAI span attributes);
- :mod:`~serving_core.openai_api.errors`: OpenAI's error shape with the error table's statuses and codes.

Plain Python (no torch): the router in front of TorchServe imports it. docs/SERVING.md, "OpenAI API".
"""

from .answers import completion_answer, events, model_list, stream_chunks, trace_usage, usage
from .errors import OpenAIError, row_failure
from .requests import Translated, chat_request, completion_request, with_deadline_header

__all__ = [
    "OpenAIError",
    "Translated",
    "chat_request",
    "completion_answer",
    "completion_request",
    "events",
    "model_list",
    "row_failure",
    "stream_chunks",
    "trace_usage",
    "usage",
    "with_deadline_header",
]
