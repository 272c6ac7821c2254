"""Run by tests/test_client_package.py with the Python of a virtualenv that holds only the client distribution
(never imported by the test process): it refuses any import of the server's packages and of the libraries the
client must not need, then does what its first argument names and prints one JSON document.

- ``modules``: import every module of ``explain_client`` (``pictures`` must fail with the extra's install hint);
- ``call CONFIG``: call the service over REST and gRPC (prediction, each method, an image, per-row errors);
- ``retry CONFIG``: one prediction with retries on, while the test kills the worker that holds it.

Only the standard library and ``explain_client`` are imported here.
"""

from __future__ import annotations

import importlib
import importlib.abc
import json
import logging
import pkgutil
import sys
import time
from typing import Any

FORBIDDEN = frozenset(
    {"torch", "transformers", "ts", "doors", "handlers", "servers", "serving_core", "explainers", "model_store"}
)
TEXT = "the crew was rude and the flight late"


class RefuseServerImports(importlib.abc.MetaPathFinder):
    """Fails any import whose top-level name is in :data:`FORBIDDEN`."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> None:
        if fullname.split(".")[0] in FORBIDDEN:
            raise ImportError(f"the client imported {fullname}, which a client-only install must not need")
        return None


def forbidden_loaded() -> list[str]:
    return sorted(name for name in sys.modules if name.split(".")[0] in FORBIDDEN)


def import_everything() -> dict[str, Any]:
    import explain_client

    imported, refused = [], {}
    for module in pkgutil.walk_packages(explain_client.__path__, "explain_client."):
        if module.name == "explain_client.__main__":
            continue  # `python -m explain_client`, which runs the CLI
        try:
            importlib.import_module(module.name)
            imported.append(module.name)
        except ImportError as error:
            refused[module.name] = str(error)
    return {"imported": imported, "refused": refused, "forbidden_loaded": forbidden_loaded()}


def call_service(config: dict[str, Any]) -> dict[str, Any]:
    from explain_client import ExplainClient, Prediction, Request, ServiceError

    with open(config["png"], "rb") as handle:
        image = handle.read()
    results: dict[str, Any] = {}
    for transport in ("rest", "grpc"):
        with ExplainClient(
            transport, url=config["url"], grpc_address=config["grpc"], token_file=config["key_file"], timeout=120
        ) as client:
            row: dict[str, Any] = {"predict": client.predict("sentiment", TEXT).to_dict(), "methods": {}}
            for method in config["methods"]:
                options = {"n_steps": 8} if method == "integrated_gradients" else {}
                request = Request(text=TEXT, method=method, options=options)
                row["methods"][method] = client.call("sentiment", request).to_dict()
            row["image"] = client.explain("digits", image=image, method="rollout").to_dict()
            try:
                client.explain("sentiment", TEXT, method="no_such_method")
                row["row_error"] = None
            except ServiceError as error:
                row["row_error"] = error.to_dict()
            many = client.explain_many(
                "sentiment", [TEXT, Request(text=TEXT, method="no_such_method"), "a lovely crew"], method="attention"
            )
            row["many"] = [
                result.to_dict() if isinstance(result, Prediction) else {"error": result.to_dict()} for result in many
            ]
            results[transport] = row
    results["forbidden_loaded"] = forbidden_loaded()
    return results


def call_with_retries(config: dict[str, Any]) -> dict[str, Any]:
    from explain_client import ExplainClient

    with ExplainClient(
        config["transport"],
        url=config["url"],
        grpc_address=config["grpc"],
        token_file=config["key_file"],
        timeout=config["timeout"],
        retries=config["retries"],
    ) as client:
        print("calling", flush=True)
        started = time.monotonic()
        prediction = client.predict("sentiment", TEXT)
    return {"label": prediction.label, "seconds": time.monotonic() - started, "forbidden_loaded": forbidden_loaded()}


def main() -> None:
    sys.meta_path.insert(0, RefuseServerImports())
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")
    command = sys.argv[1]
    config = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    actions = {"modules": lambda: import_everything(), "call": lambda: call_service(config)}
    actions["retry"] = lambda: call_with_retries(config)
    print(json.dumps(actions[command]()), flush=True)


if __name__ == "__main__":
    main()
