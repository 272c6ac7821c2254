"""Serve your own checkpoints through the real TorchServe: five tiny checkpoint folders written in the test (a
sentence-pair encoder, a multi-label head, a regression head, a left-padding decoder classifier and a vision model)
are started together by the launcher exactly as ``make start MODELS=...`` starts them, then each is called over
REST and gRPC with an explanation and compared with the same checkpoint explained in-process. A second start's
packaging step reuses the packages."""

from __future__ import annotations

import inspect
import io
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import torch
from transformers import AutoModelForImageClassification, AutoModelForSequenceClassification, AutoTokenizer

from doors.torchserve.config import Ports
from doors.torchserve.process import Server, stop
from explain_client import protos
from explainers import explain
from tests import checkpoints
from tests.serving_support import b64, http_post, png_bytes

pytestmark = pytest.mark.slow
REPO_ROOT = Path(__file__).resolve().parents[2]
PREMISE, HYPOTHESIS = "the staff were lovely", "the service was quick"


def _launch(command: str, models: str, store: Path, run_dir: Path, ports: Ports) -> subprocess.CompletedProcess[str]:
    """``python -m doors COMMAND`` with the environment ``make start MODELS=...`` gives it."""
    env = {
        **os.environ,
        "MODELS": models,
        "MODEL_STORE": str(store),
        "RUN_DIR": str(run_dir),
        **{f"{name.upper()}_PORT": str(value) for name, value in ports.__dict__.items()},
    }
    return subprocess.run(
        [sys.executable, "-m", "doors", command],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=400, check=False,
    )  # fmt: skip


@pytest.fixture(scope="module")
def own(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("checkpoints")
    return {name: build(folder / name) for name, build in checkpoints.BUILDERS.items()}


@pytest.fixture(scope="module")
def own_server(own: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Path, str]]:
    store = tmp_path_factory.mktemp("store")
    run_dir = tmp_path_factory.mktemp("run")
    ports = Ports.free()
    models = ",".join(f"{name}={path}" for name, path in own.items())
    try:
        started = _launch("start", models, store, run_dir, ports)
        assert started.returncode == 0, started.stdout + started.stderr
        assert "/explanations/pairs" in started.stdout, "the usage lines show a served model"
        yield Server(run_dir, ports, 0, 0, tuple(own)), store, models
    finally:
        stop(run_dir)


def _rest(server: Server, model: str, document: dict[str, Any]) -> dict[str, Any]:
    status, reply = http_post(
        f"{server.inference_url}/predictions/{model}", json.dumps(document).encode(), server.keys["inference"]
    )
    assert status == 200, reply
    assert isinstance(reply, dict)
    return reply


def _grpc(server: Server, model: str, request: Any) -> Any:
    inference_pb2, inference_grpc = protos.inference_stubs()
    metadata = [("authorization", f"Bearer {server.keys['inference']}")]
    with grpc.insecure_channel(f"127.0.0.1:{server.ports.grpc_inference}") as channel:
        stub = inference_grpc.InferenceAPIsServiceStub(channel)
        reply = stub.Predictions(
            inference_pb2.PredictionsRequest(model_name=model, input={"request": request.SerializeToString()}),
            metadata=metadata,
            timeout=60,
        )
    return protos.explain_messages().ExplainResponse.FromString(reply.prediction)


def _reference(folder: Path, text: str, pair: str | None, method: str) -> Any:
    """The checkpoint folder explained in-process, independently of the service (inputs the model's forward takes)."""
    model = AutoModelForSequenceClassification.from_pretrained(str(folder), attn_implementation="eager").eval()
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    accepted = inspect.signature(model.forward).parameters
    inputs = tokenizer([text], [pair] if pair else None, return_tensors="pt")
    return explain(model, {key: value for key, value in inputs.items() if key in accepted}, method=method)


def test_sentence_pair_over_rest_and_grpc(own_server: tuple[Server, Path, str], own: dict[str, Path]) -> None:
    server = own_server[0]
    document = {"text": PREMISE, "text_pair": HYPOTHESIS, "explain": {"method": "relevance"}}
    reply = _rest(server, "pairs", document)
    explanation = reply["explanation"]
    assert explanation["tokens"].count("[SEP]") == 2 and set(explanation["segments"]) == {-1, 0, 1}
    expected = _reference(own["pairs"], PREMISE, HYPOTHESIS, "relevance")
    torch.testing.assert_close(torch.tensor(explanation["scores"]), expected.scores[0].float(), rtol=1e-3, atol=1e-5)
    assert reply["label_id"] == int(expected.probabilities[0].argmax())
    messages = protos.explain_messages()
    request = messages.ExplainRequest(text=PREMISE, text_pair=HYPOTHESIS, explain=messages.ExplainOptions(method="gae"))
    answer = _grpc(server, "pairs", request)
    assert answer.head_type == "single_label" and list(answer.explanation.segments) == explanation["segments"]
    expected = _reference(own["pairs"], PREMISE, HYPOTHESIS, "gae")
    torch.testing.assert_close(torch.tensor(list(answer.explanation.scores)), expected.scores[0].float(), rtol=1e-3,
                               atol=1e-5)  # fmt: skip


def test_multi_label_and_regression_heads(own_server: tuple[Server, Path, str], own: dict[str, Path]) -> None:
    server = own_server[0]
    reply = _rest(server, "topics", {"text": "the food was cold", "explain": {"method": "rollout"}})
    assert reply["head_type"] == "multi_label" and reply["threshold"] == 0.5
    assert reply["labels"] == [name for name, value in reply["probabilities"].items() if value >= 0.5]
    expected = _reference(own["topics"], "the food was cold", None, "rollout")
    torch.testing.assert_close(
        torch.tensor(list(reply["probabilities"].values())), expected.probabilities[0].float(), rtol=1e-4, atol=1e-5
    )
    messages = protos.explain_messages()
    answer = _grpc(server, "topics", messages.ExplainRequest(text="the food was cold"))
    assert list(answer.labels) == reply["labels"] and not answer.HasField("explanation")
    reply = _rest(server, "rating", {"text": "the food was cold", "explain": {"method": "grad_x_input"}})
    expected = _reference(own["rating"], "the food was cold", None, "grad_x_input")
    assert reply["head_type"] == "regression" and "label" not in reply
    assert abs(reply["value"] - float(expected.logits[0, 0])) < 1e-4
    torch.testing.assert_close(
        torch.tensor(reply["explanation"]["scores"]), expected.scores[0].float(), rtol=1e-3, atol=1e-5
    )
    request = messages.ExplainRequest(text="the food was cold", explain=messages.ExplainOptions())
    answer = _grpc(server, "rating", request)
    assert answer.HasField("value") and abs(answer.value - reply["value"]) < 1e-4 and answer.explanation.method


def test_decoder_classifier_with_left_padding(own_server: tuple[Server, Path, str], own: dict[str, Path]) -> None:
    server = own_server[0]
    text = "the service was quick and the staff were lovely"
    reply = _rest(server, "decoder", {"text": text, "explain": {"method": "gae"}})
    explanation = reply["explanation"]
    assert explanation["pooled"] == "last" and explanation["tokens"] == text.split()
    expected = _reference(own["decoder"], text, None, "gae")
    torch.testing.assert_close(torch.tensor(explanation["scores"]), expected.scores[0].float(), rtol=1e-3, atol=1e-5)
    messages = protos.explain_messages()
    answer = _grpc(server, "decoder", messages.ExplainRequest(text=text, explain=messages.ExplainOptions()))
    assert answer.explanation.method == "attnlrp" and answer.explanation.pooled == "last"  # the packaged default
    request = messages.ExplainRequest(text=text, explain=messages.ExplainOptions(method="relevance"))
    refused = _grpc(server, "decoder", request)
    assert refused.error.code == "unsupported_method" and refused.error.http_status == 400


def test_vision_model(own_server: tuple[Server, Path, str], own: dict[str, Path]) -> None:
    server = own_server[0]
    image = png_bytes((16, 16))
    reply = _rest(server, "animals", {"image": b64(image), "explain": {"method": "rollout"}})
    assert reply["explanation"]["grid"] == [4, 4] and reply["label"] in ("cat", "dog", "bird")
    model = AutoModelForImageClassification.from_pretrained(str(own["animals"]), attn_implementation="eager").eval()
    from transformers import AutoImageProcessor

    pixels = AutoImageProcessor.from_pretrained(str(own["animals"]))(images=[_rgb(image)], return_tensors="pt")
    expected = explain(model, {"pixel_values": pixels["pixel_values"]}, method="rollout")
    torch.testing.assert_close(
        torch.tensor(reply["explanation"]["scores"]), expected.scores[0].float(), rtol=1e-3, atol=1e-5
    )
    messages = protos.explain_messages()
    answer = _grpc(server, "animals", messages.ExplainRequest(image=image, explain=messages.ExplainOptions()))
    assert list(answer.explanation.grid) == [4, 4] and answer.label == reply["label"]


def test_own_token_classifier(own_server: tuple[Server, Path, str], own: dict[str, Path]) -> None:
    """A user's NER checkpoint (`make serve MODELS=entities=...`): validated, packaged with the token handler, served
    with entities at character offsets and their attributions, equal to explain_tokens in process."""
    from transformers import AutoModelForTokenClassification, AutoTokenizer

    from explainers import explain_tokens

    server = own_server[0]
    text = "the staff in paris were lovely and quick"
    reply = _rest(server, "entities", {"text": text, "explain": {"method": "attnlrp"}})
    assert reply["head_type"] == "token_classification" and reply["scheme"] == "BIO"
    model = AutoModelForTokenClassification.from_pretrained(str(own["entities"]), attn_implementation="eager").eval()
    tokenizer = AutoTokenizer.from_pretrained(str(own["entities"]))
    batch = tokenizer(text, return_tensors="pt", return_special_tokens_mask=True)
    expected = explain_tokens(model, dict(batch), method="attnlrp")
    assert [(e["token_start"], e["token_end"], e["label_id"]) for e in reply["entities"]] == expected.spans[0]
    assert expected.spans[0], "the tiny NER model finds no entity in the text: nothing would be checked"
    for number, entity in enumerate(reply["entities"]):
        assert text[entity["start"] : entity["end"]] == entity["text"]
        torch.testing.assert_close(
            torch.tensor(entity["scores"]), expected.scores[0, number].float(), rtol=1e-3, atol=1e-5
        )
    messages = protos.explain_messages()
    answer = _grpc(server, "entities", messages.ExplainRequest(text=text))
    assert [e.text for e in answer.token_classification.entities] == [e["text"] for e in reply["entities"]]


def _rgb(data: bytes) -> Any:
    from PIL import Image

    return Image.open(io.BytesIO(data)).convert("RGB")


def test_a_second_start_reuses_the_packages(own_server: tuple[Server, Path, str]) -> None:
    _, store, models = own_server
    manifests = sorted((store / "packages").glob("*/MAR-INF/MANIFEST.json"))
    assert len(manifests) == len(checkpoints.BUILDERS)
    before = {path: path.stat().st_mtime_ns for path in manifests}
    started = time.perf_counter()
    again = _launch("package", models, store, store / "unused-run", Ports.free())
    seconds = time.perf_counter() - started
    assert again.returncode == 0, again.stderr
    assert again.stderr.count("package up to date, reusing") == len(checkpoints.BUILDERS), again.stderr
    assert {path: path.stat().st_mtime_ns for path in manifests} == before
    assert seconds < 60


def test_a_refused_checkpoint_starts_nothing(own: dict[str, Path], tmp_path: Path) -> None:
    folder = tmp_path / "pickled"
    folder.mkdir()
    for source in own["pairs"].iterdir():
        if source.suffix != ".safetensors":
            (folder / source.name).write_bytes(source.read_bytes())
    (folder / "pytorch_model.bin").write_bytes(b"\x80\x04N.")
    result = _launch("start", f"pairs={own['pairs']},bad={folder}", tmp_path / "store", tmp_path / "run", Ports.free())
    assert result.returncode == 2 and "pickle" in result.stderr
    assert not (tmp_path / "store" / "packages").exists() and not (tmp_path / "run" / "torchserve.pid").exists()
