"""OpenAI's error shape with the service's error table: ``{"error": {"message", "type", "param", "code"}}`` under the
HTTP status of the error table's ``code`` (:data:`serving_core.errors.ERROR_TABLE`), ``code`` being that table's
code (``unknown_role``, ``too_many_tokens``, ...) and ``type`` OpenAI's class of error for the status
(``invalid_request_error``, ``authentication_error``, ``not_found_error``, ``server_error``), which the ``openai``
client turns into its exception classes (``BadRequestError``, ``AuthenticationError``, ``NotFoundError``, ...)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import ERROR_TABLE

#: OpenAI's ``type`` of an error by HTTP status (any other 4xx: ``invalid_request_error``; 5xx: ``server_error``).
_TYPES = {401: "authentication_error", 403: "permission_error", 404: "not_found_error", 429: "rate_limit_error"}

#: The request field an error table code is most likely about (``param``), where one is.
_PARAMS = {
    "unknown_role": "messages",
    "invalid_messages": "messages",
    "no_chat_template": "messages",
    "too_many_messages": "messages",
    "too_many_documents": "documents",
    "missing_prompt": "prompt",
    "unknown_method": "explain",
    "unsupported_method": "explain",
    "invalid_target": "explain",
    "invalid_option": "explain",
    "over_memory_budget": "explain",
    "over_time_budget": "explain",
    "model_not_found": "model",
}


class OpenAIError(Exception):
    """An OpenAI API request answered with an error: the error table's ``code``, its HTTP status, a message that says
    what to change, and the request field it is about (``param``) where one is."""

    def __init__(self, code: str, message: str, param: str | None = None, status: int | None = None) -> None:
        """Create the error; ``status`` defaults to the error table's status of ``code`` (which must be in it)."""
        if status is None and code not in ERROR_TABLE:
            raise KeyError(f"unknown error code {code!r}")
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param if param is not None else _PARAMS.get(code)
        self.status = status if status is not None else ERROR_TABLE[code].http_status

    @property
    def type(self) -> str:
        """OpenAI's error class for the status."""
        if self.status >= 500:
            return "server_error"
        return _TYPES.get(self.status, "invalid_request_error")

    def to_dict(self) -> dict[str, Any]:
        """The JSON body."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def row_failure(answer: Mapping[str, Any]) -> OpenAIError | None:
    """The error of a generation answer that failed (``{"error": {"code", "http_status", "message", ...}}``, as every
    door answers a failed row), or ``None`` for a served one."""
    error = answer.get("error")
    if not isinstance(error, Mapping):
        return None
    code = str(error.get("code") or "internal")
    status = error.get("http_status")
    message = str(error.get("message") or "the request failed")
    return OpenAIError(code, message, status=int(status) if isinstance(status, int) else None)
