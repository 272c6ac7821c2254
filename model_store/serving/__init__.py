"""Deprecated alias, kept for one release: ``python -m model_store.serving serve|start|stop|package`` runs the one
launcher, :mod:`doors.launch` (``python -m doors ...``)."""
