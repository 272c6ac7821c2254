"""TorchServe entry point of image classifiers (packaged into each image archive by ``torch-model-archiver``).

TorchServe instantiates the one class defined in this file; the logic lives in :mod:`doors.torchserve.handler`.
The entry file of its task's record (:attr:`serving_core.registry.TaskFacts.entry_file`); a task without one of
its own is packaged with the generic ``entry.py``.
"""

from doors.torchserve.handler import ExplanationHandler


class ImageExplanationHandler(ExplanationHandler):
    """Prediction + per-row patch attribution for a Hugging Face ViT image classifier."""

    task = "image"
