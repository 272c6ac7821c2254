"""No accepted request takes a worker down: through a real TorchServe serving the tiny text and image archives with a
low time budget, the most expensive request each method accepts (every option at its maximum, the longest text, a
full batch of them) is sent next to a stream of predictions. Every answer is a result or a clean refusal
(``over_time_budget``, ``over_memory_budget``, ``deadline_exceeded``), TorchServe's workers keep their pids (none was
restarted, read through its management API), and every prediction is answered.

Token classification and generation models have no time budget yet: they are not covered here."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoModelForImageClassification, AutoModelForSequenceClassification

from explainers import describe, get_method, supported_methods
from explainers.methods import OptionValue
from model_store.serving.config import Ports
from model_store.serving.process import Server, start, stop
from tests.serving_support import b64, http_call, http_post, png_bytes

pytestmark = pytest.mark.slow

#: Rows per TorchServe batch, and the budgets the archives are served with here.
BATCH = 4
TIME_BUDGET_S = 1.5
RESPONSE_TIMEOUT_S = 20
REFUSALS = {"over_time_budget", "over_memory_budget", "deadline_exceeded"}
#: A text longer than the tiny archives' max_length (it is truncated to it).
LONG_TEXT = " ".join(["the flight was late and the crew was rude but the food was good"] * 40)


@pytest.fixture(scope="module")
def budgeted(archives: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    run_dir = tmp_path_factory.mktemp("budget-run")
    store = next(iter(archives.values())).parent.parent
    served = ("sentiment", "digits")
    models = {name: str(archives[name].relative_to(store)) for name in served}
    settings = {
        "batchSize": BATCH, "maxBatchDelay": 20, "responseTimeout": RESPONSE_TIMEOUT_S,
        "handler": {"time_budget_s": TIME_BUDGET_S, "threads": 1},
    }  # fmt: skip
    started = start(run_dir, store, models, Ports.free(), timeout=180, overrides={name: settings for name in served})
    try:
        yield started
    finally:
        stop(run_dir)


def _workers(server: Server, model: str) -> list[tuple[Any, Any]]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{server.ports.management}/models/{model}",
        headers={"Authorization": f"Bearer {server.keys['management']}"},
    )
    status, body = http_call(request, 30)
    assert status == 200, body
    return sorted((worker.get("pid"), worker.get("status")) for worker in body[0]["workers"])


def _most_expensive(archive: Path, field: str) -> dict[str, dict[str, OptionValue]]:
    """Every supported method with each of its options at its maximum for this model."""
    loader = AutoModelForSequenceClassification if field == "text" else AutoModelForImageClassification
    model = loader.from_pretrained(str(archive / "model"))
    arch = describe(model)
    return {
        name: {option.name: option.maximum(arch) for option in get_method(name).options}
        for name in supported_methods(arch.model_type)
    }


def _post(server: Server, model: str, document: dict[str, Any]) -> tuple[int, Any, float]:
    started = time.monotonic()
    status, reply = http_post(
        f"{server.inference_url}/predictions/{model}", json.dumps(document).encode(), server.keys["inference"],
        timeout=RESPONSE_TIMEOUT_S * 3,
    )  # fmt: skip
    return status, reply, time.monotonic() - started


def _clean(status: int, reply: Any) -> bool:
    if status == 200:
        return isinstance(reply, dict) and "explanation" in reply
    error = reply.get("error", {}) if isinstance(reply, dict) else {}
    return error.get("code") in REFUSALS and error.get("http_status") == status and bool(error.get("message"))


@pytest.mark.parametrize(("model", "field"), [("sentiment", "text"), ("digits", "image")])
def test_the_most_expensive_requests_are_answered_or_refused_and_no_worker_dies(
    budgeted: Server, archives: dict[str, Path], model: str, field: str
) -> None:
    payload = LONG_TEXT if field == "text" else b64(png_bytes((64, 64)))
    expensive = _most_expensive(archives[model], field)
    workers = _workers(budgeted, model)
    assert workers and all(status == "READY" for _, status in workers)
    predictions: list[tuple[int, float]] = []
    stop_predicting = threading.Event()

    def predict() -> None:
        while not stop_predicting.is_set():
            status, _, seconds = _post(budgeted, model, {field: payload})
            predictions.append((status, seconds))

    stream = threading.Thread(target=predict)
    stream.start()
    answers: list[tuple[str, int, Any]] = []
    try:
        with ThreadPoolExecutor(BATCH) as pool:
            for method, options in expensive.items():
                document = {field: payload, "explain": {"method": method, **options}}
                for status, reply, _ in pool.map(lambda row: _post(budgeted, model, row), [document] * BATCH):
                    answers.append((method, status, reply))
            # A deadline already passed is refused without work; one that passes while the row runs abandons it.
            past = {field: payload, "explain": {"method": "attnlrp", "deadline_ms": int(time.time() * 1000) - 1000}}
            status, reply, _ = _post(budgeted, model, past)
            assert status == 504 and reply["error"]["code"] == "deadline_exceeded", reply
            soon = {"method": "integrated_gradients", "n_steps": 64, "internal_batch_size": 1}
            due = int(time.time() * 1000) + 50
            status, reply, _ = _post(budgeted, model, {field: payload, "explain": {**soon, "deadline_ms": due}})
            answers.append(("integrated_gradients (deadline)", status, reply))
    finally:
        stop_predicting.set()
        stream.join()
    unclean = [(method, status, reply) for method, status, reply in answers if not _clean(status, reply)]
    assert not unclean, unclean
    refused = [reply["error"]["code"] for _, status, reply in answers if status != 200]
    assert "over_time_budget" in refused  # the budget was reached, so the test exercised it
    assert predictions and all(status == 200 for status, _ in predictions), predictions
    assert max(seconds for _, seconds in predictions) < RESPONSE_TIMEOUT_S
    assert _workers(budgeted, model) == workers  # the same worker processes: none was restarted
