"""The same job on a Ray cluster: Ray Data's ``map_batches`` on an actor pool, one model load per actor.

The driver (this process) does everything but the answering, as :meth:`batch.job.BatchJob.run` does: it claims the
output, reads the input, writes the line errors, and skips the ids already written; the requests left become a
dataset (``ray.data.from_items``, in input order) that ``map_batches`` sends, ``batch_size`` rows at a time, to an
actor pool (``ActorPoolStrategy(min_size=1, max_size=actors)``), each actor (:class:`RayAnswerer`) loading every model
of the job once and answering its batches with :class:`batch.answers.LoadedModel`, so each body is the one the local
run writes. The driver writes each answered batch as it arrives (in input order: ``preserve_order``), so the lines are
the local run's lines.

A node lost mid-job loses no line and duplicates none: Ray Data restarts the pool's actors and retries their batches
(``max_restarts``/``max_task_retries``), only the driver writes, and it writes each ``custom_id`` once. A driver killed
mid-job is resumed by a rerun, as a local job is (the manifest; ids already written are skipped).
"""

from __future__ import annotations

import json
import time
from typing import Any

from model_store.progress import ProgressSetting, progress_bar

from .answers import Answer, LoadedModel
from .inputs import LineError, Request, parse_route
from .job import BatchJob, JobCounts
from .models import BatchModel


class RayAnswerer:
    """The ``map_batches`` callable class: a pool actor holding the job's models, loaded once."""

    def __init__(self, models: list[BatchModel], job: str, batch_size: int | None) -> None:
        """Load every model of the job (each actor once)."""
        self.models = {model.name: model for model in models}
        self.loaded = {model.name: LoadedModel(model) for model in models}
        self.job = job
        self.batch_size = batch_size

    def __call__(self, batch: dict[str, Any]) -> dict[str, list[Any]]:
        """Answer a batch of rows ``{custom_id, url, body (JSON text), line}``, grouped by model, in order."""
        from .lines import request_id

        requests = [
            Request(str(custom_id), str(url), parse_route(url, body, self.models), body, int(line))
            for custom_id, url, body, line in zip(
                batch["custom_id"],
                batch["url"],
                (json.loads(text) for text in batch["body"]),
                batch["line"],
                strict=True,
            )
        ]
        answers: dict[str, Answer] = {}
        for name, loaded in self.loaded.items():
            mine = [request for request in requests if request.route.model == name]
            if mine:
                ids = [request_id(self.job, request.custom_id) for request in mine]
                size = self.batch_size or self.models[name].batch_size
                for answer in loaded.answer(mine, ids, size):
                    answers[answer.request.custom_id] = answer
        ordered = [answers[request.custom_id] for request in requests]
        return {
            "custom_id": [answer.request.custom_id for answer in ordered],
            "request_id": [answer.request_id for answer in ordered],
            "status_code": [answer.status_code for answer in ordered],
            "body": [json.dumps(answer.body, separators=(",", ":")) for answer in ordered],
        }


def run_on_ray(
    job: BatchJob, address: str, actors: int = 2, actor_cpus: float = 1.0, progress: ProgressSetting = True
) -> JobCounts:
    """Run ``job`` on the Ray cluster at ``address`` (module docstring) and return its counts.

    Args:
        job: the job.
        address: the cluster (``ray.init(address=...)``: ``HOST:PORT``, ``auto``, ``ray://...``).
        actors: the most actors of the pool (each holds every model of the job).
        actor_cpus: CPUs each actor asks for.
        progress: the progress bar setting (:func:`model_store.progress.progress_bar`).

    Raises:
        batch.manifest.ForeignOutputError: if the output is another job's.
        ValueError: if ``actors`` or ``actor_cpus`` is not positive.
    """
    if actors < 1 or actor_cpus <= 0:
        raise ValueError(f"--actors must be at least 1 and --actor-cpus above 0, got {actors} and {actor_cpus}")
    import ray

    started = time.monotonic()
    with job.start():
        requests: dict[str, Request] = {}
        errors: list[LineError] = []
        for item in job.pending():
            if isinstance(item, LineError):
                errors.append(item)
            else:
                requests[item.custom_id] = item
        job.write([], errors)
        with progress_bar(total=job.counts.total, desc="explain-batch (ray)", unit="line", enabled=progress) as bar:
            bar.update(job.counts.done)
            if requests:
                _answer_on_ray(ray, job, address, list(requests.values()), actors, actor_cpus, bar)
    job.counts.seconds = time.monotonic() - started
    return job.counts


def _answer_on_ray(
    ray: Any, job: BatchJob, address: str, requests: list[Request], actors: int, actor_cpus: float, bar: Any
) -> None:
    """Answer the requests on the cluster and write each batch as it comes back (each ``custom_id`` once)."""
    by_id = {request.custom_id: request for request in requests}
    rows = [
        {"custom_id": request.custom_id, "url": request.url, "body": json.dumps(request.body), "line": request.line}
        for request in requests
    ]
    batch_size = job.spec.batch_size or min(model.batch_size for model in job.spec.models)
    ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
    try:
        data_context = ray.data.DataContext.get_current()
        data_context.execution_options.preserve_order = True
        data_context.enable_progress_bars = False
        dataset = ray.data.from_items(rows, override_num_blocks=max(1, len(rows) // batch_size)).map_batches(
            RayAnswerer,
            fn_constructor_kwargs={
                "models": list(job.spec.models),
                "job": job.manifest.fingerprint,
                "batch_size": job.spec.batch_size,
            },
            batch_size=batch_size,
            compute=ray.data.ActorPoolStrategy(min_size=1, max_size=actors),
            num_cpus=actor_cpus,
        )
        written: set[str] = set()
        for batch in dataset.iter_batches(batch_size=None, batch_format="numpy"):
            answers = []
            for custom_id, answer_id, status, body in zip(
                batch["custom_id"], batch["request_id"], batch["status_code"], batch["body"], strict=True
            ):
                if str(custom_id) in written:
                    continue
                written.add(str(custom_id))
                answers.append(Answer(by_id[str(custom_id)], str(answer_id), int(status), json.loads(body)))
            before = job.counts.done
            job.write(answers)
            bar.update(job.counts.done - before)
    finally:
        ray.shutdown()
