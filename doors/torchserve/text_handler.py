"""TorchServe entry point of text classifiers (packaged into each text archive by ``torch-model-archiver``).

TorchServe instantiates the one class defined in this file; the logic lives in :mod:`doors.torchserve.handler`.
The entry file of its task's record (:attr:`serving_core.registry.TaskFacts.entry_file`); a task without one of
its own is packaged with the generic ``entry.py``.
"""

from doors.torchserve.handler import ExplanationHandler


class TextExplanationHandler(ExplanationHandler):
    """Prediction + per-row attribution for a Hugging Face sequence classifier."""

    task = "text"
