"""TorchServe entry point of token classifiers (NER, PII detection; packaged into each token-classification archive
by ``torch-model-archiver``).

TorchServe instantiates the one class defined in this file; the logic lives in the ``handlers`` package.
"""

from doors.torchserve.handler import ExplanationHandler


class TokenClassificationHandler(ExplanationHandler):
    """Entities with character offsets + per-row attribution of each entity, for a Hugging Face token classifier."""

    task = "token_classification"
