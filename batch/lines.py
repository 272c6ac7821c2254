"""The lines a job writes, in the OpenAI Batch API's shape.

- Output file: a request answered with a 2xx status, ``{"id", "custom_id", "response": {"status_code",
  "request_id", "body"}, "error": null}``, ``body`` exactly what the online route answers;
- error file: a request answered with another status (the same shape: the route's error body), or a line that could
  not be sent (``"response": null, "error": {"code", "message", "line"}``).

Ids are derived from the job's fingerprint and the line's ``custom_id`` (``request_id``: 32 hex digits; the line's
``id``: ``batch_req_<request_id>``), so a rerun, a resumed run and a Ray run of the same job write the same lines.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from .answers import Answer
from .inputs import LineError


def request_id(job: str, custom_id: str) -> str:
    """The id of the answer to ``custom_id`` in the job of fingerprint ``job``."""
    return hashlib.sha256(f"{job}\0{custom_id}".encode()).hexdigest()[:32]


def is_success(status_code: int) -> bool:
    """Whether an answer goes to the output file (2xx) rather than the error file."""
    return 200 <= status_code < 300


def answer_line(answer: Answer) -> dict[str, Any]:
    """The line of an answered request."""
    response = {"status_code": answer.status_code, "request_id": answer.request_id, "body": answer.body}
    line: dict[str, Any] = {
        "id": f"batch_req_{answer.request_id}",
        "custom_id": answer.request.custom_id,
        "response": response,
        "error": None,
    }
    if answer.request.parent is not None:
        line["parent"] = answer.request.parent
    return line


def error_line(job: str, error: LineError) -> dict[str, Any]:
    """The error file's line of a line that could not be sent."""
    line_id = f"batch_req_{request_id(job, error.custom_id)}" if error.custom_id is not None else None
    line: dict[str, Any] = {
        "id": line_id,
        "custom_id": error.custom_id,
        "response": None,
        "error": {"code": error.code, "message": error.message, "line": error.line},
    }
    if error.parent is not None:
        line["parent"] = error.parent
    return line


def dump(line: dict[str, Any]) -> str:
    """A line as the files hold it: compact JSON and a newline."""
    return _ENCODER.encode(line) + "\n"


#: What :func:`dump` writes with (``json.dumps(line, separators=(",", ":"), ensure_ascii=False)``, its encoder made
#: once: it keeps no state between lines).
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
