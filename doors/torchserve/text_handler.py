"""TorchServe entry point of text classifiers (packaged into each text archive by ``torch-model-archiver``).

TorchServe instantiates the one class defined in this file; the logic lives in the ``handlers`` package.
"""

from doors.torchserve.handler import ExplanationHandler


class TextExplanationHandler(ExplanationHandler):
    """Prediction + per-row attribution for a Hugging Face sequence classifier."""

    task = "text"
