"""The OpenAI Batch API on TorchServe's door: ``/v1/files`` and ``/v1/batches`` (:mod:`batch.api`) answered by the
router (:mod:`doors.torchserve.router`) on the public inference port, behind TorchServe's own inference token (the
caller's ``Authorization`` is checked by TorchServe's ``/ping``, as the OpenAI door does), each batch run by a niced
child process that loads its models from the served archives (:class:`batch.scheduler.ProcessRunner`: TorchServe's
workers stay free for online traffic). The state folder is ``batch_api/`` of the run folder: batches resume when the
router restarts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from batch.api import ApiError, BatchApi, BatchStore
from batch.scheduler import BatchScheduler, ProcessRunner
from forwarding import Reply, Upstream


class BatchDoor:
    """The Batch API for the models ``models`` (name → archive folder) with its state in ``state_dir``."""

    def __init__(self, state_dir: Path, models: Mapping[str, Path]) -> None:
        """Open the state folder and start the scheduler (it resumes the batches left active)."""
        self.store = BatchStore(state_dir)
        self.scheduler = BatchScheduler(self.store, ProcessRunner(models))
        self.api = BatchApi(self.store, models, self.scheduler.wake)
        self.scheduler.start()

    def respond(
        self, method: str, path: str, authorization: str | None, body: bytes, upstream: Upstream,
        headers: Mapping[str, str] | None = None,
    ) -> Reply | None:  # fmt: skip
        """The answer of a Batch API request once TorchServe accepts its token; ``None`` for any other path."""
        if not BatchApi.owns(path):
            return None
        check = {"Authorization": authorization} if authorization is not None else {}
        try:
            response, _ = upstream.request("GET", "/ping", None, check)
        except OSError:
            return _error(ApiError(503, "unavailable", "the model server is not reachable right now; retry"))
        if response.status != 200:
            return _error(
                ApiError(
                    401,
                    "invalid_api_key",
                    "invalid API key: send the inference token (run/key_file.json, 'inference') as the key "
                    "(Authorization: Bearer <token>)",
                )
            )
        answer = self.api.handle(method, path, dict(headers or {}), body)
        return Reply(answer.status, answer.body, answer.content_type)

    def refusal(self, path: str, status: int, message: str) -> Reply | None:
        """The router's own refusal of a Batch API request (a body over its bound: 413) in OpenAI's shape."""
        if not BatchApi.owns(path):
            return None
        return _error(ApiError(status, "file_too_large" if status == 413 else "invalid_request", message))

    def close(self) -> None:
        """Stop the scheduler (a running batch stops between two batches of lines and resumes on restart)."""
        self.scheduler.stop()


def _error(error: ApiError) -> Reply:
    return Reply(error.status, json.dumps(error.to_dict()).encode("utf-8"))
