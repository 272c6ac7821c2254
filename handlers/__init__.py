"""Deprecated alias, kept for one release: TorchServe's door is :mod:`doors.torchserve` now.

Archives built before the move name ``handlers.base`` from their entry file; :mod:`handlers.base` still imports.
"""
