"""TorchServe entry point of generation models (causal LMs), packaged into each generation archive by
``torch-model-archiver``.

TorchServe instantiates the one class defined in this file; the logic lives in the ``handlers`` package.
"""

from doors.torchserve.handler import ExplanationHandler


class GenerationExplanationHandler(ExplanationHandler):
    """A causal LM's continuation with, per row as asked, an attribution of each generated token."""

    task = "generation"
