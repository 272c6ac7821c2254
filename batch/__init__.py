"""Batch jobs: a file of inputs answered offline, as the online routes answer them, in this process or on Ray.

Door-neutral: it serves through the serving core (:mod:`serving_core`: the task's decode, ``service.run``, ``to_dict``;
the OpenAI translation of :mod:`serving_core.openai_api`) and imports no server.

- :mod:`~batch.models`: ``--model NAME=PATH`` (an archive or a checkpoint folder), each model's settings and version;
- :mod:`~batch.inputs`: the input's lines (the Batch API's JSONL, a Parquet table's rows) as requests or line errors;
- :mod:`~batch.answers`: a batch of requests answered by a loaded model, each as its route answers it;
- :mod:`~batch.lines`: the output and error lines (the Batch API's shape) and their ids;
- :mod:`~batch.files`: the output and error files, appended per batch and read back to resume;
- :mod:`~batch.manifest`: the job's fingerprint beside its output (another job's output is refused);
- :mod:`~batch.job`: the runner (:class:`~batch.job.BatchJob`), which the online Batch API drives too;
- :mod:`~batch.api`: the OpenAI Batch API (``/v1/files``, ``/v1/batches``): its files and batches in a state folder;
- :mod:`~batch.scheduler`: the API's batches run in the background below online traffic, resumed after a restart;
- :mod:`~batch.ray_job`: the same job on a Ray cluster (Ray Data ``map_batches`` on an actor pool);
- :mod:`~batch.records_source`: a records store's stored inputs as a job's input (``explain-batch --from-records``);
- :mod:`~batch.cli`: the ``explain-batch`` command.
"""

from .answers import Answer, LoadedModel
from .inputs import LineError, Request, Route, TableColumns
from .job import BatchJob, JobCounts, JobSpec, summary_line
from .manifest import ForeignOutputError, Manifest
from .models import BatchModel, open_model, parse_model_spec

__all__ = [
    "Answer",
    "BatchJob",
    "BatchModel",
    "ForeignOutputError",
    "JobCounts",
    "JobSpec",
    "LineError",
    "LoadedModel",
    "Manifest",
    "Request",
    "Route",
    "TableColumns",
    "open_model",
    "parse_model_spec",
    "summary_line",
]
