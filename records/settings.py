"""The records settings of a deployment or a model: where records go, how much input they keep, how long, and what
the service does when the store fails.

A model's ``records:`` section (the models file, an archive's settings) is either off (``false``, ``off``), a store
URL (``records: sqlite``), or a mapping::

    records:
      store: postgresql://explain@db/records   # required (or from EXPLAIN_RECORDS)
      payload: hash                             # full | hash | none
      retention_days: 183                       # optional: delete records older than this
      on_store_error: refuse                    # answer | refuse

A model without the section takes the deployment's settings from the environment: ``EXPLAIN_RECORDS`` (the store
URL; unset, empty or ``off``: no records), ``EXPLAIN_RECORDS_PAYLOAD`` (default ``hash``),
``EXPLAIN_RECORDS_RETENTION_DAYS`` and ``EXPLAIN_RECORDS_ON_STORE_ERROR`` (default ``refuse``); a section's missing
keys take the same values. ``retention_days`` is for the SQL stores (the writer applies it, :mod:`records.writer`);
with the HTTP sink it is refused (the receiver keeps the records). ``refuse`` (the default) keeps the promise that
every answer a caller gets has its record: rows whose batch could not be recorded are answered
``records_unavailable`` (503). ``answer`` answers them anyway, logging an error and counting
``explain_record_errors_total``.
"""

from __future__ import annotations

import enum
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import RecordsError, SettingsError
from .event import Payload
from .stores import parse_store_url

#: The store URL of the deployment.
ENV_STORE = "EXPLAIN_RECORDS"
#: The payload mode of the deployment.
ENV_PAYLOAD = "EXPLAIN_RECORDS_PAYLOAD"
#: The retention of the deployment, in days.
ENV_RETENTION_DAYS = "EXPLAIN_RECORDS_RETENTION_DAYS"
#: The store-error policy of the deployment.
ENV_ON_STORE_ERROR = "EXPLAIN_RECORDS_ON_STORE_ERROR"
#: The keys a ``records:`` mapping may have.
KEYS = ("store", "payload", "retention_days", "on_store_error")
_OFF = {"off", "false", "no", "none", "0"}


class OnStoreError(enum.Enum):
    """What the service does with a batch whose records could not be committed."""

    ANSWER = "answer"
    REFUSE = "refuse"

    @classmethod
    def parse(cls, value: object, where: str = "on_store_error") -> OnStoreError:
        """The policy named by ``value``.

        Raises:
            SettingsError: ``value`` is not ``answer`` or ``refuse``.
        """
        if isinstance(value, OnStoreError):
            return value
        if isinstance(value, str):
            for policy in cls:
                if value.strip().lower() == policy.value:
                    return policy
        raise SettingsError(f"{where}: {value!r} is not one of answer, refuse")


@dataclass(frozen=True)
class RecordsSettings:
    """Where a model's records go and how.

    Attributes:
        store: The store's URL (checked by :func:`records.stores.parse_store_url`).
        payload: How much of each input a record keeps.
        retention_days: Records older than this many days are deleted (None: kept until erased).
        on_store_error: What to do with a batch whose records could not be committed.
    """

    store: str
    payload: Payload = Payload.HASH
    retention_days: float | None = None
    on_store_error: OnStoreError = OnStoreError.REFUSE


def _retention(value: object, where: str) -> float | None:
    if value is None or value == "":
        return None
    try:
        days = float(value) if isinstance(value, str) else value
    except ValueError:
        days = None
    if isinstance(days, bool) or not isinstance(days, int | float) or not 0 < days < math.inf:
        raise SettingsError(f"{where}: retention_days must be a positive number of days, not {value!r}")
    return float(days)


def _store(value: object, where: str) -> str:
    try:
        return parse_store_url(value if isinstance(value, str) else "").url
    except RecordsError as error:
        raise SettingsError(f"{where}: {error}") from None


def records_settings(section: Any = None, environ: Mapping[str, str] | None = None,
                     where: str = "records") -> RecordsSettings | None:  # fmt: skip
    """The records settings of a model, or None when it keeps no records.

    Args:
        section: The model's ``records:`` section (None when it has none: the environment decides).
        environ: The environment (default ``os.environ``).
        where: How messages name the section (e.g. ``models.yaml: sentiment: records``).

    Returns:
        The :class:`RecordsSettings`, or None for no records.

    Raises:
        SettingsError: a value is not one this package can use (the message names it and the allowed ones).
    """
    env = os.environ if environ is None else environ
    env_store = env.get(ENV_STORE, "").strip()
    if env_store.lower() in _OFF:
        env_store = ""
    defaults: dict[str, Any] = {
        "store": env_store or None,
        "payload": env.get(ENV_PAYLOAD, "").strip() or Payload.HASH.value,
        "retention_days": env.get(ENV_RETENTION_DAYS, "").strip() or None,
        "on_store_error": env.get(ENV_ON_STORE_ERROR, "").strip() or OnStoreError.REFUSE.value,
    }
    sources = {
        "store": ENV_STORE,
        "payload": ENV_PAYLOAD,
        "retention_days": ENV_RETENTION_DAYS,
        "on_store_error": ENV_ON_STORE_ERROR,
    }
    if section is None:
        if defaults["store"] is None:
            return None
        values = defaults
        names = sources
    elif section is False or (isinstance(section, str) and section.strip().lower() in _OFF):
        return None
    elif isinstance(section, str):
        values, names = {**defaults, "store": section}, {**sources, "store": where}
    elif isinstance(section, Mapping):
        unknown = sorted(str(key) for key in section if key not in KEYS)
        if unknown:
            raise SettingsError(f"{where}: unknown key(s) {', '.join(unknown)}; the keys are {', '.join(KEYS)}")
        values = {**defaults, **section}
        names = {**sources, **{key: f"{where}.{key}" for key in section}}
    else:
        raise SettingsError(f"{where}: expected a store URL, a mapping of {', '.join(KEYS)}, or off")
    if values["store"] is None:
        raise SettingsError(f"{where}: no store: set {where}.store or {ENV_STORE}")
    try:
        payload = Payload.parse(values["payload"])
    except SettingsError as error:
        raise SettingsError(f"{names['payload']}: {error}") from None
    store = _store(values["store"], names["store"])
    retention_days = _retention(values["retention_days"], names["retention_days"])
    if retention_days is not None and parse_store_url(store).kind == "http":
        raise SettingsError(
            f"{names['retention_days']}: the HTTP sink {store} keeps nothing, so it has no retention: "
            "the receiver keeps the records for as long as it is told to"
        )
    return RecordsSettings(
        store=store,
        payload=payload,
        retention_days=retention_days,
        on_store_error=OnStoreError.parse(values["on_store_error"], names["on_store_error"]),
    )


__all__ = [
    "ENV_ON_STORE_ERROR",
    "ENV_PAYLOAD",
    "ENV_RETENTION_DAYS",
    "ENV_STORE",
    "KEYS",
    "OnStoreError",
    "RecordsSettings",
    "records_settings",
]
