"""Running the Batch API's batches (:mod:`batch.api`) in the background, below online traffic, resumably.

A :class:`BatchScheduler` is one background thread per door. It takes the batches still to run or finish
(:meth:`batch.api.BatchStore.active_batches`: after a restart, the ones it was running), oldest first, and moves each
through its statuses:

1. :func:`validate` (``validating`` → ``in_progress``): the input's lines counted (none: ``failed``);
2. its :class:`Runner` answers the lines with the job runner (:class:`ApiJob`, a :class:`batch.job.BatchJob` whose
   lines must all have the batch's ``endpoint`` as their ``url``; any other line is an error line), which appends
   each answered batch of lines to ``output.jsonl`` and its error file, and the counts to ``progress.json``; it stops
   between two batches of lines when the batch is ``cancelling`` or past ``expires_at`` (what is written stays
   written; a job stopped by a restart resumes where it was, through its manifest);
3. :func:`finish` (→ ``finalizing`` → ``completed``, or ``cancelled``, ``expired``, ``failed``): the output and error
   files registered as files (``output_file_id``, ``error_file_id``).

Two runners, one per way a door reaches its models:

- :class:`ThreadRunner` (the KServe door): in the door's process, through the door's own loaded models (each
  :class:`batch.answers.LoadedModel` given a ``service`` that submits rows to the door's backend, where they batch
  with online rows: answers are identical, batched or alone, and no second copy of a model is loaded). It runs at
  lower priority by yielding: before each batch of lines it waits while online requests are in flight
  (:class:`OnlineTraffic`), and its thread is niced;
- :class:`ProcessRunner` (the TorchServe door, run by the router): each batch in a child process ``python -m
  batch.scheduler`` niced to 10, which loads the batch's models from their archives with :mod:`batch.answers` (the
  serving core TorchServe's handler runs: answers identical to ``/predictions``) and leaves TorchServe's workers to
  online traffic: on CPU the kernel gives the online workers the cores first; calling TorchServe's
  ``/predictions`` on loopback instead would queue the job's requests in the online workers' FIFO queue, ahead of
  online requests that come after them. A file lock (``batches/<id>/lock``) keeps two runners off one batch.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from .answers import LoadedModel
from .api import BatchStore, _write_json, endpoint_model
from .inputs import LineError, Request
from .job import BatchJob, JobCounts, JobSpec
from .models import BatchModel, open_model, parse_model_spec

logger = logging.getLogger(__name__)

#: The nice value of a job's thread or process (online work runs at 0).
JOB_NICE = 10
OUTPUT = "output.jsonl"


class ApiJob(BatchJob):
    """A batch's job: a line whose ``url`` is not the batch's ``endpoint`` is an ``invalid_url`` error line."""

    def __init__(self, spec: JobSpec, endpoint: str) -> None:
        """The job of ``spec`` for ``endpoint``."""
        super().__init__(spec)
        self.endpoint = endpoint

    def items(self) -> Iterator[Request | LineError]:
        """The input's lines (:meth:`batch.job.BatchJob.items`), those of another ``url`` turned into errors."""
        for item in super().items():
            if isinstance(item, Request) and item.url != self.endpoint:
                message = f"line {item.line}: url {item.url!r} is not the batch's endpoint {self.endpoint!r}"
                yield LineError(item.line, item.custom_id, "invalid_url", message)
            else:
                yield item


def job_models(endpoint: str, models: Mapping[str, BatchModel]) -> dict[str, BatchModel]:
    """The models a batch of ``endpoint`` may ask for: ``/predictions/<model>``'s model, or the generation models
    for the OpenAI endpoints."""
    name = endpoint_model(endpoint)
    if name is not None:
        return {name: models[name]} if name in models else {}
    return {key: model for key, model in models.items() if model.config.task == "generation"}


def validate(store: BatchStore, batch_id: str) -> bool:
    """``validating`` → ``in_progress`` (its lines counted), or ``failed`` for an input without lines; whether the
    batch is to run."""
    batch = store.get_batch(batch_id)
    if batch["status"] != "validating":
        return batch["status"] == "in_progress"
    path = store.file_path(batch["input_file_id"])
    with path.open("rb") as file:
        total = sum(1 for raw in file if raw.strip())
    if total == 0:
        error = {"code": "empty_file", "message": "the input file has no lines", "param": "input_file_id", "line": None}
        store.set_status(batch_id, "failed", errors={"object": "list", "data": [error]})
        return False
    counts = {"total": total, "completed": 0, "failed": 0}
    store.set_status(batch_id, "in_progress", request_counts=counts)
    return True


def finish(store: BatchStore, batch_id: str, failure: str | None = None) -> dict[str, Any]:
    """End a batch whose runner returned: ``failed`` (``failure``), ``cancelled``, ``expired`` or, through
    ``finalizing``, ``completed``; the output and error files registered (a batch that did not complete keeps the
    lines it finished)."""
    folder = store.batch_dir(batch_id)
    batch = store.get_batch(batch_id)
    counts = batch["request_counts"]
    if failure is not None:
        error = {"code": "batch_failed", "message": failure, "param": None, "line": None}
        return store.set_status(batch_id, "failed", errors={"object": "list", "data": [error]}, request_counts=counts)
    done = counts["completed"] + counts["failed"] >= counts["total"]
    if batch["status"] == "cancelling":
        status = "cancelled"
    elif not done and time.time() > batch["expires_at"]:
        status = "expired"
    elif not done:
        return batch  # stopped by the service's shutdown: resumed on its restart
    else:
        status = "completed"
        if batch["status"] != "finalizing":
            store.set_status(batch_id, "finalizing", request_counts=counts)
    output = store.add_output_file(batch_id, "output", folder / OUTPUT)
    errors = store.add_output_file(batch_id, "error", folder / f"{OUTPUT}.errors.jsonl")
    return store.set_status(batch_id, status, request_counts=counts, output_file_id=output, error_file_id=errors)


def execute(
    store: BatchStore,
    batch_id: str,
    models: Mapping[str, BatchModel],
    loaded: Mapping[str, LoadedModel] | None = None,
    before_batch: Callable[[], None] | None = None,
    stopping: Callable[[], bool] | None = None,
) -> None:
    """Answer an ``in_progress`` batch's lines not answered yet (module docstring, step 2), in this thread.

    Args:
        store: the state folder.
        batch_id: the batch.
        models: the door's models (those of the batch's endpoint are used).
        loaded: those already loaded, by name (the others are loaded here).
        before_batch: called before each batch of lines (a runner's yield to online traffic).
        stopping: whether the service is stopping (the job stops between batches; it resumes on restart).

    Raises:
        Exception: if the job cannot run (a model that cannot be loaded, an output of another model version).
    """
    batch = store.get_batch(batch_id)
    folder = store.batch_dir(batch_id)
    chosen = job_models(batch["endpoint"], models)
    if not chosen:
        raise ValueError(f"no model serves {batch['endpoint']}")
    spec = JobSpec(store.file_path(batch["input_file_id"]), folder / OUTPUT, tuple(chosen.values()))
    job = ApiJob(spec, batch["endpoint"])
    total = batch["request_counts"]["total"]

    def progress(counts: JobCounts) -> None:
        document = {"total": total, "completed": counts.skipped + counts.completed, "failed": counts.failed}
        _write_json(folder / "progress.json", document)

    def should_stop() -> bool:
        if before_batch is not None:
            before_batch()
        state = store.get_batch(batch_id)
        return state["status"] != "in_progress" or time.time() > state["expires_at"] or bool(stopping and stopping())

    if before_batch is not None:
        before_batch()
    usable = {name: model for name, model in (loaded or {}).items() if name in chosen}
    job.run(progress=False, loaded=usable, on_progress=progress, should_stop=should_stop)


class Runner(Protocol):
    """Runs one ``in_progress`` batch's job (:func:`execute`) somewhere."""

    def run(self, store: BatchStore, batch_id: str, stopping: Callable[[], bool]) -> None:
        """Run it until it is done or stops.

        Raises:
            Exception: if the job cannot run (the batch becomes ``failed`` with the message).
        """
        ...


class OnlineTraffic:
    """The door's online requests in flight, counted by the door (:meth:`started`, :meth:`ended`); a job waits
    for them (:meth:`wait_idle`) before each of its batches."""

    def __init__(self) -> None:
        """No request in flight."""
        self._count = 0
        self._idle = threading.Condition()

    def started(self) -> None:
        """An online request came in."""
        with self._idle:
            self._count += 1

    def ended(self) -> None:
        """An online request was answered."""
        with self._idle:
            self._count -= 1
            if self._count <= 0:
                self._idle.notify_all()

    def wait_idle(self, quiet: float = 0.05, longest: float = 5.0) -> None:
        """Wait until no online request has been in flight for ``quiet`` seconds, at most ``longest`` seconds (so
        that a job under steady traffic still moves)."""
        end = time.monotonic() + longest
        with self._idle:
            while time.monotonic() < end:
                if self._count <= 0:
                    self._idle.wait(quiet)
                    if self._count <= 0:
                        return
                else:
                    self._idle.wait(min(quiet, max(end - time.monotonic(), 0.0)))


class DoorService:
    """A door's model seen as a :class:`serving_core.task.Service`: ``run`` submits the rows to an ``async
    serve(rows)`` of the door (its backend, where they batch with online rows) on the door's event loop."""

    def __init__(self, serve: Callable[[Sequence[Any]], Any], loop: asyncio.AbstractEventLoop, head_type: str) -> None:
        """``serve(rows)``: a coroutine giving a share of a batch (``outcomes``, ``timings``)."""
        self._serve = serve
        self._loop = loop
        self.head_type = head_type

    def run(self, rows: Sequence[Any], encodings: Sequence[Any]) -> tuple[list[Any], Any]:
        """The rows' outcomes and timings, served by the door (every batch row answers in JSON)."""
        served = asyncio.run_coroutine_threadsafe(self._serve(list(rows)), self._loop).result()
        return list(served.outcomes), served.timings


class ThreadRunner:
    """Runs a batch in the scheduler's thread, through the door's loaded models (module docstring)."""

    def __init__(
        self, models: Mapping[str, BatchModel], loaded: Mapping[str, LoadedModel], traffic: OnlineTraffic
    ) -> None:
        """The door's models, each loaded, and its online traffic."""
        self.models = models
        self.loaded = loaded
        self.traffic = traffic

    def run(self, store: BatchStore, batch_id: str, stopping: Callable[[], bool]) -> None:
        """:func:`execute` with the door's models, yielding to online requests before each batch."""
        execute(store, batch_id, self.models, self.loaded, self.traffic.wait_idle, stopping)


class ProcessRunner:
    """Runs each batch in a niced child process that loads its models from their archive folders (module
    docstring)."""

    def __init__(self, models: Mapping[str, Path], nice: int = JOB_NICE) -> None:
        """``models``: each model's archive folder, by name."""
        self.models = dict(models)
        self.nice = nice

    def command(self, store: BatchStore, batch_id: str) -> list[str]:
        """The child's command line."""
        command = [sys.executable, "-m", "batch.scheduler", "--root", str(store.root), "--batch", batch_id]
        for name, path in self.models.items():
            command += ["--model", f"{name}={path}"]
        return [*command, "--nice", str(self.nice)]

    def run(self, store: BatchStore, batch_id: str, stopping: Callable[[], bool]) -> None:
        """Run the child until it ends; stop it (SIGTERM: it ends between two batches of lines) when the service
        stops.

        Raises:
            RuntimeError: the child's failure (its last line of standard error).
        """
        folder = store.batch_dir(batch_id)
        with (folder / "job.log").open("ab") as log:
            child = subprocess.Popen(self.command(store, batch_id), stdout=log, stderr=log)
            try:
                while child.poll() is None:
                    if stopping():
                        child.terminate()
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        child.wait(0.2)
            finally:
                if child.poll() is None:
                    child.kill()
                    child.wait()
        failure = folder / "failure.json"
        if failure.is_file():
            message = json.loads(failure.read_text(encoding="utf-8"))["message"]
            failure.unlink()
            raise RuntimeError(message)


class BatchScheduler:
    """The background thread that runs a door's batches one at a time (module docstring)."""

    def __init__(self, store: BatchStore, runner: Runner, poll: float = 1.0) -> None:
        """Run ``store``'s batches with ``runner``; look for new ones every ``poll`` seconds (or on :meth:`wake`)."""
        self.store = store
        self.runner = runner
        self.poll = poll
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> BatchScheduler:
        """Start the thread (it resumes the batches a previous run left active)."""
        self._thread = threading.Thread(target=self._loop, name="batch-scheduler", daemon=True)
        self._thread.start()
        return self

    def wake(self) -> None:
        """A batch was created or cancelled: look now."""
        self._wake.set()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop between two batches of lines and wait for the thread."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _loop(self) -> None:
        with contextlib.suppress(OSError):
            os.nice(JOB_NICE)  # this thread only (Linux: the nice value is per thread)
        while not self._stop.is_set():
            for batch_id in self.store.active_batches():
                if self._stop.is_set():
                    break
                try:
                    self.run_one(batch_id)
                except Exception:
                    logger.exception("batch %s: the scheduler failed", batch_id)
            self._wake.wait(self.poll)
            self._wake.clear()

    def run_one(self, batch_id: str) -> dict[str, Any]:
        """Move one active batch as far as it goes now (module docstring); its object."""
        if self.store.get_batch(batch_id)["status"] == "validating":
            validate(self.store, batch_id)
        status = self.store.get_batch(batch_id)["status"]
        if status == "failed":  # an input without lines
            return self.store.get_batch(batch_id)
        if status == "in_progress":
            try:
                self.runner.run(self.store, batch_id, self._stop.is_set)
            except Exception as error:
                logger.warning("batch %s failed: %s", batch_id, error)
                return finish(self.store, batch_id, failure=str(error) or type(error).__name__)
            if self._stop.is_set() and self.store.get_batch(batch_id)["status"] == "in_progress":
                return self.store.get_batch(batch_id)  # the service stops: resumed on its restart
        return finish(self.store, batch_id)


def main(argv: list[str] | None = None) -> int:
    """The child process of :class:`ProcessRunner`: run one batch, holding its lock (exit status 1 on failure, its
    message in ``failure.json``)."""
    parser = argparse.ArgumentParser(prog="python -m batch.scheduler", description="run one Batch API batch")
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--batch", required=True)
    parser.add_argument("--model", action="append", default=[], type=parse_model_spec)
    parser.add_argument("--nice", type=int, default=JOB_NICE)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    os.nice(args.nice)
    store = BatchStore(args.root)
    folder = store.batch_dir(args.batch)
    parent = os.getppid()
    stop = threading.Event()
    import signal

    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with (folder / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a runner left over from before a restart finishes first
        try:
            models = {name: open_model(name, path) for name, path in args.model}
            execute(store, args.batch, models, stopping=lambda: stop.is_set() or os.getppid() != parent)
        except Exception as error:
            logger.exception("batch %s failed", args.batch)
            _write_json(folder / "failure.json", {"message": str(error) or type(error).__name__})
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
