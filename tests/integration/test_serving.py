"""Integration tests against a real TorchServe serving the tiny archives: REST and gRPC, every method, a concurrent
mixed batch, bad input, auth, and a real Prometheus server scraping the explanation metrics."""

from __future__ import annotations

import contextlib
import http.client
import json
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import grpc
import pytest
import torch
import yaml
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from doors.torchserve.config import Ports
from doors.torchserve.process import Server
from explain_client import protos
from explainers import available_methods, explain
from tests.serving_support import b64, http_post, owned_popen, png_bytes

TEXT = "the service was quick and the staff were lovely"
LABELS = ("negative", "neutral", "positive")
pytestmark = pytest.mark.slow


def rest(server: Server, route: str, model: str, document: Any, token: str | None = "inference") -> tuple[int, Any]:
    body = document if isinstance(document, bytes) else json.dumps(document).encode()
    key = server.keys[token] if token else None
    return http_post(f"{server.inference_url}/{route}/{model}", body, key)


def grpc_call(server: Server, model: str, inputs: dict[str, bytes], token: bool = True) -> bytes:
    inference_pb2, inference_grpc = protos.inference_stubs()
    metadata = [("authorization", f"Bearer {server.keys['inference']}")] if token else []
    with grpc.insecure_channel(f"127.0.0.1:{server.ports.grpc_inference}") as channel:
        stub = inference_grpc.InferenceAPIsServiceStub(channel)
        reply = stub.Predictions(
            inference_pb2.PredictionsRequest(model_name=model, input=inputs), metadata=metadata, timeout=60
        )
    return bytes(reply.prediction)


@pytest.fixture(scope="module")
def reference(archives: dict[str, Path]) -> tuple[Any, Any]:
    """The tiny sentiment model and tokenizer, loaded in-process as an independent reference."""
    model_dir = archives["sentiment"] / "model"
    model = AutoModelForSequenceClassification.from_pretrained(str(model_dir), attn_implementation="eager").eval()
    return model, AutoTokenizer.from_pretrained(str(model_dir))


def expected(reference: tuple[Any, Any], text: str, method: str, target: int | None, **options: int) -> Any:
    model, tokenizer = reference
    inputs = tokenizer([text], return_tensors="pt", truncation=True, max_length=128)
    return explain(model, dict(inputs), method=method, target=target, **options)


def test_archive_batching_is_configured(archives: dict[str, Path]) -> None:
    for archive in archives.values():
        config = yaml.safe_load((archive / "model-config.yaml").read_text())
        assert config["batchSize"] > 1 and config["maxBatchDelay"] > 0 and config["responseTimeout"] > 0


@pytest.mark.parametrize("method", available_methods())
def test_rest_text_every_method_matches_in_process(server: Server, reference: Any, method: str) -> None:
    status, reply = rest(server, "predictions", "sentiment", {"text": TEXT, "explain": {"method": method, "target": 2}})
    assert status == 200, reply
    explanation = reply["explanation"]
    assert explanation["method"] == method and explanation["target"] == 2 and explanation["target_label"] == "positive"
    tokens = explanation["tokens"]
    assert len(tokens) == len(explanation["scores"]) == len(explanation["special_tokens"])
    assert (
        explanation["special_tokens"][0]
        and explanation["special_tokens"][-1]
        and not any(explanation["special_tokens"][1:-1])
    )
    attribution = expected(reference, TEXT, method, 2)
    torch.testing.assert_close(torch.tensor(explanation["scores"]), attribution.scores[0].float(), rtol=1e-3, atol=1e-5)
    probabilities = attribution.probabilities[0]
    assert reply["label_id"] == int(probabilities.argmax()) and reply["label"] == LABELS[reply["label_id"]]
    torch.testing.assert_close(
        torch.tensor([reply["probabilities"][label] for label in LABELS]), probabilities, rtol=1e-4, atol=1e-5
    )


def test_explanations_route_uses_default_method_and_predictions_route_does_not(server: Server) -> None:
    status, reply = rest(server, "explanations", "sentiment", {"text": TEXT})
    assert status == 200 and reply["explanation"]["method"] == "attnlrp"
    status, reply = rest(server, "predictions", "sentiment", {"text": TEXT})
    assert status == 200 and "explanation" not in reply and reply["truncated"] is False


def test_long_text_is_truncated_and_says_so(server: Server) -> None:
    status, reply = rest(server, "predictions", "sentiment", {"text": "lovely " * 400, "explain": True})
    assert status == 200 and reply["truncated"] is True
    assert len(reply["explanation"]["tokens"]) == 128


@pytest.mark.parametrize("method", available_methods())
def test_rest_image_every_method(server: Server, method: str) -> None:
    status, reply = rest(server, "predictions", "digits", {"image": b64(png_bytes()), "explain": {"method": method}})
    assert status == 200, reply
    explanation = reply["explanation"]
    height, width = explanation["grid"]
    assert len(explanation["scores"]) == height and all(len(row) == width for row in explanation["scores"])
    assert explanation["target"] == reply["label_id"]


def test_rest_raw_image_body(server: Server) -> None:
    key = server.keys["inference"]
    status, reply = http_post(f"{server.inference_url}/explanations/digits", png_bytes(), key, "image/png")
    assert status == 200 and reply["explanation"]["method"] == "attnlrp"


@pytest.mark.parametrize("method", available_methods())
def test_grpc_protobuf_every_method(server: Server, reference: Any, method: str) -> None:
    messages = protos.explain_messages()
    request = messages.ExplainRequest(
        text=TEXT, explain=messages.ExplainOptions(method=method, target_label="negative")
    )
    reply = messages.ExplainResponse.FromString(
        grpc_call(server, "sentiment", {"request": request.SerializeToString()})
    )
    assert not reply.HasField("error"), reply.error
    assert reply.explanation.method == method and reply.explanation.target == 0
    assert len(reply.explanation.tokens) == len(reply.explanation.scores)
    attribution = expected(reference, TEXT, method, 0)
    torch.testing.assert_close(
        torch.tensor(list(reply.explanation.scores)), attribution.scores[0].float(), rtol=1e-3, atol=1e-5
    )


def test_grpc_json_body_and_per_row_error(server: Server) -> None:
    body = json.dumps({"text": TEXT, "explain": {"method": "rollout", "start_layer": 1}}).encode()
    reply = json.loads(grpc_call(server, "sentiment", {"body": body}))
    assert reply["explanation"]["method"] == "rollout" and reply["explanation"]["options"] == {"start_layer": 1}
    bad = json.dumps({"text": TEXT, "explain": {"method": "saliency"}}).encode()
    reply = json.loads(grpc_call(server, "sentiment", {"body": bad}))
    assert reply["error"]["code"] == "unknown_method" and reply["error"]["grpc_code"] == "INVALID_ARGUMENT"
    assert all(name in reply["error"]["message"] for name in available_methods())
    messages = protos.explain_messages()
    request = messages.ExplainRequest(image=png_bytes(), explain=messages.ExplainOptions())
    reply = messages.ExplainResponse.FromString(grpc_call(server, "digits", {"request": request.SerializeToString()}))
    assert reply.explanation.method == "attnlrp" and list(reply.explanation.grid) == [8, 8]
    garbage = messages.ExplainResponse.FromString(grpc_call(server, "sentiment", {"request": b"\xff\xff\xff"}))
    assert garbage.error.code == "invalid_protobuf" and garbage.error.http_status == 400


BAD_REQUESTS = [
    ("sentiment", b"{not json", "invalid_json", 400),
    ("sentiment", b'{"text": "\xff\xfe bad"}', "non_utf8", 400),
    ("sentiment", {"explain": True}, "missing_text", 400),
    ("sentiment", {"text": "   "}, "missing_text", 400),
    ("sentiment", {"text": TEXT, "explain": {"method": "lime"}}, "unknown_method", 400),
    ("sentiment", {"text": TEXT, "explain": {"target": "angry"}}, "invalid_target", 400),
    ("sentiment", {"text": TEXT, "explain": {"target": 7}}, "invalid_target", 400),
    ("sentiment", {"text": TEXT, "explain": {"start_layer": 99}}, "invalid_option", 400),
    ("sentiment", {"text": TEXT, "explain": {"method": "attention", "start_layer": 0}}, "invalid_option", 400),
    ("sentiment", {"text": TEXT, "colour": "red"}, "invalid_request", 400),
    ("sentiment", {"text": "x" * 20_001}, "text_too_long", 413),
    ("sentiment", {"image": b64(png_bytes())}, "unsupported_input", 415),
    ("digits", {"image": "not base64!!"}, "invalid_image", 400),
    ("digits", {"image": b64(b"\x89PNG\r\n\x1a\n" + b"\0" * 50)}, "invalid_image", 400),
    ("digits", {"image": b64(b"GIF89a" + b"\0" * 50)}, "invalid_image", 400),
    ("digits", {"text": TEXT}, "unsupported_input", 415),
    ("digits", {"image": b64(b"\0" * 2_100_000)}, "image_too_large", 413),
]


@pytest.mark.parametrize(("model", "document", "code", "status"), BAD_REQUESTS, ids=[r[2] for r in BAD_REQUESTS])
def test_bad_input_gets_its_4xx(server: Server, model: str, document: Any, code: str, status: int) -> None:
    got, reply = rest(server, "predictions", model, document)
    assert got == status, reply
    assert reply["error"]["code"] == code and reply["error"]["http_status"] == status and reply["error"]["message"]


def test_oversized_request_is_refused_by_the_frontend(server: Server) -> None:
    """A body over max_request_size gets 413; the frontend may answer before reading it all and close the connection,
    so the response is read even if sending the rest of the body fails."""
    body = json.dumps({"image": "A" * 3_100_000}).encode()
    connection = http.client.HTTPConnection("127.0.0.1", server.ports.inference, timeout=60)
    try:
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {server.keys['inference']}"}
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            connection.request("POST", "/predictions/digits", body=body, headers=headers)
        assert connection.getresponse().status == 413
    finally:
        connection.close()


def test_auth_is_required(server: Server) -> None:
    status, _ = rest(server, "predictions", "sentiment", {"text": TEXT}, token=None)
    assert status in (400, 401)
    with pytest.raises(grpc.RpcError):
        grpc_call(server, "sentiment", {"body": json.dumps({"text": TEXT}).encode()}, token=False)
    status, _ = http_post(f"http://127.0.0.1:{server.ports.management}/models", b"", None)
    assert status in (400, 401, 405)


def metrics_text(server: Server) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.ports.exporter}/metrics", timeout=10) as response:
        return response.read().decode()


def batch_size_counts(server: Server, model: str) -> tuple[float, float]:
    """(number of batches, number of batches of size 1) from the exporter."""
    total = single = 0.0
    for line in metrics_text(server).splitlines():
        if line.startswith("explain_batch_size_bucket") and f'model="{model}"' in line:
            if 'le="1.0"' in line:
                single = float(line.split()[-1])
            if 'le="+Inf"' in line:
                total = float(line.split()[-1])
    return total, single


def test_concurrent_mixed_batch(server: Server, reference: Any) -> None:
    """16 concurrent callers (prediction only, three methods with their own targets, REST and gRPC, one bad row):
    each gets its own correct answer, and at least one batch held more than one row."""
    texts = [f"{TEXT} number {index} " + "good " * (index % 5) for index in range(16)]
    plans: list[tuple[str | None, int | None]] = [
        (None, None), ("relevance", 0), ("rollout", None), ("attention", 2), ("bad", None), ("gae", 1),
        ("relevance", None), (None, None), ("rollout", 1), ("relevance", 2), ("attention", None), (None, None),
        ("gae", None), ("relevance", 1), ("rollout", 2), ("attention", 0),
    ]  # fmt: skip
    before_total, before_single = batch_size_counts(server, "sentiment")
    results: list[Any] = [None] * len(texts)
    barrier = threading.Barrier(len(texts))

    def call(index: int) -> None:
        method, target = plans[index]
        document: dict[str, Any] = {"text": texts[index]}
        if method == "bad":
            document["explain"] = {"method": "relevance", "target": "furious"}
        elif method is not None:
            document["explain"] = {"method": method, **({"target": target} if target is not None else {})}
        barrier.wait()
        if index % 2:
            results[index] = (200, json.loads(grpc_call(server, "sentiment", {"body": json.dumps(document).encode()})))
        else:
            results[index] = rest(server, "predictions", "sentiment", document)

    threads = [threading.Thread(target=call, args=(index,)) for index in range(len(texts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    for index, (method, target) in enumerate(plans):
        status, reply = results[index]
        if method == "bad":
            assert reply["error"]["code"] == "invalid_target" and (index % 2 or status == 400)
            continue
        assert status == 200, reply
        if method is None:
            assert "explanation" not in reply
            continue
        attribution = expected(reference, texts[index], method, target)
        assert reply["explanation"]["method"] == method
        assert reply["explanation"]["target"] == int(attribution.target[0])
        torch.testing.assert_close(
            torch.tensor(reply["explanation"]["scores"]), attribution.scores[0].float(), rtol=1e-3, atol=1e-5
        )
    after_total, after_single = batch_size_counts(server, "sentiment")
    batches, singles = after_total - before_total, after_single - before_single
    assert batches < len(texts) and singles < batches, f"{batches} batches, {singles} of size 1: no batching seen"


def test_prometheus_scrapes_and_answers_histogram_quantile(server: Server, tmp_path: Path) -> None:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("the `prometheus` binary is missing: `make test` installs it (scripts/system_setup.py)")
    for method in available_methods():  # make sure every method has observations
        status, _ = rest(server, "predictions", "sentiment", {"text": TEXT, "explain": {"method": method}})
        assert status == 200
    port = Ports.free().inference
    config = tmp_path / "prometheus.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "scrape_configs": [
                    {
                        "job_name": "explanations",
                        "static_configs": [{"targets": [f"127.0.0.1:{server.ports.exporter}"]}],
                    },
                    {"job_name": "torchserve", "static_configs": [{"targets": [f"127.0.0.1:{server.ports.metrics}"]}]},
                ],
            }
        )
    )
    log = (tmp_path / "prometheus.log").open("wb")
    process = owned_popen(
        [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    query = 'histogram_quantile(0.95, sum by (le, method) (explain_seconds_bucket{model="sentiment"}))'
    try:
        deadline = time.monotonic() + 60
        found: dict[str, float] = {}
        while time.monotonic() < deadline and not set(available_methods()) <= set(found):
            time.sleep(1)
            url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": query})
            try:
                with urllib.request.urlopen(url, timeout=5) as response:
                    answer = json.loads(response.read())
            except OSError:
                continue
            found = {item["metric"]["method"]: float(item["value"][1]) for item in answer["data"]["result"]}
        assert set(available_methods()) <= set(found), f"PromQL answered {found}; see {tmp_path / 'prometheus.log'}"
        assert all(0 < value < 10 for value in found.values()), found
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_exporter_has_stage_histograms_and_error_counters(server: Server) -> None:
    status, _ = rest(server, "predictions", "sentiment", {"text": TEXT, "explain": {"method": "relevance"}})
    assert status == 200
    status, _ = rest(server, "predictions", "sentiment", {"text": TEXT, "explain": {"method": "lime"}})
    assert status == 400
    text = metrics_text(server)
    for stage in ("forward", "backward", "attribution", "encode"):
        assert any(
            line.startswith("explain_stage_seconds_count")
            and 'method="relevance"' in line
            and f'stage="{stage}"' in line
            and float(line.split()[-1]) >= 1
            for line in text.splitlines()
        ), f"no {stage} observations for relevance"
    assert not any('stage="backward"' in line and 'method="attention"' in line for line in text.splitlines())
    assert any(
        line.startswith("explain_errors_total") and 'code="unknown_method"' in line and 'method="unknown"' in line
        for line in text.splitlines()
    )
    assert 'le="0.001"' in text  # millisecond buckets
