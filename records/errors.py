"""The errors of the records package: one base class, and one subclass for each thing that can go wrong.

A bad store URL, bad ``records:`` settings and a bad record id are caller errors (also :class:`ValueError`); a store
that cannot be reached or fails a write is :class:`StoreUnavailableError` (the doors map it by ``on_store_error``, see
:mod:`records.writer`); reading from the write-only HTTP sink is :class:`WriteOnlyStoreError`.
"""

from __future__ import annotations


class RecordsError(Exception):
    """Base class of every error of :mod:`records`."""


class StoreUrlError(RecordsError, ValueError):
    """A records store URL that names no store this package has."""


class SettingsError(RecordsError, ValueError):
    """A ``records:`` section or ``EXPLAIN_RECORDS*`` variable with a value this package cannot use."""


class InvalidRecordIdError(RecordsError, ValueError):
    """A request or record id that is empty, too long, or not made of the allowed characters (path-like ids)."""


class StoreUnavailableError(RecordsError):
    """A store that cannot be reached, or failed to commit or read records.

    Attributes:
        store: The store's kind (``sqlite``, ``postgresql``, ``http``): a bounded label for metrics.
    """

    def __init__(self, store: str, message: str) -> None:
        """Create the error for the store of kind ``store``."""
        super().__init__(message)
        self.store = store


class WriteOnlyStoreError(RecordsError):
    """A read (get, list, erase, retention, verify) asked of a store that only delivers records (the HTTP sink)."""
