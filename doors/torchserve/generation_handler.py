"""TorchServe entry point of generation models (causal LMs), packaged into each generation archive by
``torch-model-archiver``.

TorchServe instantiates the one class defined in this file; the logic lives in :mod:`doors.torchserve.handler`.
The entry file of its task's record (:attr:`serving_core.registry.TaskFacts.entry_file`); a task without one of
its own is packaged with the generic ``entry.py``.
"""

from doors.torchserve.handler import ExplanationHandler


class GenerationExplanationHandler(ExplanationHandler):
    """A causal LM's continuation with, per row as asked, an attribution of each generated token."""

    task = "generation"
