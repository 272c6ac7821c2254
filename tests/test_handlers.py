"""Unit tests of the handler layer: config parsing, row decoding, the error table, encoding, and a batch through the
service with a tiny model (the real TorchServe path is in tests/integration)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from explain_client import protos
from explainers import available_methods
from serving_core.config import ConfigError, HandlerConfig
from serving_core.errors import ERROR_TABLE, RowError
from serving_core.tasks.classify_schema import DecodedRow, decode_row, encode_outcome
from serving_core.tasks.classify_service import ExplanationService
from serving_core.wire import Encoding, row_encoding
from tests.serving_support import b64, png_bytes, tiny_archives

TEXT_CONFIG = HandlerConfig(task="text", labels=("negative", "neutral", "positive"), max_length=16)
IMAGE_CONFIG = HandlerConfig(task="image", labels=tuple("0123456789"), image_size=(32, 32), max_image_bytes=5000)


def test_config_from_archive_yaml(tmp_path: Path) -> None:
    archive = tiny_archives()["sentiment"]
    config = HandlerConfig.from_model_yaml(yaml.safe_load((archive / "model-config.yaml").read_text()))
    assert config.task == "text" and config.labels == ("negative", "neutral", "positive")
    assert config.default_method in available_methods() and config.max_length > 0


@pytest.mark.parametrize(
    ("section", "message"),
    [
        (None, "no `handler:` section"),
        ({"task": "audio", "labels": ["a"]}, "handler.task"),
        ({"task": "text", "labels": []}, "handler.labels"),
        ({"task": "text", "labels": ["a", "a"]}, "distinct"),
        ({"task": "text", "labels": ["a"], "default_method": "lime"}, "default_method"),
        ({"task": "text", "labels": ["a"], "max_length": -1}, "max_length"),
        ({"task": "image", "labels": ["a"]}, "image_size"),
        ({"task": "text", "labels": ["a"], "colour": 1}, "unknown handler key"),
        ({"task": "text", "labels": ["a"], "device": "tpu"}, "handler.device"),
        ({"task": "text", "labels": ["a"], "records": 3}, "handler.records"),
        ({"task": "text", "labels": ["a"], "model_version": ""}, "handler.model_version"),
    ],
)
def test_config_errors_say_what_is_wrong(section: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        HandlerConfig.from_model_yaml({"handler": section} if section is not None else {})


def test_the_records_version_and_monitor_settings_are_kept() -> None:
    base = {"task": "text", "labels": ["a"]}
    absent = HandlerConfig.from_model_yaml({"handler": base})
    assert (absent.records, absent.model_version, absent.monitor) == (None, None, None)
    section = {"store": "sqlite:///records.sqlite3", "payload": "full"}
    given = HandlerConfig.from_model_yaml(
        {"handler": {**base, "records": section, "model_version": "abc", "monitor": False}}
    )
    assert (given.records, given.model_version, given.monitor) == (section, "abc", False)
    assert HandlerConfig.from_model_yaml({"handler": {**base, "records": False}}).records is False
    assert HandlerConfig.from_model_yaml({"handler": {**base, "records": "sqlite"}}).records == "sqlite"


def test_the_packaged_archive_names_its_version() -> None:
    archive = tiny_archives()["sentiment"]
    config = HandlerConfig.from_model_yaml(yaml.safe_load((archive / "model-config.yaml").read_text()))
    assert config.model_version is not None and len(config.model_version) == 64


def test_decode_json_variants() -> None:
    row = decode_row(
        {"body": {"text": "hi", "explain": {"method": "rollout", "target": "positive", "start_layer": 1}}},
        False,
        TEXT_CONFIG,
    )
    assert row.text == "hi" and row.request.method == "rollout" and row.request.target == 2
    assert dict(row.request.options) == {"start_layer": 1} and row.encoding is Encoding.JSON
    assert decode_row({"body": b'{"text": "hi"}'}, False, TEXT_CONFIG).request.method is None
    assert decode_row({"body": b'{"text": "hi"}'}, True, TEXT_CONFIG).request.method == TEXT_CONFIG.default_method
    assert decode_row({"body": b'{"text": "hi", "explain": false}'}, True, TEXT_CONFIG).request.method is None
    assert decode_row({"body": b'{"text": "hi", "explain": true}'}, False, TEXT_CONFIG).request.method == "attnlrp"
    assert decode_row({"data": "plain text body"}, False, TEXT_CONFIG).text == "plain text body"
    image = decode_row({"body": bytearray(png_bytes())}, True, IMAGE_CONFIG)
    assert image.image == png_bytes() and image.request.method == "attnlrp"
    assert decode_row({"body": {"image": b64(png_bytes())}}, False, IMAGE_CONFIG).image == png_bytes()


@pytest.mark.parametrize(
    ("row", "config", "code"),
    [
        ({"body": b"{oops"}, TEXT_CONFIG, "invalid_json"),
        ({"body": b"\xff\xfe"}, TEXT_CONFIG, "non_utf8"),
        ({"body": b"[1, 2]"}, TEXT_CONFIG, "invalid_request"),
        ({}, TEXT_CONFIG, "invalid_request"),
        ({"body": {"text": ""}}, TEXT_CONFIG, "missing_text"),
        ({"body": {"text": 5}}, TEXT_CONFIG, "invalid_request"),
        ({"body": {"explain": True}}, TEXT_CONFIG, "missing_text"),
        ({"body": {"text": "a", "explain": {"target": "angry"}}}, TEXT_CONFIG, "invalid_target"),
        ({"body": {"text": "a", "explain": {"target": 1.5}}}, TEXT_CONFIG, "invalid_target"),
        ({"body": {"text": "a", "explain": {"method": 3}}}, TEXT_CONFIG, "invalid_request"),
        ({"body": {"text": "a", "explain": "relevance"}}, TEXT_CONFIG, "invalid_request"),
        ({"body": {"text": "a" * 20_001}}, TEXT_CONFIG, "text_too_long"),
        ({"body": png_bytes()}, TEXT_CONFIG, "unsupported_input"),
        ({"body": {"image": "***"}}, IMAGE_CONFIG, "invalid_image"),
        ({"body": {"image": b64(b"\0" * 6000)}}, IMAGE_CONFIG, "image_too_large"),
        ({"body": {}}, IMAGE_CONFIG, "missing_image"),
        ({"request": b"\xff\xff"}, TEXT_CONFIG, "invalid_protobuf"),
    ],
)
def test_decode_errors(row: dict[str, Any], config: HandlerConfig, code: str) -> None:
    with pytest.raises(RowError) as caught:
        decode_row(row, False, config)
    assert caught.value.code == code and str(caught.value)


def test_error_table_is_consistent() -> None:
    for code, kind in ERROR_TABLE.items():
        assert kind.code == code and 400 <= kind.http_status < 600 and kind.grpc_code.isupper()
        error = RowError(code, "why")
        assert error.to_dict() == {
            "code": code,
            "http_status": kind.http_status,
            "grpc_code": kind.grpc_code,
            "message": "why",
        }
    with pytest.raises(KeyError):
        RowError("no_such_code", "x")


def test_decode_protobuf_request() -> None:
    messages = protos.explain_messages()
    message = messages.ExplainRequest(
        text="hi", explain=messages.ExplainOptions(method="relevance", target_id=1, options={"start_layer": 1})
    )
    row = {"request": message.SerializeToString()}
    decoded = decode_row(row, False, TEXT_CONFIG)
    assert row_encoding(row) is Encoding.PROTOBUF and decoded.encoding is Encoding.PROTOBUF
    assert decoded.request.method == "relevance" and decoded.request.target == 1
    assert dict(decoded.request.options) == {"start_layer": 1}
    plain = decode_row({"request": messages.ExplainRequest(text="hi").SerializeToString()}, False, TEXT_CONFIG)
    assert plain.request.method is None
    with pytest.raises(RowError, match="text model"):
        decode_row({"request": messages.ExplainRequest(image=b"x").SerializeToString()}, False, TEXT_CONFIG)


@pytest.fixture(scope="module")
def text_service() -> ExplanationService:
    archive = tiny_archives()["sentiment"]
    config = HandlerConfig.from_model_yaml(yaml.safe_load((archive / "model-config.yaml").read_text()))
    return ExplanationService(config, archive / "model", torch.device("cpu"))


def test_service_batch_rows_are_independent(text_service: ExplanationService) -> None:
    config = text_service.config
    raw: list[dict[str, Any]] = [
        {"body": {"text": "good food"}},
        {"body": {"text": "awful service and cold food", "explain": {"method": "relevance", "target": "negative"}}},
        {"body": {"text": "fine", "explain": {"method": "lime"}}},
        {"body": b"{broken"},
        {"body": {"text": "meh " * 300, "explain": {"method": "rollout"}}},
    ]
    rows: list[DecodedRow | RowError] = []
    for row in raw:
        try:
            rows.append(decode_row(row, False, config))
        except RowError as error:
            rows.append(error)
    outcomes, timings = text_service.run(rows, [row_encoding(row) for row in raw])
    assert timings.forward > 0 and timings.backward > 0
    assert outcomes[0].error is None and outcomes[0].method is None and outcomes[0].tokens
    assert outcomes[1].method == "relevance" and outcomes[1].target == 0
    assert outcomes[1].scores is not None and len(outcomes[1].scores) == len(outcomes[1].tokens or [])
    assert outcomes[2].error is not None and outcomes[2].error.code == "unknown_method"
    assert outcomes[3].error is not None and outcomes[3].error.code == "invalid_json"
    assert outcomes[4].truncated and len(outcomes[4].tokens or []) == config.max_length
    # the same row alone gives the same answer as inside the batch
    alone, _ = text_service.run([rows[1]], [Encoding.JSON])
    torch.testing.assert_close(torch.tensor(alone[0].scores), torch.tensor(outcomes[1].scores), rtol=1e-4, atol=1e-6)
    document = json.loads(encode_outcome(outcomes[1], config.labels))
    assert document["explanation"]["target_label"] == "negative" and document["label"] in config.labels
    assert abs(sum(document["probabilities"].values()) - 1) < 1e-4
    messages = protos.explain_messages()
    outcomes[1].encoding = Encoding.PROTOBUF
    reply = messages.ExplainResponse.FromString(encode_outcome(outcomes[1], config.labels))
    assert reply.explanation.method == "relevance" and list(reply.explanation.tokens) == outcomes[1].tokens
    outcomes[2].encoding = Encoding.PROTOBUF
    failed = messages.ExplainResponse.FromString(encode_outcome(outcomes[2], config.labels)).error
    assert failed.code == "unknown_method" and failed.http_status == 400 and "relevance" in failed.message


def test_service_answers_non_finite_scores_with_a_500_row_error(
    text_service: ExplanationService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A row whose attribution breaks down numerically gets ``attribution_failed`` (500 / INTERNAL), never a NaN
    in the JSON or protobuf body; the batch's other rows are served."""
    import explainers.methods.registry as methods_module

    rollout = methods_module.get_method("rollout")

    def all_nan(ctx: methods_module.MethodInputs) -> torch.Tensor:
        return torch.full_like(rollout.compute(ctx), float("nan"))

    monkeypatch.setitem(methods_module._REGISTRY, "rollout", dataclasses.replace(rollout, compute=all_nan))
    raw: list[dict[str, Any]] = [
        {"body": {"text": "cold food", "explain": {"method": "rollout"}}},
        {"body": {"text": "fine", "explain": True}},
    ]
    rows: list[DecodedRow | RowError] = [decode_row(row, False, text_service.config) for row in raw]
    outcomes, _ = text_service.run(rows, [Encoding.JSON, Encoding.PROTOBUF])
    assert outcomes[0].error is not None and outcomes[0].error.code == "attribution_failed"
    document = json.loads(encode_outcome(outcomes[0], text_service.config.labels))
    assert document["error"]["http_status"] == 500 and document["error"]["grpc_code"] == "INTERNAL"
    assert outcomes[1].error is None and outcomes[1].scores is not None
    assert all(math.isfinite(value) for value in outcomes[1].scores)


def test_service_rejects_bad_images() -> None:
    archive = tiny_archives()["digits"]
    config = HandlerConfig.from_model_yaml(yaml.safe_load((archive / "model-config.yaml").read_text()))
    service = ExplanationService(config, archive / "model", torch.device("cpu"))
    rows: list[DecodedRow | RowError] = [
        decode_row({"body": {"image": b64(png_bytes())}}, True, config),
        decode_row({"body": {"image": b64(b"\x89PNG\r\n\x1a\n" + b"\0" * 40)}}, True, config),
    ]
    outcomes, _ = service.run(rows, [Encoding.JSON, Encoding.JSON])
    assert outcomes[0].error is None and outcomes[0].grid is not None
    assert outcomes[1].error is not None and outcomes[1].error.code == "invalid_image"


def test_bf16_autocast_forward_keeps_rows_valid() -> None:
    archive = tiny_archives()["sentiment"]
    document = yaml.safe_load((archive / "model-config.yaml").read_text())
    document["handler"]["autocast_bf16"] = True
    config = HandlerConfig.from_model_yaml(document)
    service = ExplanationService(config, archive / "model", torch.device("cpu"))
    row = decode_row({"body": {"text": "good food", "explain": {"method": "relevance"}}}, False, config)
    outcomes, _ = service.run([row], [Encoding.JSON])
    assert outcomes[0].error is None and outcomes[0].scores is not None
    assert all(value == value for value in outcomes[0].scores)  # no NaN
    assert abs(sum(outcomes[0].probabilities) - 1) < 1e-3


def test_threads_key() -> None:
    section = {"task": "text", "labels": ["a", "b"]}
    assert HandlerConfig.from_model_yaml({"handler": section}).threads is None
    assert HandlerConfig.from_model_yaml({"handler": {**section, "threads": 1}}).threads == 1
    with pytest.raises(ConfigError, match="threads"):
        HandlerConfig.from_model_yaml({"handler": {**section, "threads": 0}})


# --------------------------------------------------------------------------------------------------------------------
# Your own checkpoints: sentence pairs, multi-label and regression heads, a left-padding decoder


@pytest.fixture(scope="module")
def own_services(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ExplanationService]:
    from model_store.package import package
    from tests import checkpoints

    folder = tmp_path_factory.mktemp("own")
    services = {}
    for name in ("pairs", "topics", "rating", "decoder"):
        result = package(checkpoints.BUILDERS[name](folder / name), name, folder / "store")
        config = HandlerConfig.from_model_yaml(yaml.safe_load((result.archive / "model-config.yaml").read_text()))
        services[name] = ExplanationService(config, result.archive / "model", torch.device("cpu"))
    return services


def _serve(service: ExplanationService, bodies: list[Any]) -> list[Any]:
    rows = [decode_row({"body": body}, False, service.config) for body in bodies]
    outcomes, _ = service.run(rows, [Encoding.JSON] * len(rows))
    return outcomes


def test_text_pair_is_decoded_from_json_and_protobuf() -> None:
    row = decode_row({"body": {"text": "a premise", "text_pair": "a hypothesis"}}, False, TEXT_CONFIG)
    assert (row.text, row.text_pair) == ("a premise", "a hypothesis")
    messages = protos.explain_messages()
    payload = messages.ExplainRequest(text="a premise", text_pair="a hypothesis").SerializeToString()
    row = decode_row({"request": payload}, False, TEXT_CONFIG)
    assert (row.text, row.text_pair, row.encoding) == ("a premise", "a hypothesis", Encoding.PROTOBUF)
    assert decode_row({"body": {"text": "one"}}, False, TEXT_CONFIG).text_pair is None
    for body, code in (
        ({"text": "a", "text_pair": 3}, "invalid_request"),
        ({"text": "a", "text_pair": "  "}, "missing_text"),
        ({"text": "a", "text_pair": "b" * 20_000}, "text_too_long"),
    ):
        with pytest.raises(RowError) as raised:
            decode_row({"body": body}, False, TEXT_CONFIG)
        assert raised.value.code == code
    with pytest.raises(RowError) as raised:
        decode_row({"body": {"image": b64(png_bytes()), "text_pair": "x"}}, False, IMAGE_CONFIG)
    assert raised.value.code == "unsupported_input"


def test_a_pair_is_scored_over_both_segments_and_rows_stay_independent(own_services: dict[str, Any]) -> None:
    service = own_services["pairs"]
    explain = {"method": "gae"}
    pair = {"text": "the staff were lovely", "text_pair": "the service was quick", "explain": explain}
    batch = _serve(service, [pair, {"text": "cold food", "explain": explain}])
    tokens, segments = batch[0].tokens, batch[0].segments
    assert tokens[0] == "[CLS]" and tokens.count("[SEP]") == 2 and len(batch[0].scores) == len(tokens)
    assert segments == [-1, 0, 0, 0, 0, -1, 1, 1, 1, 1, -1]
    assert batch[1].segments is None and batch[1].tokens == ["[CLS]", "cold", "food", "[SEP]"]
    alone = _serve(service, [pair])[0]
    torch.testing.assert_close(torch.tensor(alone.scores), torch.tensor(batch[0].scores), rtol=1e-4, atol=1e-6)
    document = json.loads(encode_outcome(batch[0], service.config.labels))
    assert document["explanation"]["segments"] == segments and "pooled" not in document["explanation"]


def test_multi_label_and_regression_answers(own_services: dict[str, Any]) -> None:
    topics = own_services["topics"]
    outcome = _serve(topics, [{"text": "the food was cold", "explain": {"method": "rollout"}}])[0]
    document = json.loads(encode_outcome(outcome, topics.config.labels))
    probabilities = document["probabilities"]
    assert document["head_type"] == "multi_label" and document["threshold"] == 0.5
    assert document["labels"] == [label for label, value in probabilities.items() if value >= 0.5]
    assert abs(sum(probabilities.values()) - 1) > 1e-3, "independent sigmoids, not a softmax"
    reference = topics.model(**topics.tokenizer(["the food was cold"], return_tensors="pt")).logits.sigmoid()[0]
    torch.testing.assert_close(torch.tensor(list(probabilities.values())), reference, rtol=1e-4, atol=1e-5)
    reply = protos.explain_messages().ExplainResponse.FromString(
        encode_outcome(dataclasses.replace(outcome, encoding=Encoding.PROTOBUF), topics.config.labels)
    )
    assert reply.head_type == "multi_label" and list(reply.labels) == document["labels"]
    rating = own_services["rating"]
    outcome = _serve(rating, [{"text": "the food was cold", "explain": {"method": "grad_x_input"}}])[0]
    document = json.loads(encode_outcome(outcome, rating.config.labels))
    expected = float(rating.model(**rating.tokenizer(["the food was cold"], return_tensors="pt")).logits[0, 0].detach())
    assert document["head_type"] == "regression" and "label" not in document and "probabilities" not in document
    assert abs(document["value"] - expected) < 1e-4 and document["explanation"]["target_label"] == "score"
    reply = protos.explain_messages().ExplainResponse.FromString(
        encode_outcome(dataclasses.replace(outcome, encoding=Encoding.PROTOBUF), rating.config.labels)
    )
    assert reply.HasField("value") and abs(reply.value - expected) < 1e-4 and reply.label == ""


def test_a_decoder_is_left_padded_and_explains_its_last_token(own_services: dict[str, Any]) -> None:
    service = own_services["decoder"]
    assert service.tokenizer.padding_side == "left" and service.pooled == "last"
    bodies = [
        {"text": "the service was quick and the staff were lovely", "explain": {"method": "gae"}},
        {"text": "cold food", "explain": {"method": "gae"}},
        {"text": "cold food", "explain": {"method": "relevance"}},
    ]
    batch = _serve(service, bodies)
    alone = _serve(service, [bodies[1]])[0]
    assert batch[1].tokens == ["cold", "food"] and alone.label_id == batch[1].label_id
    torch.testing.assert_close(torch.tensor(alone.scores), torch.tensor(batch[1].scores), rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(torch.tensor(alone.probabilities), torch.tensor(batch[1].probabilities))
    document = json.loads(encode_outcome(batch[0], service.config.labels))
    assert document["explanation"]["pooled"] == "last"
    assert batch[2].error is not None and batch[2].error.code == "unsupported_method"
    assert "gae" in batch[2].error.message


def test_docs_list_the_support_matrix_and_every_error_code() -> None:
    from explainers import support_table, supported_model_types

    root = Path(__file__).resolve().parent.parent
    serving = (root / "docs" / "SERVING.md").read_text(encoding="utf-8")
    assert support_table(available_methods()) in serving, "regenerate the support matrix of docs/SERVING.md"
    for code, kind in ERROR_TABLE.items():
        assert f"| `{code}` | {kind.http_status} | {kind.grpc_code} |" in serving, f"{code} not in the docs"
    quickstart = (root / "docs" / "quickstart.md").read_text(encoding="utf-8")
    section = quickstart[quickstart.index("## Serve your own checkpoint") :]
    assert all(f"`{model_type}`" in section for model_type in supported_model_types())
