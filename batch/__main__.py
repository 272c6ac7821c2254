"""``python -m batch``: the ``explain-batch`` command (:mod:`batch.cli`)."""

from .cli import entry_point

entry_point()
