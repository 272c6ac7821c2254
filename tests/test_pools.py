"""Explanation pools without a server: which requests the router sends to ``<name>.explain`` (the same decision as the
handlers' own decoding, for every kind of row), how it rewrites REST paths and gRPC requests, how the per-run model
store registers a pool, and the packaging setting that asks for one."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from doors.torchserve.config import POOL_KEY, Ports, link_store, load_profile, write_config
from doors.torchserve.process import router_command
from doors.torchserve.router import PoolRouter
from explain_client.protos import explain_messages, inference_stubs
from model_store.package.settings import PackageError, Settings
from serving_core.config import HandlerConfig
from serving_core.errors import RowError
from serving_core.pools import asks_for_explanation, model_of, pool_name
from serving_core.tasks.classify_schema import decode_row
from serving_core.tasks.generation_schema import decode_generation_row

TEXT = HandlerConfig(task="text", labels=("negative", "positive"), max_length=16)
GENERATION = HandlerConfig(task="generation", labels=(), max_length=16)

EXPLAINS: list[dict[str, Any]] = [
    {"text": "fine", "explain": True},
    {"text": "fine", "explain": {}},
    {"text": "fine", "explain": {"method": "rollout"}},
    {"text": "fine", "explain": {"below": 0.8}},
    {"text": "fine", "explain": {"method": "gae", "target": "positive"}},
]
PREDICTS: list[dict[str, Any]] = [
    {"text": "fine"},
    {"text": "fine", "explain": False},
    {"text": "fine", "explain": None},
    {"text": "fine", "text_pair": "also fine"},
]


def _handler_explains(row: dict[str, Any], header: bool = False, config: HandlerConfig = TEXT) -> bool:
    if config.task == "generation":
        return decode_generation_row(row, header, config).ask is not None
    return decode_row(row, header, config).request.method is not None


@pytest.mark.parametrize("document", EXPLAINS + PREDICTS, ids=lambda document: json.dumps(document))
@pytest.mark.parametrize("form", ["bytes", "str"])
def test_json_rows_decide_as_the_handler_does(document: dict[str, Any], form: str) -> None:
    body = json.dumps(document)
    fields = {"body": body.encode() if form == "bytes" else body}
    assert asks_for_explanation(fields) == _handler_explains(fields) == (document in EXPLAINS)
    assert asks_for_explanation(fields, explanations_route=True)


@pytest.mark.parametrize(
    "document",
    [{"prompt": "the flight"}, {"prompt": "the flight", "explain": {}}, {"prompt": "a", "explain": {"steps": "sum"}},
     {"prompt": "a", "explain": False}, {"prompt": "a", "max_new_tokens": 2, "explain": True}],
    ids=lambda document: json.dumps(document),
)  # fmt: skip
def test_generation_rows_decide_as_the_handler_does(document: dict[str, Any]) -> None:
    fields = {"data": json.dumps(document).encode()}
    assert asks_for_explanation(fields) == _handler_explains(fields, config=GENERATION)


def test_protobuf_rows_decide_as_the_handler_does() -> None:
    messages = explain_messages()
    plain = messages.ExplainRequest(text="fine").SerializeToString()
    explained = messages.ExplainRequest(text="fine", explain=messages.ExplainOptions(method="rollout"))
    conditional = messages.ExplainRequest(text="fine", explain=messages.ExplainOptions(below=0.5))
    for payload, expected in (
        (plain, False),
        (explained.SerializeToString(), True),
        (conditional.SerializeToString(), True),
    ):
        assert asks_for_explanation({"request": payload}) == _handler_explains({"request": payload}) == expected
    generation = messages.ExplainRequest(generation=messages.GenerationRequest(prompt="the flight"))
    assert not asks_for_explanation({"request": generation.SerializeToString()})
    generation.generation.explain.method = "attnlrp"
    assert asks_for_explanation({"request": generation.SerializeToString()})


@pytest.mark.parametrize(
    "fields",
    [{"body": b"\x89PNG\r\n\x1a\n" + b"\0" * 32}, {"body": b"the crew was lovely"}, {"body": "plain text"},
     {"body": b"{not json"}, {"body": b"[1, 2]"}, {"body": b"\xff\xfe"}, {}, {"request": b"\xff\xff\xff"}],
    ids=["image", "text-bytes", "text-str", "bad-json", "json-list", "not-utf8", "empty", "bad-protobuf"],
)  # fmt: skip
def test_anything_else_is_a_prediction(fields: dict[str, Any]) -> None:
    """Raw images and texts are predictions unless the route says otherwise; an undecodable row goes to the
    prediction pool, which answers it with its error (the same handler would on either pool)."""
    assert not asks_for_explanation(fields)
    with contextlib.suppress(RowError):
        assert not _handler_explains(fields)


def test_pool_names() -> None:
    assert pool_name("sentiment") == "sentiment.explain"
    assert model_of("sentiment.explain") == model_of("sentiment") == "sentiment"


def test_router_rewrites_rest_paths_of_pooled_models_only() -> None:
    router = PoolRouter(["sentiment"])
    explain = json.dumps(EXPLAINS[2]).encode()
    predict = json.dumps(PREDICTS[0]).encode()
    assert router.rest_path("/predictions/sentiment", explain) == "/predictions/sentiment.explain"
    assert router.rest_path("/predictions/sentiment/1.0?x=1", explain) == "/predictions/sentiment.explain/1.0?x=1"
    assert router.rest_path("/explanations/sentiment", predict) == "/explanations/sentiment.explain"
    assert router.rest_path("/predictions/sentiment", predict) == "/predictions/sentiment"
    assert router.rest_path("/predictions/digits", explain) == "/predictions/digits"
    for path in ("/ping", "/models/sentiment", "/predictions", "/v2/models/sentiment/infer"):
        assert router.rest_path(path, explain) == path


def test_router_rewrites_grpc_predictions_of_pooled_models_only() -> None:
    router = PoolRouter(["sentiment"])
    messages, _ = inference_stubs()

    def routed(model: str, document: dict[str, Any], method: str = "Predictions") -> str:
        request = messages.PredictionsRequest(model_name=model, input={"body": json.dumps(document).encode()})
        forwarded = messages.PredictionsRequest()
        forwarded.ParseFromString(router.grpc_request(method, request.SerializeToString()))
        assert dict(forwarded.input) == dict(request.input)
        return str(forwarded.model_name)

    assert routed("sentiment", EXPLAINS[0]) == "sentiment.explain"
    assert routed("sentiment", EXPLAINS[0], "StreamPredictions") == "sentiment"  # refused by the forwarder anyway
    assert routed("sentiment", PREDICTS[1]) == "sentiment"
    assert routed("digits", EXPLAINS[0]) == "digits"
    assert router.grpc_request("Predictions", b"\xff\xff") == b"\xff\xff"
    assert router.grpc_request("Ping", b"") == b""


def _archive(tmp_path: Path, pool: Any = None) -> Path:
    archive = tmp_path / "store" / "sentiment"
    (archive / "model").mkdir(parents=True)
    config: dict[str, Any] = {
        "minWorkers": 1,
        "maxWorkers": 1,
        "batchSize": 8,
        "maxBatchDelay": 2,
        "handler": {"task": "text"},
    }
    if pool is not None:
        config[POOL_KEY] = pool
    (archive / "model-config.yaml").write_text(yaml.safe_dump(config))
    return archive


def test_store_registers_a_pool_with_its_own_batching(tmp_path: Path) -> None:
    archive = _archive(tmp_path, {"batchSize": 2, "maxBatchDelay": 10})
    store = link_store(tmp_path / "run", tmp_path / "store", {"sentiment": "sentiment", "plain": "sentiment"}, {})
    assert store.served == ("sentiment", "sentiment.explain", "plain", "plain.explain")
    assert store.pools == ("sentiment", "plain")
    model = yaml.safe_load((store.path / "sentiment" / "model-config.yaml").read_text())
    pool = yaml.safe_load((store.path / "sentiment.explain" / "model-config.yaml").read_text())
    assert POOL_KEY not in model and POOL_KEY not in pool
    assert (model["batchSize"], model["maxBatchDelay"]) == (8, 2)
    assert (pool["batchSize"], pool["maxBatchDelay"], pool["handler"]) == (2, 10, model["handler"])
    assert (store.path / "sentiment.explain" / "model").resolve() == (archive / "model").resolve()


def test_a_profile_or_override_can_add_or_remove_the_pool(tmp_path: Path) -> None:
    _archive(tmp_path)
    store = link_store(tmp_path / "run", tmp_path / "store", {"sentiment": "sentiment"}, {})
    assert store.pools == () and store.served == ("sentiment",)
    store = link_store(
        tmp_path / "run", tmp_path / "store", {"sentiment": "sentiment"}, {"sentiment": {POOL_KEY: {"minWorkers": 1}}}
    )
    assert store.pools == ("sentiment",)
    store = link_store(
        tmp_path / "run", tmp_path / "store", {"sentiment": "sentiment"}, {"sentiment": {POOL_KEY: None}}
    )
    assert store.pools == ()


@pytest.mark.parametrize(
    ("pool", "message"),
    [(3, "must be a mapping"), ({"handler": {}}, "unknown key"), ({"batchSize": 0}, "integer >= 1"),
     ({"batchSize": True}, "integer >= 1"), ({"minWorkers": 2, "maxWorkers": 1}, "minWorkers is above")],
)  # fmt: skip
def test_a_wrong_pool_section_is_refused(tmp_path: Path, pool: Any, message: str) -> None:
    _archive(tmp_path, pool)
    with pytest.raises(ValueError, match=message):
        link_store(tmp_path / "run", tmp_path / "store", {"sentiment": "sentiment"}, {})


def test_settings_ask_for_a_pool() -> None:
    assert Settings().explanation_pool() is None
    settings = Settings.from_mapping(
        {"explanation_workers": 2, "batch_size": 16, "explanation_max_batch_delay": 5}, "m"
    )
    assert settings.explanation_pool() == {"minWorkers": 2, "maxWorkers": 2, "batchSize": 16, "maxBatchDelay": 5}
    with pytest.raises(PackageError, match="set explanation_workers"):
        Settings.from_mapping({"explanation_batch_size": 4}, "m")
    with pytest.raises(PackageError, match="explanation_workers must be an integer"):
        Settings.from_mapping({"explanation_workers": 0}, "m")


def test_the_pooled_profile_gives_every_model_a_pool(tmp_path: Path) -> None:
    _archive(tmp_path)
    profile = load_profile("cpu-pooled")
    store = link_store(tmp_path / "run", tmp_path / "store", {"sentiment": "sentiment"}, {"sentiment": profile})
    assert store.pools == ("sentiment",)
    pool = yaml.safe_load((store.path / "sentiment.explain" / "model-config.yaml").read_text())
    assert pool["handler"]["device"] == "cpu" and pool["batchSize"] == profile[POOL_KEY]["batchSize"]


def test_behind_the_router_torchserve_listens_on_loopback_upstream_ports(tmp_path: Path) -> None:
    ports = Ports(1, 2, 3, 4, 5, 6, 7, 8)
    text = write_config(tmp_path, ports, tmp_path / "store", behind_router=True).read_text()
    properties = dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))
    assert properties["inference_address"] == "http://127.0.0.1:7"
    assert (properties["grpc_inference_address"], properties["grpc_inference_port"]) == ("127.0.0.1", "8")
    assert properties["management_address"] == "http://127.0.0.1:2"


def test_the_store_names_the_generation_models_for_the_routers_openai_api(tmp_path: Path) -> None:
    archive = _archive(tmp_path)
    writer = archive.parent / "writer"
    (writer / "model").mkdir(parents=True)
    (writer / "model-config.yaml").write_text(yaml.safe_dump({"minWorkers": 1, "handler": {"task": "generation"}}))
    store = link_store(tmp_path / "run", tmp_path / "store", {"sentiment": "sentiment", "writer": "writer"}, {})
    assert store.generation == ("writer",) and store.pools == ()
    assert link_store(tmp_path / "run", tmp_path / "store", {"sentiment": "sentiment"}, {}).generation == ()
    command = router_command(Ports(1, 2, 3, 4, 5, 6, 7, 8), store.pools, store.generation)
    assert command[command.index("--generation") + 1] == "writer" and "--pool" not in command
    assert command[command.index("--max-body") + 1] == "3000000"  # TorchServe's max_request_size
