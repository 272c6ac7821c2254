"""``python -m explain_client`` = the ``explain`` command."""

from .cli import entry_point

entry_point()
