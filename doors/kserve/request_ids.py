"""Every REST answer of the KServe door carries its request's id: the caller's ``X-Request-Id`` when it sent a valid
one, else one made here (:func:`serving_core.recording.door_request_id`), echoed as the answer's ``X-Request-Id``.

:class:`RequestIds` (ASGI middleware) puts the id in the request's headers before KServe reads them, so the routes,
the models and an OIP request without an ``id`` of its own (:func:`oip_request_id`) all see the same id; a caller's
id that is not a valid one (path-like, too long) is refused with 400 ``invalid_request``.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any

from serving_core.errors import RowError
from serving_core.recording import REQUEST_ID_HEADER, door_request_id

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

_NAME = REQUEST_ID_HEADER.lower().encode("latin-1")


class RequestIds:
    """ASGI middleware: the request's id in its headers and in its answer's (see the module docstring)."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        """Wrap ``app``."""
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve the request with its id."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = list(scope.get("headers") or [])
        given = {name.decode("latin-1"): value.decode("latin-1") for name, value in headers if name == _NAME}
        try:
            request_id = door_request_id(given)
        except RowError as error:
            await _refuse(send, error)
            return
        if not given:
            headers.append((_NAME, request_id.encode("latin-1")))
            scope = {**scope, "headers": headers}

        async def with_id(message: MutableMapping[str, Any]) -> None:
            if message.get("type") == "http.response.start":
                sent = list(message.get("headers") or [])
                if not any(name.lower() == _NAME for name, _ in sent):
                    sent.append((_NAME, request_id.encode("latin-1")))
                message = {**message, "headers": sent}
            await send(message)

        await self.app(scope, receive, with_id)


async def _refuse(send: Send, error: RowError) -> None:
    body = json.dumps({"error": f"[{error.code}] {error.message}", "code": error.code}).encode("utf-8")
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": error.http_status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def oip_request_id(given: str | None, headers: Mapping[str, str] | None) -> str | None:
    """The id an OIP answer carries: the request's own ``id`` when it has one, else its ``X-Request-Id`` (which
    :class:`RequestIds` always sets on REST); None when neither is there (KServe then makes one)."""
    if given:
        return given
    for name, value in (headers or {}).items():
        if name.lower() == REQUEST_ID_HEADER.lower() and value:
            return value
    return None


__all__ = ["RequestIds", "oip_request_id"]
