"""The job runner: a job's input lines → its output and error lines, in batches, resumable, with progress.

A job (:class:`JobSpec`) is an input (JSONL of the Batch API, a Parquet table and its :class:`TableColumns`, or the
stored inputs of a records store, :class:`batch.records_source.RecordsQuery`), the output file beside its error file
and manifest, and the models the lines ask for. :class:`BatchJob` runs it in this process (:meth:`BatchJob.run`), or
prepares it for another engine (:mod:`batch.ray_job` calls :meth:`BatchJob.start`, :meth:`BatchJob.pending` and
:meth:`BatchJob.write` itself):

1. :meth:`~BatchJob.start` claims the output (:func:`batch.manifest.claim`: another job's output is refused), cuts a
   torn last line, reads the ids already written (skipped) and opens the files;
2. the input is read line by line; a line that cannot be sent goes to the error file at once, a line already answered
   is skipped, the others wait for their model's batch (``batch_size`` requests, default the model's ``batchSize``);
3. a full batch is answered (:class:`batch.answers.LoadedModel`: the serving core's decode → ``service.run`` →
   ``to_dict``, the body the online route answers) and its lines are appended and flushed before the next batch.

The caller sees the counts (:class:`JobCounts`) after every batch (``on_progress``), and may stop the job between
batches (``should_stop``): what was written stays written, and a rerun resumes it. The online Batch API
(``/v1/batches``, :mod:`batch.scheduler`) drives the same runner.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from model_store.progress import ProgressSetting, progress_bar
from serving_core.task import get_task

from .answers import Answer, LoadedModel
from .files import JobFiles, default_errors_path, repair, written_ids
from .inputs import LineError, Request, TableColumns, count_jsonl, parquet_rows, read_jsonl, read_parquet
from .lines import answer_line, error_line, is_success, request_id
from .manifest import Manifest, claim
from .models import BatchModel
from .records_source import RecordsQuery


@dataclass(frozen=True)
class JobSpec:
    """One job.

    Attributes:
        input: the input file: JSONL (Batch API lines) or, with ``columns``, a Parquet table (``None`` with
            ``records``).
        output: the output file (its error file and manifest beside it).
        models: the models its lines may ask for.
        columns: a Parquet table's columns (``None``: the input is JSONL).
        errors: the error file (``None``: ``OUTPUT.errors.jsonl``).
        batch_size: requests per batch (``None``: each model's ``batchSize``).
        records: stored inputs to re-explain instead of a file (:mod:`batch.records_source`).
    """

    input: Path | None
    output: Path
    models: tuple[BatchModel, ...]
    columns: TableColumns | None = None
    errors: Path | None = None
    batch_size: int | None = None
    records: RecordsQuery | None = None

    def __post_init__(self) -> None:
        """Check the models' names are distinct, the job has one input, and a table's (records') model is one of
        them."""
        names = [model.name for model in self.models]
        if not names or len(set(names)) != len(names):
            raise ValueError(f"a job needs one or more models of distinct names, got {names}")
        if (self.input is None) == (self.records is None):
            raise ValueError("a job reads either an input file or records, not both nor neither")
        for source in (self.columns, self.records):
            if source is not None and source.model not in names:
                raise ValueError(f"the input's model {source.model!r} is not one of the job's models {names}")
        if self.batch_size is not None and self.batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {self.batch_size}")


@dataclass
class JobCounts:
    """Where a job stands (the Batch API's ``request_counts`` and more).

    Attributes:
        total: lines in the input.
        skipped: lines already answered by an earlier run (not answered again).
        completed: lines answered with a 2xx status in this run (output file).
        failed: lines answered with another status, or not sent (error file), in this run.
        retried: lines of the error file of the previous run, answered again in this one.
        seconds: seconds this run took so far.
    """

    total: int = 0
    skipped: int = 0
    completed: int = 0
    failed: int = 0
    retried: int = 0
    seconds: float = 0.0

    @property
    def done(self) -> int:
        """Lines dealt with (skipped, completed or failed)."""
        return self.skipped + self.completed + self.failed


class BatchJob:
    """A job's runner (module docstring)."""

    def __init__(self, spec: JobSpec) -> None:
        """Describe the job (its manifest); nothing is opened or loaded yet."""
        self.spec = spec
        self.models: dict[str, BatchModel] = {model.name: model for model in spec.models}
        source = spec.columns or spec.records
        self.manifest = Manifest.of(spec.models, source.describe() if source is not None else {})
        self.errors_path = spec.errors or default_errors_path(spec.output)
        self.counts = JobCounts()
        self._done: set[str] = set()
        self._files: JobFiles | None = None

    def start(self) -> JobFiles:
        """Claim the output, read what is already written, open the files (module docstring, step 1).

        Raises:
            batch.manifest.ForeignOutputError: if the output is another job's.
            ValueError: if the output or error file is not a job's.
        """
        claim(self.spec.output, self.manifest)
        repair(self.spec.output)
        repair(self.errors_path)
        self._done = written_ids(self.spec.output)
        previous = written_ids(self.errors_path) if self.errors_path.is_file() else set()
        self.counts = JobCounts(total=self._count(), retried=len(previous - self._done))
        self._files = JobFiles(self.spec.output, self.errors_path)
        return self._files

    def items(self) -> Iterator[Request | LineError]:
        """The input's lines, in order (:mod:`batch.inputs`)."""
        columns, path = self.spec.columns, self.spec.input
        if self.spec.records is not None:
            return self.spec.records.requests(self.models)
        assert path is not None
        if columns is None:
            return read_jsonl(path, self.models)
        main_input = get_task(self.models[columns.model].config.task).main_input
        return read_parquet(path, columns, main_input)

    def pending(self) -> Iterator[Request | LineError]:
        """The lines still to deal with: every line error, and the requests not answered yet (the others counted
        as skipped). Call :meth:`start` first."""
        for item in self.items():
            if isinstance(item, Request) and item.custom_id in self._done:
                self.counts.skipped += 1
                continue
            yield item

    def request_ids(self, requests: Sequence[Request]) -> list[str]:
        """The answer ids of requests (:func:`batch.lines.request_id`)."""
        return [request_id(self.manifest.fingerprint, request.custom_id) for request in requests]

    def batch_size(self, model: str) -> int:
        """Requests per batch of ``model``."""
        return self.spec.batch_size or self.models[model].batch_size

    def write(self, answers: Sequence[Answer], errors: Sequence[LineError] = ()) -> None:
        """Append one batch's answers (output or error file, by status) and line errors, and count them."""
        if self._files is None:
            raise RuntimeError("BatchJob.start() was not called")
        outputs = [answer_line(answer) for answer in answers if is_success(answer.status_code)]
        failures = [answer_line(answer) for answer in answers if not is_success(answer.status_code)]
        failures += [error_line(self.manifest.fingerprint, error) for error in errors]
        self._files.write(outputs, failures)
        self.counts.completed += len(outputs)
        self.counts.failed += len(failures)

    def run(
        self,
        progress: ProgressSetting = True,
        loaded: Mapping[str, LoadedModel] | None = None,
        on_progress: Callable[[JobCounts], None] | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> JobCounts:
        """Run the job in this process (module docstring) and return its counts.

        Args:
            progress: the progress bar (:func:`model_store.progress.progress_bar`'s setting).
            loaded: models loaded already, by name (the others are loaded here, each once, once the output is
                claimed and before any line).
            on_progress: called with the counts after every written batch.
            should_stop: asked between batches; ``True`` ends the run there (a rerun resumes it).

        Raises:
            batch.manifest.ForeignOutputError: if the output is another job's.
        """
        started = time.monotonic()
        files = self.start()
        try:
            models = dict(loaded or {})
            for name, model in self.models.items():
                if name not in models:
                    models[name] = LoadedModel(model)
        except BaseException:
            files.close()
            raise
        waiting: dict[str, list[Request]] = {name: [] for name in self.models}
        errors: list[LineError] = []
        with files, progress_bar(total=self.counts.total, desc="explain-batch", unit="line", enabled=progress) as bar:
            last = 0

            def flush(name: str | None) -> None:
                nonlocal last
                requests = waiting[name] if name is not None else []
                answers = (
                    models[name].answer(requests, self.request_ids(requests), self.batch_size(name)) if name else []
                )
                self.write(answers, errors)
                requests.clear()
                errors.clear()
                self.counts.seconds = time.monotonic() - started
                bar.update(self.counts.done - last)
                last = self.counts.done
                if on_progress is not None:
                    on_progress(dataclasses.replace(self.counts))

            for item in self.pending():
                if isinstance(item, LineError):
                    errors.append(item)
                    if len(errors) >= 64:
                        flush(None)
                    continue
                queue = waiting[item.route.model]
                queue.append(item)
                if len(queue) >= self.batch_size(item.route.model):
                    flush(item.route.model)
                    if should_stop is not None and should_stop():
                        break
            else:
                for name, queue in waiting.items():
                    if queue:
                        flush(name)
                flush(None)
        self.counts.seconds = time.monotonic() - started
        return self.counts

    def _count(self) -> int:
        if self.spec.records is not None:
            return self.spec.records.count()
        assert self.spec.input is not None
        if self.spec.columns is None:
            return count_jsonl(self.spec.input)
        return parquet_rows(self.spec.input)


def summary_line(counts: JobCounts, output: Path, errors: Path) -> str:
    """The job's last line: what was answered, skipped and failed, where, how fast."""
    answered = counts.completed + counts.failed
    rate = answered / counts.seconds if counts.seconds > 0 else 0.0
    retried = f", {counts.retried} failed earlier retried" if counts.retried else ""
    return (
        f"explain-batch: {counts.total} lines: {counts.completed} answered -> {output}, {counts.failed} failed -> "
        f"{errors}, {counts.skipped} already answered{retried}; {counts.seconds:.1f}s ({rate:.1f} lines/s)"
    )
