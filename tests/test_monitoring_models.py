"""The monitor on tiny models served in this process by the serving core (monitoring/inprocess.py): canaries hold at
1.0 on the same checkpoint (the same object, a new one, a new process) and catch a small perturbation of one layer's
weights; ``explain-monitor baseline`` and ``canaries record`` write files the monitor loads; the words a row answered
in tokens is monitored over are the words the service answers in ``word`` granularity; token classifiers are
monitored per entity type."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from monitoring.baseline import read_baseline
from monitoring.canaries import compare, read_canaries
from monitoring.cli import main
from monitoring.config import MonitorConfig
from monitoring.inprocess import InProcessModel
from monitoring.monitor import load_monitor
from monitoring.serving import start_monitor
from tests import checkpoints

TEXTS = [
    "the service was quick and the staff were lovely",
    "a slow rude waiter, never again!",
    "food cold not warm good",
    "Lovely staff; the food was good.",
    "quick service, rude staff",
    "the waiter was slow but the food was warm",
]
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return checkpoints.generic_labels(tmp_path_factory.mktemp("monitor") / "reviews")


@pytest.fixture(scope="module")
def model(folder: Path) -> InProcessModel:
    return InProcessModel("reviews", folder)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("inputs") / "reviews.jsonl"
    path.write_text("".join(json.dumps({"text": text}) + "\n" for text in TEXTS))
    return path


def _perturbed(folder: Path, target: Path) -> Path:
    """A copy of the checkpoint with one layer's query weights moved by 1% of their spread."""
    shutil.copytree(folder, target)
    weights = load_file(target / "model.safetensors")
    name = next(key for key in weights if "layer.1.attention.self.query.weight" in key)
    generator = torch.Generator().manual_seed(0)
    weights[name] = weights[name] + 0.01 * weights[name].std() * torch.randn(weights[name].shape, generator=generator)
    save_file(weights, target / "model.safetensors", metadata={"format": "pt"})
    return target


def test_canaries_hold_on_the_same_checkpoint_and_catch_a_perturbed_one(
    model: InProcessModel, folder: Path, inputs: Path, tmp_path: Path
) -> None:
    canary_file = tmp_path / "canaries.json"
    assert main(["canaries", "record", str(inputs), "-o", str(canary_file), "--model", f"reviews={folder}",
                 "--method", "attnlrp", "--method", "grad_x_input"]) == 0  # fmt: skip
    canaries = read_canaries(canary_file)
    assert len(canaries) == 2 * len(TEXTS)
    probes = [canary.probe for canary in canaries]

    for explained_by in (model, InProcessModel("reviews", folder)):  # the same object, and a new one
        readings = compare(canaries, explained_by.explainer()(probes))
        assert set(readings) == {"attnlrp", "grad_x_input"}
        for reading in readings.values():
            assert reading.agreement == 1.0 and reading.prediction_agreement == 1.0

    perturbed = InProcessModel("reviews", _perturbed(folder, tmp_path / "perturbed"))
    readings = compare(canaries, perturbed.explainer()(probes))
    assert all(reading.agreement < 0.999 for reading in readings.values()), readings


def test_canaries_hold_across_a_restart(folder: Path, inputs: Path, tmp_path: Path) -> None:
    """A new process loading the same checkpoint agrees 1.0 with the canaries another process recorded."""
    canary_file = tmp_path / "canaries.json"
    assert main(["canaries", "record", str(inputs), "-o", str(canary_file), "--model", f"reviews={folder}"]) == 0
    script = (
        "import sys, json\n"
        "from pathlib import Path\n"
        "from monitoring.canaries import compare, read_canaries\n"
        "from monitoring.inprocess import InProcessModel\n"
        "canaries = read_canaries(Path(sys.argv[2]))\n"
        "model = InProcessModel('reviews', Path(sys.argv[1]))\n"
        "readings = compare(canaries, model.explainer()([c.probe for c in canaries]))\n"
        "print(json.dumps({m: [r.agreement, r.prediction_agreement] for m, r in readings.items()}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(folder), str(canary_file)],
        capture_output=True, text=True, timeout=300, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"attnlrp": [1.0, 1.0]}


def test_the_baseline_command_writes_what_the_monitor_loads(
    model: InProcessModel, folder: Path, inputs: Path, tmp_path: Path
) -> None:
    baseline_file = tmp_path / "baseline.json"
    assert main(["baseline", str(inputs), "-o", str(baseline_file), "--model", f"reviews={folder}"]) == 0
    baseline = read_baseline(baseline_file)
    assert baseline.model == "reviews"
    assert sum(entry.rows for entry in baseline.entries.values()) == len(TEXTS)
    words = {key for entry in baseline.entries.values() for key in entry.shares}
    assert {"waiter", "lovely", "food", "!", ","} <= words
    assert not any(str(word).startswith(("[", "##")) for word in words)  # special tokens and pieces apart
    assert all(label in ("LABEL_0", "LABEL_1") for _, label in baseline.entries)
    for entry in baseline.entries.values():
        assert sum(entry.shares.values()) == pytest.approx(1.0)

    monitor = load_monitor("reviews", MonitorConfig(window=5, baseline=baseline_file), model.reader, start=False)
    assert monitor is not None
    for row, outcome in model.run([{"text": text} for text in TEXTS * 2], "attnlrp"):
        monitor.process(row, outcome)
    assert monitor.readings
    for reading in monitor.readings.values():
        assert reading.baseline_rows >= 1 and 0.0 <= reading.ndcg <= 1.0


def test_refused_inputs_exit_2(folder: Path, tmp_path: Path) -> None:
    (tmp_path / "bad.jsonl").write_text("[1, 2]\n")
    assert main(["baseline", str(tmp_path / "bad.jsonl"), "-o", str(tmp_path / "b.json"),
                 "--model", f"reviews={folder}"]) == 2  # fmt: skip
    assert main(["baseline", str(tmp_path / "bad.jsonl"), "-o", str(tmp_path / "b.json"), "--model", "reviews"]) == 2
    (tmp_path / "good.txt").write_text("a good text\n")
    assert main(["canaries", "record", str(tmp_path / "good.txt"), "-o", str(tmp_path / "c.json"),
                 "--model", f"reviews={folder}", "--method", "saliency"]) == 2  # fmt: skip


def test_rows_answered_in_tokens_are_monitored_over_the_services_words(model: InProcessModel) -> None:
    documents = [{"text": text} for text in TEXTS]
    in_tokens = model.run(documents, "attnlrp")
    in_words = []
    for document in documents:
        body = {**document, "explain": {"method": "attnlrp", "granularity": "word"}}
        row = model.task.decode_row({"body": body}, False, model.config)
        outcomes, _ = model.service.run([row], [row.encoding])
        in_words.append((row, outcomes[0]))
    for (row_t, outcome_t), (row_w, outcome_w) in zip(in_tokens, in_words, strict=True):
        from_tokens = model.reader(row_t, outcome_t).explained[0]
        from_words = model.reader(row_w, outcome_w).explained[0]
        assert from_tokens.drift and from_words.drift
        assert from_tokens.label == from_words.label
        assert from_tokens.shares.shares.keys() == from_words.shares.shares.keys()
        for key, share in from_words.shares.shares.items():
            assert from_tokens.shares.shares[key] == pytest.approx(share, abs=1e-5)
        assert from_tokens.shares.special_share == pytest.approx(from_words.shares.special_share, abs=1e-5)


def test_token_classifiers_are_monitored_per_entity_type(tmp_path: Path) -> None:
    model = InProcessModel("entities", checkpoints.token_classifier(tmp_path / "entities"))
    served = model.run([{"text": "Alice met Bob in Paris and London"}, {"text": "Carol flew to Rome"}], "attnlrp")
    readings = [model.reader(row, outcome) for row, outcome in served]
    observations = [observation for reading in readings for observation in reading.explained]
    assert observations
    types = {tag.split("-", 1)[1] for tag in model.config.labels if "-" in tag}
    for observation in observations:
        assert observation.label in types and observation.drift
        assert all(isinstance(key, str) for key in observation.shares.shares)


def test_start_monitor_on_a_loaded_service(model: InProcessModel, folder: Path, inputs: Path, tmp_path: Path) -> None:
    """The door's seam: the monitor of a loaded service runs its canaries (holding the door's lock) and monitors
    the rows handed to it; ``monitor: false`` is no monitor; a bad file is refused with one message."""
    import threading
    import time

    from prometheus_client import REGISTRY

    canary_file = tmp_path / "canaries.json"
    assert main(["canaries", "record", str(inputs), "-o", str(canary_file), "--model", f"seam={folder}"]) == 0
    lock = threading.Lock()
    setting = {"window": 5, "canaries": canary_file.name, "interval_s": 3600}
    monitor = start_monitor("seam", model.task, model.config, model.service, setting, base=tmp_path, lock=lock)
    assert monitor is not None and monitor.canary_runner is not None
    try:
        deadline = time.monotonic() + 120
        while monitor.canary_runner.runs == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        labels = {"model": "seam", "method": "attnlrp"}
        assert REGISTRY.get_sample_value("explain_canary_agreement", labels) == 1.0
        assert REGISTRY.get_sample_value("explain_canary_prediction_agreement", labels) == 1.0
        with lock:  # the door's serving holds the same lock
            served = model.run([{"text": text} for text in TEXTS], "attnlrp")
        for row, outcome in served:
            monitor.observe(row, outcome)
        monitor.flush()
        assert monitor.coverage() == {"attnlrp": 1.0}
    finally:
        monitor.close()
    assert start_monitor("seam", model.task, model.config, model.service, False) is None
    (tmp_path / "bad.json").write_text("[]")
    with pytest.raises(ValueError, match=r"model seam: monitor: bad canary file .*bad\.json: not an"):
        start_monitor("seam", model.task, model.config, model.service, {"canaries": str(tmp_path / "bad.json")})


def test_generation_is_monitored_over_the_prompts_words(tmp_path: Path) -> None:
    from serving_core.wire import Encoding
    from tests.generation_checkpoint import causal_lm

    model = InProcessModel("writer", causal_lm(tmp_path / "writer"))
    prompt = "the service was quick and the staff were lovely"
    readings = {}
    for granularity in ("word", "token"):
        body = {"prompt": prompt, "max_new_tokens": 3, "explain": {"method": "attnlrp", "granularity": granularity}}
        row = model.task.decode_row({"body": body}, False, model.config)
        outcomes, _ = model.service.run([row], [Encoding.JSON])
        readings[granularity] = model.reader(row, outcomes[0]).explained[0]
    words = readings["word"]
    assert words.label == "all" and words.drift
    assert set(words.shares.shares) == set(prompt.split())  # the prompt's words, none of the answer's
    assert sum(words.shares.shares.values()) == pytest.approx(1.0)
    tokens = readings["token"]  # tokens: grouped into the same words, with the same shares
    assert tokens.drift
    assert tokens.shares.shares.keys() == words.shares.shares.keys()
    for key, share in words.shares.shares.items():
        assert tokens.shares.shares[key] == pytest.approx(share, abs=1e-5)
    assert tokens.shares.special_share == pytest.approx(words.shares.special_share, abs=1e-5)
    assert tokens.shares.negative_share == pytest.approx(words.shares.negative_share)


@pytest.mark.parametrize("family", ["qwen3", "mistral"])
def test_a_chat_row_answered_in_tokens_is_monitored_over_the_same_words(family: str, tmp_path: Path) -> None:
    """Messages, documents and a chat template: a row answered in tokens gives the prompt words (template tokens
    apart) and shares that the same row answered in words gives, so every explained row joins the drift window."""
    from serving_core.wire import Encoding
    from tests.chat_zoo import save_chat_model

    model = InProcessModel("chat", save_chat_model(family, tmp_path / family))
    body: dict[str, object] = {
        "messages": [{"role": "user", "content": "Isn't the staff's service quick, e.g. 3.5 minutes? Lovely!"}],
        "max_new_tokens": 3,
    }
    if family == "qwen3":
        body["documents"] = [{"title": "Review", "text": "The well-known waiter was slow; food cold."}]
    readings = {}
    for granularity in ("word", "token"):
        explain = {"method": "attnlrp", "granularity": granularity, "steps": [0, 2]}
        row = model.task.decode_row({"body": {**body, "explain": explain}}, False, model.config)
        outcomes, _ = model.service.run([row], [Encoding.JSON])
        assert outcomes[0].error is None, outcomes[0].error
        readings[granularity] = model.reader(row, outcomes[0]).explained[0]
    words, tokens = readings["word"], readings["token"]
    assert words.drift and tokens.drift
    assert {"staff's", "3.5", "lovely"} <= set(words.shares.shares)
    assert tokens.shares.shares.keys() == words.shares.shares.keys()
    for key, share in words.shares.shares.items():
        assert tokens.shares.shares[key] == pytest.approx(share, abs=1e-6)
    assert tokens.shares.special_share == pytest.approx(words.shares.special_share, abs=1e-6)
    assert tokens.shares.entropy == pytest.approx(words.shares.entropy, abs=1e-6)


def test_rows_answered_in_tokens_fill_the_generation_drift_window(tmp_path: Path) -> None:
    """Every explained generation row answered in tokens, sentences or words joins the prompt-word window."""
    from monitoring.monitor import Monitor
    from monitoring.readers import GenerationReader
    from tests.generation_checkpoint import causal_lm

    model = InProcessModel("writer", causal_lm(tmp_path / "writer"))
    monitor = Monitor("window-test", MonitorConfig(window=5), GenerationReader(), start=False)
    for granularity, expected in (("token", 2), ("sentence", 3), ("word", 4)):
        body = {"prompt": TEXTS[0], "max_new_tokens": 2, "explain": {"method": "attnlrp", "granularity": granularity}}
        row = model.task.decode_row({"body": body}, False, model.config)
        for _ in range(2 if granularity == "token" else 1):
            outcomes, _ = model.service.run([row], [row.encoding])
            monitor.process(row, outcomes[0])
        assert monitor.trackers[("attnlrp", "all")].window.rows == expected, granularity
