"""Run by tests/test_wheel.py with the Python of a fresh virtualenv that holds torch and the built wheel of the
library's core (never imported by the test process): it reports where ``explainers`` was imported from, which of the
service's libraries are absent, the installed version and data files, and the explanation of a checkpoint folder by
every method, as one JSON document.

Usage: ``python wheel_probe.py CHECKPOINT_FOLDER "TEXT"``. Only the standard library, torch, transformers and the
installed ``explainers`` are imported here.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

#: Libraries of the service, the evaluation and the tests, which the core install must not bring.
SERVICE_LIBRARIES = ("ts", "model_archiver", "grpc", "grpc_tools", "google.protobuf", "matplotlib", "sklearn",
                     "prometheus_client", "psutil", "explain_client", "pytest")  # fmt: skip
DISTRIBUTION = "transformer-explain-service"


def _absent(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is None
    except ModuleNotFoundError:  # a dotted name whose parent is missing
        return True


def environment() -> dict[str, Any]:
    """Where the library lives and what came with it."""
    import explainers
    from explainers._version import __version__

    package = Path(explainers.__file__).resolve().parent
    site = package.parent
    return {
        "explainers_file": str(package / "__init__.py"),
        "version": __version__,
        "metadata_version": importlib.metadata.version(DISTRIBUTION),
        "requires": importlib.metadata.requires(DISTRIBUTION) or [],
        "present_service_libraries": [name for name in SERVICE_LIBRARIES if not _absent(name)],
        "py_typed": (package / "py.typed").is_file(),
        "data_files": sorted(
            str(path.relative_to(site))
            for root in ("model_store", "doors")
            for path in (site / root).rglob("*")
            if path.is_file() and path.suffix not in {".py", ".pyc"}
        ),
        "distributions": sorted(dist.metadata["Name"].lower() for dist in importlib.metadata.distributions()),
    }


def explanations(folder: str, text: str) -> dict[str, Any]:
    """Every method's explanation of ``text`` by the checkpoint in ``folder``."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from explainers import UnsupportedMethodError, available_methods, explain, get_method

    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    inputs = dict(tokenizer([text], return_tensors="pt"))
    results: dict[str, Any] = {}
    refused: dict[str, Any] = {}  # methods that need a package the core does not install, and their message
    for method in available_methods():
        missing = [module for module in get_method(method).packages if _absent(module)]
        if missing:
            try:
                explain(model, inputs, method=method)
            except UnsupportedMethodError as error:
                refused[method] = {"missing": missing, "message": str(error)}
            continue
        attribution = explain(model, inputs, method=method)
        results[method] = {"scores": attribution.scores[0].tolist(), "target": int(attribution.target[0])}
    tokens = tokenizer.convert_ids_to_tokens(inputs["input_ids"][0].tolist())
    return {"tokens": tokens, "methods": results, "refused": refused}


def main(argv: list[str]) -> int:
    folder, text = argv[1], argv[2]
    print(json.dumps({**environment(), **explanations(folder, text)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
