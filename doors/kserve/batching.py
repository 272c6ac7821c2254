"""Dynamic batching for the in-process KServe door: the rows of concurrent requests are served together.

KServe's Python model server calls ``predict`` once per request and has no batcher of its own (Ray Serve's
``@serve.batch`` does this job on the Ray door). :class:`RowBatcher` collects the rows of the requests that arrive
within ``max_delay`` seconds of the first one, up to ``max_rows`` rows, and serves them with one call of the serving
core in a worker thread (the event loop keeps accepting requests meanwhile); each request gets its own rows' outcomes
back, in order. One batch runs at a time, as one TorchServe worker runs one batch at a time.

Traces (:mod:`serving_core.tracing`): each batch runs inside a batch span linked to the request span of every
request in it; the serving core's stages (``forward``) are its children.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from serving_core import tracing
from serving_core.task import BatchTimings

logger = logging.getLogger(__name__)

#: One request's decoded rows (each the task's row, or the ``RowError`` it failed to decode with).
Rows = Sequence[Any]
#: Serves a batch of rows: one outcome per row, and the batch's shared timings.
RunBatch = Callable[[list[Any]], tuple[list[Any], BatchTimings]]


@dataclass(frozen=True)
class Served:
    """One request's share of a served batch.

    Attributes:
        outcomes: the request's rows' outcomes, in order.
        timings: the batch's shared stage seconds.
        batch_rows: rows in the whole batch (this request's and the others').
        first: whether this request was the first of its batch (so the batch is counted once in the metrics).
        refusals: where the rows were served by a backend that records them (Ray Serve replicas), per row None or
            the error to answer instead (``records_unavailable``); None where the door records them.
    """

    outcomes: list[Any]
    timings: BatchTimings
    batch_rows: int
    first: bool
    refusals: list[Any] | None = None


def serve_together(run: RunBatch, requests: Sequence[Rows]) -> list[Served]:
    """Serve several requests' rows with one call of ``run`` and split the outcomes back per request."""
    rows = [row for request in requests for row in request]
    outcomes, timings = run(rows)
    served: list[Served] = []
    start = 0
    for index, request in enumerate(requests):
        served.append(Served(outcomes[start : start + len(request)], timings, len(rows), index == 0))
        start += len(request)
    return served


def serve_traced(run: RunBatch, requests: Sequence[Rows], links: Sequence[Any]) -> list[Served]:
    """:func:`serve_together` inside a batch span linked to the requests' spans (``links``, each request's
    :func:`serving_core.tracing.current_span_context`)."""
    attributes = {
        "explain.batch_rows": sum(len(request) for request in requests),
        "explain.batch_requests": len(requests),
    }
    with tracing.batch_span(links, attributes=attributes):
        return serve_together(run, requests)


@dataclass
class _Pending:
    rows: Rows
    future: asyncio.Future[Served]
    span: Any = None


class RowBatcher:
    """Collects concurrent requests' rows into batches for ``run`` (see the module docstring)."""

    def __init__(self, run: RunBatch, max_rows: int, max_delay: float) -> None:
        """Create the batcher; it starts on the first :meth:`submit`.

        Args:
            run: serves a list of rows (the task service's ``run`` without encodings).
            max_rows: most rows per batch (a single larger request is still served whole).
            max_delay: seconds a batch waits for more requests after its first one.
        """
        if max_rows < 1 or max_delay < 0:
            raise ValueError(f"max_rows must be >= 1 and max_delay >= 0, got {max_rows} and {max_delay}")
        self.run = run
        self.max_rows = max_rows
        self.max_delay = max_delay
        self._queue: asyncio.Queue[_Pending] | None = None
        self._task: asyncio.Task[None] | None = None
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="explain-batch")

    async def submit(self, rows: Rows) -> Served:
        """Queue one request's rows and wait for their outcomes.

        Raises:
            Exception: whatever ``run`` raised for the batch.
        """
        if self._queue is None or self._task is None or self._task.done():
            self._queue = asyncio.Queue()
            self._task = asyncio.get_running_loop().create_task(self._loop(self._queue))
        future: asyncio.Future[Served] = asyncio.get_running_loop().create_future()
        await self._queue.put(_Pending(rows, future, tracing.current_span_context()))
        return await future

    async def _collect(self, queue: asyncio.Queue[_Pending]) -> list[_Pending]:
        batch = [await queue.get()]
        count = len(batch[0].rows)
        deadline = asyncio.get_running_loop().time() + self.max_delay
        while count < self.max_rows:
            item = await self._next(queue, deadline - asyncio.get_running_loop().time())
            if item is None:
                break
            batch.append(item)
            count += len(item.rows)
        return batch

    @staticmethod
    async def _next(queue: asyncio.Queue[_Pending], timeout: float) -> _Pending | None:
        """The next queued request within ``timeout`` seconds, else ``None`` (never loses a request: a get that
        completes while it is being cancelled is still returned)."""
        if not queue.empty() or timeout <= 0:
            return None if queue.empty() else queue.get_nowait()
        waiter = asyncio.get_running_loop().create_task(queue.get())
        done, _ = await asyncio.wait({waiter}, timeout=timeout)
        if waiter in done:
            return waiter.result()
        waiter.cancel()
        try:
            return await waiter
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise
            return None

    async def _loop(self, queue: asyncio.Queue[_Pending]) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._collect(queue)
            waiting = [item for item in batch if not item.future.done()]  # a cancelled caller's rows are skipped
            if not waiting:
                continue
            try:
                served = await loop.run_in_executor(
                    self._executor,
                    serve_traced,
                    self.run,
                    [item.rows for item in waiting],
                    [item.span for item in waiting],
                )
            except Exception as error:
                logger.exception("batch of %d requests failed", len(waiting))
                for item in waiting:
                    if not item.future.done():
                        item.future.set_exception(error)
                continue
            for item, result in zip(waiting, served, strict=True):
                if not item.future.done():
                    item.future.set_result(result)

    def close(self) -> None:
        """Stop the batching task and the worker thread."""
        if self._task is not None:
            self._task.cancel()
        self._executor.shutdown(wait=False, cancel_futures=True)
