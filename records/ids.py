"""Request and record ids: what the doors put in every answer and every record carries as its CloudEvents ``id``.

A request's id is the caller's (``X-Request-Id``, the OIP ``id``) when it is a valid id, else one made here (a
random UUID). A record is one answered row: its id is the request id for a single-row request, and
``<request id>-<index>`` (index from 0) for each row of a multi-row request, e.g. ``7d42...-0``, ``7d42...-1``.

Valid ids are 1-128 characters (record ids up to 160, for the index) of ``A-Z a-z 0-9 . _ : -``, starting with a
letter or digit: no ``/``, ``\\``, whitespace or leading dot, so an id is never path-like in a URL
(``/v1/records/{id}``) or a file name.
"""

from __future__ import annotations

import re
import uuid

from .errors import InvalidRecordIdError

#: The longest request id accepted (a caller's ``X-Request-Id`` included).
MAX_REQUEST_ID = 128
#: The longest record id accepted (a request id, a dash and a row index).
MAX_RECORD_ID = 160
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]*")


def _check(value: object, what: str, longest: int) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidRecordIdError(f"{what} must be a non-empty string")
    if len(value) > longest:
        raise InvalidRecordIdError(f"{what} is {len(value)} characters long; the longest allowed is {longest}")
    if not _ID.fullmatch(value):
        raise InvalidRecordIdError(
            f"{what} {value[:40]!r} is not valid: use letters, digits and . _ : - only, starting with a letter or digit"
        )
    return value


def check_request_id(value: object) -> str:
    """A request id as given, when it is valid.

    Args:
        value: The caller's id (an ``X-Request-Id`` header, an OIP ``id``).

    Returns:
        The same id.

    Raises:
        InvalidRecordIdError: it is empty, longer than :data:`MAX_REQUEST_ID`, or path-like.
    """
    return _check(value, "the request id", MAX_REQUEST_ID)


def check_record_id(value: object) -> str:
    """A record id as given, when it is valid (what ``get``/``erase`` and ``/v1/records/{id}`` accept).

    Args:
        value: The record id.

    Returns:
        The same id.

    Raises:
        InvalidRecordIdError: it is empty, longer than :data:`MAX_RECORD_ID`, or path-like.
    """
    return _check(value, "the record id", MAX_RECORD_ID)


def new_request_id() -> str:
    """A new request id: a random UUID (version 4) in its usual text form."""
    return str(uuid.uuid4())


def request_id(given: str | None) -> str:
    """The id of a request: the caller's when given (and valid), else a new one.

    Args:
        given: The caller's id, or None (or an empty string) when it sent none.

    Returns:
        The request id.

    Raises:
        InvalidRecordIdError: the caller's id is not valid (a door answers it with ``invalid_request``).
    """
    return check_request_id(given) if given else new_request_id()


def row_id(request: str, index: int | None) -> str:
    """The record id of one row.

    Args:
        request: The request id.
        index: The row's index in a multi-row request (from 0), or None for a single-row request.

    Returns:
        ``request`` itself for a single-row request, else ``<request>-<index>``.
    """
    if index is None:
        return request
    if index < 0:
        raise ValueError(f"a row index is 0 or more, not {index}")
    return f"{request}-{index}"


__all__ = [
    "MAX_RECORD_ID",
    "MAX_REQUEST_ID",
    "check_record_id",
    "check_request_id",
    "new_request_id",
    "request_id",
    "row_id",
]
