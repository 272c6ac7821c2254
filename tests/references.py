"""Where the reference tests find the authors' code: checkouts named by environment variables, and Captum.

Nothing of the authors' code is copied into the project: a test loads it from the checkout the variable names, and
skips with one line when the variable is unset (CI machines have no checkouts). To run them::

    git clone https://github.com/hila-chefer/Transformer-Explainability /path/Transformer-Explainability
    git clone https://github.com/samiraabnar/attention_flow /path/attention_flow
    pip install captum==0.9.0 einops   # the `bench` extra has Captum
    CHEFER_REFERENCE=/path/Transformer-Explainability ATTENTION_FLOW_REFERENCE=/path/attention_flow \\
        python -m pytest tests/test_reference_chefer.py tests/test_reference_flow.py tests/test_reference_captum.py

The authors' code predates transformers 5 and runs on CUDA; the fixtures below adapt the *instances* they build (never
the authors' files) and undo every change when the test ends: see each fixture.
"""

from __future__ import annotations

import ast
import os
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

CHEFER = "CHEFER_REFERENCE"
FLOW = "ATTENTION_FLOW_REFERENCE"


CHEFER_MARKER = "BERT_explainability/modules/BERT/ExplanationGenerator.py"
FLOW_MARKER = "attention_graph_util.py"


def checkout(variable: str, marker: str) -> Path:
    """The checkout named by ``variable``; called at a test module's top, it skips the whole module with one line when
    the variable is unset or names no checkout of the reference."""
    value = os.environ.get(variable)
    if not value:
        pytest.skip(
            f"{variable} is not set: the authors' code is not available here (tests/references.py)",
            allow_module_level=True,
        )
    path = Path(value)
    if not (path / marker).is_file():
        pytest.skip(f"{variable}={value} has no {marker}: not a checkout of the reference", allow_module_level=True)
    return path


@pytest.fixture
def chefer(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Chefer et al.'s repository on ``sys.path``, importable on a CPU machine with transformers 5.

    For this test only (monkeypatch undoes it): ``Tensor.cuda`` returns the tensor itself (their generators move the
    one-hot to CUDA), ``gensim`` is an empty module (imported by a data utility their BERT file imports, unused here),
    and their modules are dropped from ``sys.modules`` afterwards.
    """
    path = checkout(CHEFER, CHEFER_MARKER)
    monkeypatch.syspath_prepend(str(path))
    monkeypatch.setattr(torch.Tensor, "cuda", lambda self, *args, **kwargs: self)
    gensim = types.ModuleType("gensim")
    models = types.ModuleType("gensim.models")
    models.KeyedVectors = object  # type: ignore[attr-defined]
    gensim.models = models  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "gensim", gensim)
    monkeypatch.setitem(sys.modules, "gensim.models", models)
    before = set(sys.modules)
    try:
        yield path
    finally:
        for name in set(sys.modules) - before:
            if name.split(".")[0] in ("BERT_explainability", "BERT_rationale_benchmark", "baselines", "modules"):
                del sys.modules[name]


def flow_functions() -> dict[str, Any]:
    """``get_adjmat`` and ``compute_node_flow`` of the authors' ``attention_graph_util.py``, read from the checkout.

    The file imports TensorFlow (unused by these functions); only the two function definitions are compiled, from
    the file's own text, with ``networkx`` and ``numpy`` as their globals.
    """
    path = checkout(FLOW, FLOW_MARKER) / FLOW_MARKER
    import networkx
    import numpy

    tree = ast.parse(path.read_text(encoding="utf-8"))
    wanted: list[ast.stmt] = [
        node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name in FLOW_FUNCTIONS
    ]
    namespace: dict[str, Any] = {"nx": networkx, "np": numpy}
    exec(compile(ast.Module(body=wanted, type_ignores=[]), str(path), "exec"), namespace)
    return {name: namespace[name] for name in FLOW_FUNCTIONS}


FLOW_FUNCTIONS = ("get_adjmat", "compute_node_flow")
