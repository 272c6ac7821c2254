"""The OpenAI Batch API on the KServe door: ``/v1/files`` and ``/v1/batches`` (:mod:`batch.api`) added to KServe's
FastAPI application, its batches run in the door's process through the door's loaded models
(:class:`batch.scheduler.ThreadRunner`: their rows batch with online rows in the models' backends, so answers are
those of the online routes), waiting before each batch of lines while online requests are in flight
(:class:`OnlineRequests` counts them). The state folder is ``batch_api/`` of the door's run folder: batches resume
when the door restarts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from pathlib import Path
from typing import Any, cast

from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from batch.answers import LoadedModel
from batch.api import BatchApi, BatchStore
from batch.models import open_model
from batch.scheduler import BatchScheduler, DoorService, OnlineTraffic, ThreadRunner

from .kserve_model import ExplainModel

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

#: The Batch API's routes (every one answered by :meth:`batch.api.BatchApi.handle`).
ROUTES = (
    ("/v1/files", "POST"),
    ("/v1/files/{file_id}", "GET"),
    ("/v1/files/{file_id}/content", "GET"),
    ("/v1/batches", "POST"),
    ("/v1/batches", "GET"),
    ("/v1/batches/{batch_id}", "GET"),
    ("/v1/batches/{batch_id}/cancel", "POST"),
)


class OnlineRequests:
    """ASGI middleware: every HTTP request but the Batch API's counts as online traffic while it is served."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]], traffic: OnlineTraffic) -> None:
        """Count ``app``'s requests in ``traffic``."""
        self.app = app
        self.traffic = traffic

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve the request, counted."""
        if scope["type"] != "http" or BatchApi.owns(str(scope.get("path", ""))):
            await self.app(scope, receive, send)
            return
        self.traffic.started()
        try:
            await self.app(scope, receive, send)
        finally:
            self.traffic.ended()


def add_batch_api(app: FastAPI, models: Sequence[ExplainModel], state_dir: Path) -> BatchApi:
    """Add the Batch API's routes and the online-request count to ``app`` for the loaded ``models``, and start its
    scheduler when the application starts (stopped when it shuts down). Call before the application serves."""
    store = BatchStore(state_dir)
    batch_models = {model.name: open_model(model.name, model.settings.archive) for model in models}
    traffic = OnlineTraffic()
    scheduler: BatchScheduler | None = None

    def wake() -> None:
        if scheduler is not None:
            scheduler.wake()

    api = BatchApi(store, batch_models, wake)

    async def start() -> None:
        nonlocal scheduler
        loop = asyncio.get_running_loop()
        loaded = {
            model.name: LoadedModel(
                batch_models[model.name], cast(Any, DoorService(model.backend.serve, loop, model.head_type))
            )
            for model in models
        }
        scheduler = BatchScheduler(store, ThreadRunner(batch_models, loaded, traffic)).start()

    async def stop() -> None:
        if scheduler is not None:
            await run_in_threadpool(scheduler.stop)

    async def route(request: Request) -> Response:
        body = await request.body()
        path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        answer = await run_in_threadpool(api.handle, request.method, path, dict(request.headers), body)
        return Response(answer.body, status_code=answer.status, media_type=answer.content_type)

    for path, method in ROUTES:
        app.add_api_route(path, route, methods=[method])
    app.add_middleware(OnlineRequests, traffic=traffic)
    app.router.add_event_handler("startup", start)
    app.router.add_event_handler("shutdown", stop)
    return api
