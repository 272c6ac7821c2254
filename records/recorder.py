"""A model's records in one object: its settings, and the writer of its store, shared by the models of a process that
use the same store (one connection and one writer thread per store, payload mode and retention).

What a door does with it (``records:`` is the model's section, None when it has none)::

    recorder = Recorder.open("sentiment", records_section)   # None: this model keeps no records
    ...
    answers = ...                                             # the batch's answer documents
    if recorder is not None:
        recorder.record([build_record(..., answer=answer, ...) for answer in answers])  # before they leave

:meth:`Recorder.record` returns once the batch's records are committed, or applies ``on_store_error``: with
``refuse`` it raises the ``records_unavailable`` :class:`~serving_core.errors.RowError`, which the door answers for
every row of the batch. A store that cannot be opened when the model loads (a database not up yet) does not stop
the model: each batch tries to open it again, and until then the policy answers.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from contextlib import suppress
from typing import Any

from .errors import StoreUnavailableError
from .event import Payload, Record
from .settings import RecordsSettings, records_settings
from .stores import open_store
from .writer import RecordWriter, handle_store_error

_writers: dict[tuple[str, Payload, float | None], RecordWriter] = {}
_writers_lock = threading.Lock()


def shared_writer(settings: RecordsSettings) -> RecordWriter:
    """The process's writer for these settings' store, payload mode and retention (opened on first use).

    Raises:
        StoreUnavailableError: the store cannot be opened.
    """
    key = (settings.store, settings.payload, settings.retention_days)
    with _writers_lock:
        writer = _writers.get(key)
        if writer is None:
            store = open_store(settings.store, payload=settings.payload)
            writer = _writers[key] = RecordWriter(store, retention_days=settings.retention_days)
        return writer


def close_writers() -> None:
    """Finish and close every shared writer of the process (at shutdown)."""
    with _writers_lock:
        writers = list(_writers.values())
        _writers.clear()
    for writer in writers:
        writer.close()


class Recorder:
    """Where one model's records go.

    Attributes:
        model: The model's name.
        settings: Its records settings.
    """

    def __init__(self, model: str, settings: RecordsSettings) -> None:
        """A recorder for ``model`` (its store is opened by :meth:`record` when :meth:`open` could not)."""
        self.model = model
        self.settings = settings
        self._writer: RecordWriter | None = None

    @classmethod
    def open(
        cls, model: str, section: Any = None, environ: Mapping[str, str] | None = None, where: str = "records"
    ) -> Recorder | None:
        """The model's recorder, or None when it keeps no records.

        Args:
            model: The model's name.
            section: The model's ``records:`` section (None: the environment decides).
            environ: The environment (default ``os.environ``).
            where: How messages name the section.

        Returns:
            The :class:`Recorder` (its store opened when it can be), or None.

        Raises:
            SettingsError: the settings are not usable (see :func:`records.settings.records_settings`).
        """
        settings = records_settings(section, environ, where)
        if settings is None:
            return None
        recorder = cls(model, settings)
        with suppress(StoreUnavailableError):  # else the first batch tries again, and applies on_store_error
            recorder._writer = shared_writer(settings)
        return recorder

    def record(self, records: Sequence[Record]) -> None:
        """Commit a batch's records before its answers leave.

        Args:
            records: One record per answered row of the batch.

        Raises:
            RowError: ``records_unavailable``, when the store failed and ``on_store_error`` is ``refuse``.
        """
        if not records:
            return
        policy = self.settings.on_store_error
        if self._writer is None:
            try:
                self._writer = shared_writer(self.settings)
            except StoreUnavailableError as error:
                handle_store_error(error, policy=policy, model=self.model)
                return
        self._writer.record(records, model=self.model, on_store_error=policy)


__all__ = ["Recorder", "close_writers", "shared_writer"]
