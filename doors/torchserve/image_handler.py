"""TorchServe entry point of image classifiers (packaged into each image archive by ``torch-model-archiver``).

TorchServe instantiates the one class defined in this file; the logic lives in the ``handlers`` package.
"""

from doors.torchserve.handler import ExplanationHandler


class ImageExplanationHandler(ExplanationHandler):
    """Prediction + per-row patch attribution for a Hugging Face ViT image classifier."""

    task = "image"
