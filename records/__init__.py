"""Records of what the service answered: one CloudEvents 1.0 event per answered row, in a tamper-evident store.

Door-neutral and torch-free (no server is imported). The doors build a record per row with
:func:`~records.event.build_record` and hand a batch's records to their model's :class:`~records.recorder.Recorder`,
whose writer commits them in one transaction before the answers leave (or applies ``on_store_error``).

- :mod:`~records.ids`: request ids (the caller's ``X-Request-Id``, or one made) and row ids (``<id>-<index>``);
- :mod:`~records.event`: the record (CloudEvents envelope and data), payload modes (``full``, ``hash``, ``none``);
- :mod:`~records.chain`: the hash chain and its verification (changed, missing records named);
- :mod:`~records.store`: the interface of every store; :mod:`~records.sql`: the SQL stores' one implementation,
  :mod:`~records.sqlite_store` (the embedded default) and :mod:`~records.postgres_store` (production, with
  migrations); :mod:`~records.http_sink`: the write-only HTTP sink (CloudEvents binary mode, as KServe's logger);
- :mod:`~records.stores`: :func:`~records.stores.open_store` from a URL;
- :mod:`~records.settings`: the ``records:`` section and the ``EXPLAIN_RECORDS*`` environment;
- :mod:`~records.writer`: the writer, the ``on_store_error`` policy and ``explain_record_errors_total``;
- :mod:`~records.recorder`: :class:`~records.recorder.Recorder`, a model's settings and its (shared) writer: what a
  door holds;
- :mod:`~records.cli`: ``explain-records verify|list|show|erase|retain``;
- :mod:`~records.api`: the ``/v1/records`` routes, door-neutral (list, read, page, re-explain, erase, behind the
  records key); :mod:`~records.keys`: the records key in ``key_file.json``.
"""

from __future__ import annotations

from .chain import Problem, Verification
from .errors import (
    InvalidRecordIdError,
    RecordsError,
    SettingsError,
    StoreUnavailableError,
    StoreUrlError,
    WriteOnlyStoreError,
)
from .event import Payload, Record, build_record, input_matches, recorded_input
from .ids import check_record_id, new_request_id, request_id, row_id
from .settings import OnStoreError, RecordsSettings, records_settings
from .store import Page, RecordStore, StoredRecord
from .stores import open_store, parse_store_url

__all__ = [
    "InvalidRecordIdError",
    "OnStoreError",
    "Page",
    "Payload",
    "Problem",
    "Record",
    "RecordStore",
    "RecordsError",
    "RecordsSettings",
    "SettingsError",
    "StoreUnavailableError",
    "StoreUrlError",
    "StoredRecord",
    "Verification",
    "WriteOnlyStoreError",
    "build_record",
    "check_record_id",
    "input_matches",
    "new_request_id",
    "open_store",
    "parse_store_url",
    "recorded_input",
    "records_settings",
    "request_id",
    "row_id",
]
