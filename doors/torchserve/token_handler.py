"""TorchServe entry point of token classifiers (NER, PII detection; packaged into each token-classification archive
by ``torch-model-archiver``).

TorchServe instantiates the one class defined in this file; the logic lives in :mod:`doors.torchserve.handler`.
The entry file of its task's record (:attr:`serving_core.registry.TaskFacts.entry_file`); a task without one of
its own is packaged with the generic ``entry.py``.
"""

from doors.torchserve.handler import ExplanationHandler


class TokenClassificationHandler(ExplanationHandler):
    """Entities with character offsets + per-row attribution of each entity, for a Hugging Face token classifier."""

    task = "token_classification"
