"""One contract, three doors: the same archive folders served by TorchServe, by the KServe model server and by Ray
Serve replicas behind the KServe door, called over REST and gRPC, give the same labels and scores, equal to the
in-process ``explain`` on the same folder: every method on text and images, sentence pairs, multi-label and
regression heads, a left-padding decoder classifier, the default method and the error table's codes."""

from __future__ import annotations

import inspect
import io
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from PIL import Image
from transformers import (
    AutoImageProcessor,
    AutoModelForImageClassification,
    AutoModelForSequenceClassification,
    AutoTokenizer,
)

from explainers import available_methods, explain
from serving_core.errors import ERROR_TABLE
from tests.doors_support import DOORS, TRANSPORTS, DoorCallError, DoorClient, Row, door_models, door_param, start_door
from tests.serving_support import png_bytes

pytestmark = pytest.mark.slow
TEXT = "the service was quick and the staff were lovely"
PREMISE, HYPOTHESIS = "the staff were lovely", "the service was quick"


@pytest.fixture(params=[door_param(door) for door in DOORS])
def door(request: pytest.FixtureRequest) -> Any:
    return start_door(request, request.param)


@pytest.fixture(params=TRANSPORTS)
def client(request: pytest.FixtureRequest, door: Any) -> DoorClient:
    return DoorClient(door, request.param)


@pytest.fixture(scope="session")
def models(request: pytest.FixtureRequest) -> dict[str, Path]:
    return door_models(request)


_LOADED: dict[str, Any] = {}


def reference(archive: Path, row: Row) -> Any:
    """The archive folder's checkpoint explained in-process, independently of every door."""
    config = yaml.safe_load((archive / "model-config.yaml").read_text())["handler"]
    folder = archive / config.get("model_dir", "model")
    key = str(folder)
    if config["task"] == "image":
        if key not in _LOADED:
            model = AutoModelForImageClassification.from_pretrained(str(folder), attn_implementation="eager").eval()
            _LOADED[key] = (model, AutoImageProcessor.from_pretrained(str(folder)))
        model, processor = _LOADED[key]
        height, width = config["image_size"]
        image = Image.open(io.BytesIO(row.image or b"")).convert("RGB")
        pixels = processor(images=[image], size={"height": height, "width": width}, return_tensors="pt")
        inputs: dict[str, Any] = {"pixel_values": pixels["pixel_values"]}
    else:
        if key not in _LOADED:
            model = AutoModelForSequenceClassification.from_pretrained(str(folder), attn_implementation="eager")
            tokenizer = AutoTokenizer.from_pretrained(str(folder))
            if config.get("pad_token_id") is not None:
                model.config.pad_token_id = config["pad_token_id"]
            _LOADED[key] = (model.eval(), tokenizer)
        model, tokenizer = _LOADED[key]
        accepted = inspect.signature(model.forward).parameters
        encoded = tokenizer([row.text], [row.text_pair] if row.text_pair else None, return_tensors="pt",
                            truncation=True, max_length=int(config.get("max_length", 128)))  # fmt: skip
        inputs = {name: value for name, value in encoded.items() if name in accepted}
    return explain(model, inputs, method=row.method or config["default_method"], target=row.target,
                   **dict(row.options or {}))  # fmt: skip


def assert_matches(answer: Any, expected: Any, head: str = "single_label") -> None:
    """Labels, probabilities and scores as the in-process explain computed them."""
    if head == "regression":
        assert answer.value is not None and abs(answer.value - float(expected.logits[0, 0])) < 1e-4
    else:
        probabilities = expected.probabilities[0].float()
        assert answer.label_id == int(probabilities.argmax())
        torch.testing.assert_close(torch.tensor(answer.probabilities), probabilities, rtol=1e-4, atol=1e-5)
    assert answer.target == int(expected.target[0])
    torch.testing.assert_close(
        torch.tensor(answer.scores).flatten(), expected.scores[0].float().flatten(), rtol=1e-3, atol=1e-5
    )


@pytest.mark.parametrize("method", available_methods())
def test_text_every_method(client: DoorClient, models: dict[str, Path], method: str) -> None:
    row = Row(text=TEXT, method=method, target=2)
    answer = client.call("sentiment", row)
    assert answer.method == method and answer.tokens is not None and len(answer.tokens) == len(answer.scores or [])
    assert_matches(answer, reference(models["sentiment"], row))


@pytest.mark.parametrize("method", available_methods())
def test_image_every_method(client: DoorClient, models: dict[str, Path], method: str) -> None:
    row = Row(image=png_bytes(), method=method)
    answer = client.call("digits", row)
    assert answer.method == method and answer.grid == (8, 8)
    assert_matches(answer, reference(models["digits"], row))


def test_prediction_only_and_default_method(client: DoorClient, models: dict[str, Path]) -> None:
    answer = client.call("sentiment", Row(text=TEXT))
    assert answer.method is None and answer.scores is None
    answer = client.call("sentiment", Row(text=TEXT, method="default"))
    assert answer.method == "attnlrp"
    assert_matches(answer, reference(models["sentiment"], Row(text=TEXT, method="attnlrp")))


def test_options_travel(client: DoorClient, models: dict[str, Path]) -> None:
    row = Row(text=TEXT, method="rollout", target=0, options={"start_layer": 1})
    assert_matches(client.call("sentiment", row), reference(models["sentiment"], row))


def test_sentence_pair(client: DoorClient, models: dict[str, Path]) -> None:
    row = Row(text=PREMISE, text_pair=HYPOTHESIS, method="relevance")
    answer = client.call("pairs", row)
    assert answer.tokens is not None and answer.tokens.count("[SEP]") == 2
    assert answer.segments is not None and set(answer.segments) == {-1, 0, 1}
    assert_matches(answer, reference(models["pairs"], row))


def test_multi_label_head(client: DoorClient, models: dict[str, Path]) -> None:
    row = Row(text="the food was cold", method="rollout")
    answer = client.call("topics", row)
    expected = reference(models["topics"], row)
    assert answer.predicted == [i for i, value in enumerate(expected.probabilities[0].tolist()) if value >= 0.5]
    assert_matches(answer, expected)


def test_regression_head(client: DoorClient, models: dict[str, Path]) -> None:
    row = Row(text="the food was cold", method="grad_x_input")
    assert_matches(client.call("rating", row), reference(models["rating"], row), head="regression")


def test_decoder_classifier(client: DoorClient, models: dict[str, Path]) -> None:
    row = Row(text=TEXT, method="gae")
    answer = client.call("decoder", row)
    assert answer.tokens == TEXT.split()
    assert_matches(answer, reference(models["decoder"], row))
    with pytest.raises(DoorCallError) as refused:
        client.call("decoder", Row(text=TEXT, method="relevance"))
    assert refused.value.code == "unsupported_method"


BAD_ROWS = [
    ("sentiment", Row(text=TEXT, method="lime"), "unknown_method"),
    ("sentiment", Row(text=TEXT, method="attnlrp", target=7), "invalid_target"),
    ("sentiment", Row(text=TEXT, method="rollout", options={"start_layer": 99}), "invalid_option"),
    ("sentiment", Row(text="   "), "missing_text"),
    ("sentiment", Row(text="x" * 20_001), "text_too_long"),
    ("sentiment", Row(image=png_bytes()), "unsupported_input"),
    ("digits", Row(image=b"\x89PNG\r\n\x1a\n" + b"\0" * 50), "invalid_image"),
    ("digits", Row(text=TEXT), "unsupported_input"),
]


@pytest.mark.parametrize(("model", "row", "code"), BAD_ROWS, ids=[case[2] for case in BAD_ROWS])
def test_bad_input_gets_the_error_tables_status(client: DoorClient, model: str, row: Row, code: str) -> None:
    with pytest.raises(DoorCallError) as refused:
        client.call(model, row)
    kind = ERROR_TABLE[code]
    assert refused.value.code == code
    if client.door.name != "torchserve" or client.transport == "rest":  # TorchServe's gRPC: in the body only
        assert refused.value.status == (kind.http_status if client.transport == "rest" else kind.grpc_code)
