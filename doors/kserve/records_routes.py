"""The records routes on the KServe door (and on Ray Serve replicas behind it): ``/v1/records`` and its sub-routes
(:mod:`records.api`) added to KServe's FastAPI application, when the deployment keeps records (``EXPLAIN_RECORDS``).

The routes read the deployment's store with a connection of their own, on one thread of their own (the store's calls
block), and ask for the records key of ``key_file.json`` in the door's run folder (made when missing,
:func:`records.keys.ensure_records_key`). A re-explanation of any record kept with payload ``full``
(:func:`doors.kserve.oip.stored.stored_document`: an OIP ``infer`` row's record read back through the model's OIP codec,
any other input as its task's document) is served by the model's backend
(:meth:`doors.kserve.kserve_model.ExplainModel.answer_documents`, as the door's REST route serves the document: in this
process, or on a Ray Serve replica) and recorded where it is served, with the re-explained record as its ``parent``
(:mod:`doors.kserve.row_records`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response

from records import new_request_id, open_store, records_settings
from records.api import PREFIX, KeptInput, RecordsApi, Reexplained, UnreadableInputError
from records.keys import ensure_records_key
from serving_core.recording import served_version

from .kserve_model import ExplainModel
from .oip.stored import stored_document
from .row_records import RecordedRow, RequestRecords

logger = logging.getLogger(__name__)


def add_records_routes(
    app: FastAPI,
    models: Mapping[str, ExplainModel],
    key_file: Path,
    environ: Mapping[str, str] | None = None,
) -> RecordsApi | None:
    """Add ``/v1/records`` and its sub-routes to ``app`` over the deployment's store, when it keeps records.

    Args:
        app: KServe's FastAPI application.
        models: The served models by name.
        key_file: The door's ``key_file.json`` (its ``records`` entry is made when missing).
        environ: The environment (default ``os.environ``).

    Returns:
        The routes' :class:`~records.api.RecordsApi`; None when the deployment keeps no records (no route added).

    Raises:
        SettingsError: the ``EXPLAIN_RECORDS*`` settings are not usable.
        StoreUnavailableError: the store cannot be opened.
    """
    settings = records_settings(None, environ, "EXPLAIN_RECORDS")
    if settings is None:
        return None
    store = open_store(settings.store, settings.payload)
    versions = {name: served_version(model.settings.archive) for name, model in models.items()}
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="records-api")
    serving: list[asyncio.AbstractEventLoop] = []  # the loop the models serve on, known at the first request

    def reexplain(kept: KeptInput) -> Reexplained:
        model = models[kept.model]
        document = {**stored_document(kept.input, model.settings.config), "explain": dict(kept.explain)}
        request = new_request_id()
        records = RequestRecords(request, (RecordedRow(0, None, document),), parent=kept.parent, refuse=False)
        answering = model.answer_documents([document], records)  # recorded where it is served
        return Reexplained(request, asyncio.run_coroutine_threadsafe(answering, serving[0]).result()[0])

    def read_input(model: str, task: str, kept: Mapping[str, Any] | bytes) -> Mapping[str, Any]:
        if model not in models:
            raise UnreadableInputError(f"model {model!r} is not served here")
        return stored_document(kept, models[model].settings.config)

    api = RecordsApi(
        store, key=ensure_records_key(key_file), versions=versions, reexplain=reexplain, read_input=read_input
    )

    async def records(request: Request) -> Response:
        body = await request.body()
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        if not serving:
            serving.append(asyncio.get_running_loop())
        reply = await serving[0].run_in_executor(
            pool, api.respond, request.method, target, request.headers.get("authorization"), body
        )
        assert reply is not None  # every path routed here is a records path
        return Response(reply.body, status_code=reply.status, media_type=reply.content_type)

    methods = ["GET", "POST", "DELETE", "PUT", "PATCH"]
    app.add_api_route(PREFIX, records, methods=methods)
    app.add_api_route(PREFIX + "/{rest:path}", records, methods=methods)
    logger.info("records routes on %s (the records key is in %s)", PREFIX, key_file)
    return api


__all__ = ["add_records_routes"]
