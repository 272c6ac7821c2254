"""The one error table of the service: each row-level error code maps to an HTTP status and a gRPC status code.

REST callers see the HTTP status on their own response (``context.set_response_status`` per row). gRPC callers
always get ``OK`` from TorchServe (it ignores per-row status), so the same code, status and message are also in the
response body (``error`` in JSON, ``ExplainResponse.error`` in protobuf).

Plain Python (``explainers`` is imported only to map its errors): the router in front of TorchServe, which answers
the OpenAI API's errors with this table, imports it without torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from explainers import ExplainError


@dataclass(frozen=True)
class ErrorKind:
    """One row of the error table."""

    code: str
    http_status: int
    grpc_code: str
    meaning: str


#: The error table (also rendered in docs/SERVING.md).
ERROR_TABLE: dict[str, ErrorKind] = {
    kind.code: kind
    for kind in (
        ErrorKind("invalid_json", 400, "INVALID_ARGUMENT", "the body is not valid JSON"),
        ErrorKind("invalid_protobuf", 400, "INVALID_ARGUMENT", "the `request` bytes are not an ExplainRequest"),
        ErrorKind("non_utf8", 400, "INVALID_ARGUMENT", "the body or text is not UTF-8"),
        ErrorKind("invalid_request", 400, "INVALID_ARGUMENT", "a field is missing, unknown or of the wrong type"),
        ErrorKind("missing_text", 400, "INVALID_ARGUMENT", "no text, or an empty/blank text"),
        ErrorKind("missing_image", 400, "INVALID_ARGUMENT", "no image in the request"),
        ErrorKind("invalid_image", 400, "INVALID_ARGUMENT", "the image is not valid base64 or not a decodable image"),
        ErrorKind("unknown_method", 400, "INVALID_ARGUMENT", "the method is not registered (message lists them)"),
        ErrorKind(
            "unsupported_method",
            400,
            "INVALID_ARGUMENT",
            "the method does not work on this architecture (message says why and lists the ones that do)",
        ),
        ErrorKind("invalid_target", 400, "INVALID_ARGUMENT", "unknown label name or class index out of range"),
        ErrorKind("invalid_option", 400, "INVALID_ARGUMENT", "unknown option or value out of range (start_layer)"),
        ErrorKind("text_too_long", 413, "RESOURCE_EXHAUSTED", "more characters than max_text_chars"),
        ErrorKind("image_too_large", 413, "RESOURCE_EXHAUSTED", "more bytes than max_image_bytes or too many pixels"),
        ErrorKind("request_too_large", 413, "RESOURCE_EXHAUSTED", "a KServe/Ray door request over 3,000,000 bytes"),
        ErrorKind(
            "over_memory_budget",
            413,
            "RESOURCE_EXHAUSTED",
            "the method would need more memory than memory_budget_mib for this input (message: the estimate, the "
            "methods that fit)",
        ),
        ErrorKind(
            "over_time_budget",
            413,
            "RESOURCE_EXHAUSTED",
            "the explanation is estimated to take longer than time_budget_s, alone or beside the rows already in its "
            "batch (message: the estimate, the budget, the largest option value or the methods that fit)",
        ),
        ErrorKind(
            "deadline_exceeded",
            504,
            "DEADLINE_EXCEEDED",
            "the request's deadline (deadline_ms, or a gRPC deadline) passed before its explanation was done: refused "
            "on arrival, or abandoned between chunks",
        ),
        ErrorKind(
            "too_many_tokens",
            400,
            "INVALID_ARGUMENT",
            "generation: more new tokens than max_new_tokens, or a prompt longer than max_length tokens",
        ),
        ErrorKind("missing_prompt", 400, "INVALID_ARGUMENT", "generation: no prompt, or an empty/blank prompt"),
        ErrorKind(
            "invalid_messages",
            400,
            "INVALID_ARGUMENT",
            "generation: messages that are not a list of {role, content}, or that the chat template refuses (its "
            "message is quoted)",
        ),
        ErrorKind(
            "unknown_role", 400, "INVALID_ARGUMENT", "generation: a message's role is not system, user or assistant"
        ),
        ErrorKind(
            "no_chat_template",
            400,
            "INVALID_ARGUMENT",
            "generation: messages sent to a model without a chat template (its tokenizer has none and no chat_template "
            "setting is configured)",
        ),
        ErrorKind("too_many_messages", 413, "RESOURCE_EXHAUSTED", "generation: more messages than max_messages"),
        ErrorKind("too_many_documents", 413, "RESOURCE_EXHAUSTED", "generation: more documents than max_documents"),
        ErrorKind("unsupported_input", 415, "INVALID_ARGUMENT", "an input this model cannot take (image for text)"),
        ErrorKind("unauthenticated", 401, "UNAUTHENTICATED", "OpenAI API: a missing, wrong or expired API key (token)"),
        ErrorKind("model_not_found", 404, "NOT_FOUND", "OpenAI API: no generation model of that name is served"),
        ErrorKind("unavailable", 503, "UNAVAILABLE", "OpenAI API: the model server is busy or not reachable; retry"),
        ErrorKind(
            "records_unavailable",
            503,
            "UNAVAILABLE",
            "the records store could not commit the batch's records and the model's on_store_error is refuse; retry",
        ),
        ErrorKind("attribution_failed", 500, "INTERNAL", "the row's attribution came out NaN or infinite"),
        ErrorKind("internal", 500, "INTERNAL", "the batch failed on the server; see the server log"),
    )
}


class RowError(Exception):
    """A request row that cannot be served; the other rows of the batch are unaffected."""

    def __init__(self, code: str, message: str) -> None:
        """Create the error; ``code`` must be a key of :data:`ERROR_TABLE`."""
        if code not in ERROR_TABLE:
            raise KeyError(f"unknown error code {code!r}")
        super().__init__(message)
        self.code = code
        self.message = message

    def __reduce__(self) -> tuple[type[RowError], tuple[str, str]]:
        """Pickle as ``RowError(code, message)`` (rows travel between Ray Serve processes)."""
        return RowError, (self.code, self.message)

    @property
    def kind(self) -> ErrorKind:
        """The table row of this error."""
        return ERROR_TABLE[self.code]

    @property
    def http_status(self) -> int:
        """HTTP status of the row's REST response."""
        return self.kind.http_status

    @property
    def phrase(self) -> str:
        """HTTP reason phrase."""
        return HTTPStatus(self.http_status).phrase

    def to_dict(self) -> dict[str, Any]:
        """The ``error`` object of a JSON response."""
        return {
            "code": self.code,
            "http_status": self.http_status,
            "grpc_code": self.kind.grpc_code,
            "message": self.message,
        }


def _explain_codes() -> tuple[tuple[type[ExplainError], str], ...]:
    from explainers import (
        ChatTemplateError,
        DeadlineExceededError,
        InvalidInputError,
        InvalidOptionError,
        InvalidTargetError,
        MemoryBudgetError,
        NoChatTemplateError,
        NonFiniteScoresError,
        TimeBudgetError,
        UnknownMethodError,
        UnknownRoleError,
        UnsupportedMethodError,
        UnsupportedModelError,
    )

    return (
        (UnknownMethodError, "unknown_method"),
        (UnsupportedMethodError, "unsupported_method"),
        (InvalidTargetError, "invalid_target"),
        (InvalidOptionError, "invalid_option"),
        (NoChatTemplateError, "no_chat_template"),
        (UnknownRoleError, "unknown_role"),
        (ChatTemplateError, "invalid_messages"),
        (InvalidInputError, "invalid_request"),
        (UnsupportedModelError, "internal"),
        (NonFiniteScoresError, "attribution_failed"),
        (MemoryBudgetError, "over_memory_budget"),
        (TimeBudgetError, "over_time_budget"),
        (DeadlineExceededError, "deadline_exceeded"),
    )


def from_explain_error(error: ExplainError) -> RowError:
    """Map an explainers error of one row to its :class:`RowError` (message kept: it lists the valid choices)."""
    for error_type, code in _explain_codes():
        if isinstance(error, error_type):
            return RowError(code, str(error))
    return RowError("invalid_request", str(error))
