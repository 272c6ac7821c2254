"""ExplainClient against a real TorchServe (the tiny archives) over both transports: the same results on REST and
gRPC, equal to an in-process explanation, per-row errors as ServiceError, token sources, timeouts, batching."""

from __future__ import annotations

import http.server
import json
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from doors.torchserve.process import Server
from explain_client import ExplainClient, Prediction, Request, ServiceError, read_token_file, resolve_token
from explain_client.client import load_requests
from tests.integration.test_serving import LABELS, TEXT, expected, reference  # noqa: F401
from tests.serving_support import png_bytes

pytestmark = pytest.mark.slow
TRANSPORTS = ("rest", "grpc")


def client_for(server: Server, transport: str, **kwargs: Any) -> ExplainClient:
    return ExplainClient.from_run_dir(server.run_dir, transport, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("method", ["attention", "rollout", "relevance", "grad_x_input"])
def test_explain_text_matches_in_process(server: Server, reference: Any, transport: str, method: str) -> None:  # noqa: F811
    with client_for(server, transport) as client:
        prediction = client.explain("sentiment", TEXT, method=method, target="negative")
    explanation = prediction.explanation
    assert explanation is not None and explanation.method == method
    assert explanation.target == 0 and explanation.target_label == "negative"
    assert explanation.tokens is not None and explanation.special_tokens is not None
    assert explanation.tokens[0] == "[CLS]" and explanation.special_tokens[0] and explanation.special_tokens[-1]
    attribution = expected(reference, TEXT, method, 0)
    torch.testing.assert_close(torch.tensor(explanation.scores), attribution.scores[0].float(), rtol=1e-3, atol=1e-5)
    probabilities = attribution.probabilities[0]
    assert prediction.label == LABELS[int(probabilities.argmax())]
    torch.testing.assert_close(
        torch.tensor([prediction.probabilities[label] for label in LABELS]), probabilities, rtol=1e-4, atol=1e-5
    )


def test_rest_and_grpc_give_the_same_result(server: Server) -> None:
    results = {}
    for transport in TRANSPORTS:
        with client_for(server, transport) as client:
            results[transport] = client.explain("sentiment", TEXT, method="rollout", start_layer=1)
    rest, grpc_result = results["rest"], results["grpc"]
    assert rest.label == grpc_result.label and rest.label_id == grpc_result.label_id
    assert set(rest.probabilities) == set(grpc_result.probabilities) == set(LABELS)
    for label in LABELS:
        assert rest.probabilities[label] == pytest.approx(grpc_result.probabilities[label], abs=1e-5)
    assert rest.explanation is not None and grpc_result.explanation is not None
    assert rest.explanation.tokens == grpc_result.explanation.tokens
    assert rest.explanation.options == grpc_result.explanation.options == {"start_layer": 1}
    assert rest.explanation.scores == pytest.approx(grpc_result.explanation.scores, rel=1e-4, abs=1e-6)


def test_a_real_valued_option_travels_on_rest_and_grpc(server: Server) -> None:
    results = {}
    for transport in TRANSPORTS:
        with client_for(server, transport) as client:
            results[transport] = client.explain("sentiment", TEXT, method="smoothgrad", stdev=0.15, n_samples=2)
    rest, grpc_result = results["rest"].explanation, results["grpc"].explanation
    assert rest is not None and grpc_result is not None
    assert rest.options == grpc_result.options == {"n_samples": 2, "stdev": 0.15, "seed": 0, "internal_batch_size": 64}
    assert isinstance(grpc_result.options["stdev"], float) and isinstance(grpc_result.options["n_samples"], int)
    assert rest.scores == pytest.approx(grpc_result.scores, rel=1e-4, abs=1e-6)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_predict_only_and_image(server: Server, transport: str) -> None:
    with client_for(server, transport) as client:
        plain = client.predict("sentiment", TEXT)
        image = client.explain("digits", image=png_bytes(), method="relevance")
    assert plain.explanation is None and plain.label in LABELS and not plain.truncated
    assert sum(plain.probabilities.values()) == pytest.approx(1.0, abs=1e-4)
    explanation = image.explanation
    assert explanation is not None and explanation.grid == (8, 8) and len(explanation.scores) == 64
    assert explanation.tokens is None and len(explanation.score_grid()) == 8
    assert explanation.target == image.label_id


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize(
    ("kwargs", "code", "http_status"),
    [
        ({"method": "lime"}, "unknown_method", 400),
        ({"method": "relevance", "target": "furious"}, "invalid_target", 400),
        ({"method": "relevance", "target": 9}, "invalid_target", 400),
        ({"method": "attention", "start_layer": 0}, "invalid_option", 400),
    ],
)
def test_row_error_is_a_service_error(
    server: Server,
    transport: str,
    kwargs: dict[str, Any],
    code: str,
    http_status: int,
) -> None:
    with client_for(server, transport) as client, pytest.raises(ServiceError) as caught:
        client.explain("sentiment", TEXT, **kwargs)
    error = caught.value
    assert error.code == code and error.http_status == http_status and error.grpc_code == "INVALID_ARGUMENT"
    assert error.message and code in str(error)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_unknown_model_and_wrong_input(server: Server, transport: str) -> None:
    with client_for(server, transport) as client:
        with pytest.raises(ServiceError) as caught:
            client.predict("no_such_model", TEXT)
        assert caught.value.code == "model_not_found" or caught.value.grpc_code in ("NOT_FOUND", "INTERNAL")
        with pytest.raises(ServiceError) as caught:
            client.predict("digits", TEXT)
        assert caught.value.code == "unsupported_input" and caught.value.http_status == 415


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_token_sources(
    server: Server,
    transport: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("EXPLAIN_TOKEN", raising=False)
    monkeypatch.delenv("EXPLAIN_TOKEN_FILE", raising=False)
    address = {"url": server.inference_url, "grpc_address": f"127.0.0.1:{server.ports.grpc_inference}"}
    with ExplainClient(transport, **address) as client, pytest.raises(ServiceError) as caught:  # type: ignore[arg-type]
        client.predict("sentiment", TEXT)
    assert caught.value.code == "unauthorized" and "no token was sent" in caught.value.message
    key = server.keys["inference"]
    plain = tmp_path / "token.txt"
    plain.write_text(key + "\n")
    assert read_token_file(plain) == key and read_token_file(server.run_dir / "key_file.json") == key
    with ExplainClient(transport, token_file=plain, **address) as client:  # type: ignore[arg-type]
        assert client.predict("sentiment", TEXT).label in LABELS
    monkeypatch.setenv("EXPLAIN_TOKEN", key)
    assert resolve_token() == key
    with ExplainClient(transport, **address) as client:  # type: ignore[arg-type]
        assert client.predict("sentiment", TEXT).label in LABELS
    monkeypatch.delenv("EXPLAIN_TOKEN")
    monkeypatch.setenv("EXPLAIN_TOKEN_FILE", str(server.run_dir / "key_file.json"))
    with ExplainClient(transport, **address) as client:  # type: ignore[arg-type]
        assert client.predict("sentiment", TEXT).label in LABELS


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_timeout_is_a_service_error(server: Server, transport: str) -> None:
    # integrated_gradients with many steps takes far longer than 1 ms.
    with client_for(server, transport, timeout=0.001) as client, pytest.raises(ServiceError) as caught:
        client.explain("sentiment", TEXT, method="integrated_gradients", n_steps=64)
    assert caught.value.code == "timeout"


def test_unreachable_server_is_unavailable() -> None:
    from doors.torchserve.config import Ports

    port = Ports.free().inference
    for transport in TRANSPORTS:
        client = ExplainClient(
            transport,  # type: ignore[arg-type]
            url=f"http://127.0.0.1:{port}",
            grpc_address=f"127.0.0.1:{port}",
            timeout=5,
        )
        with client, pytest.raises(ServiceError) as caught:
            client.predict("sentiment", TEXT)
        assert caught.value.code in ("unavailable", "timeout")


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_explain_many_is_concurrent_ordered_and_isolates_errors(server: Server, transport: str) -> None:
    texts = [f"{TEXT} number {index} " + "good " * (index % 4) for index in range(10)]
    requests: list[Request | str] = list(texts)
    requests.insert(4, Request(text=TEXT, method="relevance", target="furious"))
    seen: list[int] = []
    threads: set[int] = set()
    lock = threading.Lock()

    def on_result(index: int, result: Prediction | ServiceError) -> None:
        with lock:
            seen.append(index)
            threads.add(threading.get_ident())

    with client_for(server, transport, concurrency=6) as client:
        results = client.explain_many("sentiment", requests, method="rollout", on_result=on_result)
        singles = [client.explain("sentiment", text, method="rollout") for text in texts[:3]]
    assert len(results) == len(requests) and sorted(seen) == list(range(len(requests)))
    assert len(threads) > 1, "the calls did not run concurrently"
    error = results[4]
    assert isinstance(error, ServiceError) and error.code == "invalid_target"
    predictions = [result for index, result in enumerate(results) if index != 4]
    assert all(isinstance(result, Prediction) for result in predictions)
    for text, result in zip(texts, predictions, strict=True):
        assert isinstance(result, Prediction) and result.explanation is not None
        assert result.explanation.method == "rollout"
        assert "".join(result.explanation.tokens or ()).replace("##", "").count("number") == 1
        assert str(texts.index(text)) in result.explanation.tokens  # type: ignore[operator]
    for single, result in zip(singles, predictions, strict=False):
        assert isinstance(result, Prediction) and result.explanation is not None and single.explanation is not None
        assert single.explanation.scores == pytest.approx(result.explanation.scores, rel=1e-4, abs=1e-6)


def test_load_requests_lines_and_json_lines(tmp_path: Path) -> None:
    image = tmp_path / "digit.png"
    image.write_bytes(png_bytes())
    lines = ["plain text line", "", json.dumps({"text": "from json"}), json.dumps({"image": "digit.png"})]
    assert load_requests(lines, image_base=tmp_path) == ["plain text line", "from json", png_bytes()]
    with pytest.raises(ValueError, match="line 1"):
        load_requests([json.dumps({"colour": "red"})])


def test_request_and_client_validation() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        Request()
    with pytest.raises(ValueError, match="exactly one"):
        Request(text="a", image=b"b")
    with pytest.raises(ValueError, match="transport"):
        ExplainClient("http")  # type: ignore[arg-type]
    assert Request(text="a").to_json() == {"text": "a", "explain": False}
    assert Request(text="a", method="rollout", target=1, options={"start_layer": 1}).to_json() == {
        "text": "a",
        "explain": {"method": "rollout", "start_layer": 1, "target": 1},
    }


class _FlakyBackend:
    """A backend that fails with the given errors, in order, then answers; counts the calls."""

    def __init__(self, *errors: ServiceError) -> None:
        self.errors = list(errors)
        self.calls = 0
        self.token: str | None = None

    def call(self, model: str, request: Request, timeout: float) -> Prediction:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return Prediction(label="positive", label_id=2, probabilities={"positive": 1.0}, truncated=False)

    def close(self) -> None:
        return None


@pytest.mark.parametrize(
    ("error", "retried"),
    [
        (ServiceError("timeout", "no answer within 1 s"), True),
        (ServiceError("unavailable", "cannot reach 127.0.0.1:1"), True),
        (ServiceError("http_507", "Worker died.", http_status=507), True),
        (ServiceError("resource_exhausted", "Worker died.", grpc_code="RESOURCE_EXHAUSTED"), True),
        (ServiceError("unknown_method", "unknown method 'x'", http_status=400), False),
    ],
)
def test_retries_only_retryable_failures(error: ServiceError, retried: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    sleeps: list[float] = []
    monkeypatch.setattr("explain_client.client.time.sleep", sleeps.append)
    client = ExplainClient("rest", retries=2)
    client._backend = backend = _FlakyBackend(error, error)
    if retried:
        assert client.predict("sentiment", TEXT).label == "positive"
        assert backend.calls == 3 and sleeps == [0.2, 0.4]
    else:
        with pytest.raises(ServiceError) as caught:
            client.predict("sentiment", TEXT)
        assert caught.value is error and backend.calls == 1 and not sleeps


def test_a_refused_token_is_not_retried_and_says_where_a_token_comes_from(monkeypatch: pytest.MonkeyPatch) -> None:
    sleeps: list[float] = []
    monkeypatch.setattr("explain_client.client.time.sleep", sleeps.append)
    monkeypatch.delenv("EXPLAIN_TOKEN", raising=False)
    monkeypatch.delenv("EXPLAIN_TOKEN_FILE", raising=False)
    refused = ServiceError("unauthorized", "Token Authorization failed", http_status=400)
    client = ExplainClient("rest", retries=2)
    client._backend = backend = _FlakyBackend(refused, refused)
    with pytest.raises(ServiceError) as caught:
        client.predict("sentiment", TEXT)
    assert backend.calls == 1 and not sleeps and caught.value.code == "unauthorized"
    assert caught.value.message.startswith("Token Authorization failed: no token was sent")
    assert "key_file.json" in caught.value.message and "--token=KEY" in caught.value.message
    backend.token = "stale"
    with pytest.raises(ServiceError) as caught:
        client.predict("sentiment", TEXT)
    assert "the token sent was refused" in caught.value.message


def test_retries_give_up_with_the_last_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("explain_client.client.time.sleep", lambda seconds: None)
    last = ServiceError("timeout", "no answer (third)")
    client = ExplainClient("grpc", retries=2, grpc_address="127.0.0.1:1")
    client._backend = backend = _FlakyBackend(ServiceError("unavailable", "down"), ServiceError("timeout", "x"), last)
    with pytest.raises(ServiceError) as caught:
        client.predict("sentiment", TEXT)
    assert caught.value is last and backend.calls == 3
    off = ExplainClient("rest", retries=0)
    off._backend = backend = _FlakyBackend(ServiceError("timeout", "x"))
    with pytest.raises(ServiceError):
        off.predict("sentiment", TEXT)
    assert backend.calls == 1
    with pytest.raises(ValueError, match="retries"):
        ExplainClient("rest", retries=-1)


def _idle_connections(client: ExplainClient) -> list[Any]:
    """The REST pool's idle connections that still hold a socket (urllib3 keeps ``None`` placeholders)."""
    queue = client._backend.pool.pool  # type: ignore[attr-defined]
    return [] if queue is None else [conn for conn in list(queue.queue) if conn is not None and conn.sock is not None]


def test_rest_connections_are_kept_alive_and_pooled(server: Server) -> None:
    with client_for(server, "rest") as client:
        pool = client._backend.pool  # type: ignore[attr-defined]
        client.predict("sentiment", TEXT)
        assert pool.num_connections == 1 and len(_idle_connections(client)) == 1
        first_socket = _idle_connections(client)[0].sock
        client.predict("sentiment", TEXT)
        assert pool.num_connections == 1 and _idle_connections(client)[0].sock is first_socket  # reused
        with pytest.raises(ServiceError):
            client.explain("sentiment", TEXT, method="no_such_method")
        # TorchServe closes the connection after an error reply; the pool connects again for the next call.
        client.predict("sentiment", TEXT)
        second_socket = _idle_connections(client)[0].sock
        assert second_socket is not first_socket
        client.predict("sentiment", TEXT)
        assert _idle_connections(client)[0].sock is second_socket and pool.num_requests == 5
        results = client.explain_many("sentiment", [TEXT] * 12, method=None)
        assert all(isinstance(result, Prediction) for result in results)
        assert 1 <= len(_idle_connections(client)) <= client.concurrency
        assert pool.num_connections <= 1 + client.concurrency
    assert not _idle_connections(client)  # closed with the client


class _OneRequestPerConnection(http.server.BaseHTTPRequestHandler):
    """Answers each connection's first request as HTTP/1.1 (so the client may keep it), then drops the connection
    without saying so, as a server or proxy closing idle keep-alive connections does."""

    protocol_version = "HTTP/1.1"
    connections = 0

    def setup(self) -> None:
        type(self).connections += 1
        super().setup()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        body = json.dumps({"label": "positive", "label_id": 2, "probabilities": {"positive": 1.0}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True

    def log_message(self, *args: Any) -> None:
        return None


def test_rest_client_reconnects_when_a_kept_connection_was_closed() -> None:
    _OneRequestPerConnection.connections = 0
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _OneRequestPerConnection)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        client = ExplainClient("rest", url=f"http://127.0.0.1:{httpd.server_address[1]}", retries=0, timeout=5)
        with client:
            for call in range(3):
                if call:  # the kept connection looks open to the client, but the server has closed it
                    assert len(_idle_connections(client)) == 1
                assert client.predict("sentiment", TEXT).label == "positive"  # retries=0: the pool reconnected
                assert _OneRequestPerConnection.connections == call + 1
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_a_connection_broken_before_the_answer_is_sent_once_more_and_nothing_else_is() -> None:
    """urllib3's part of the retrying: a request whose connection broke before any answer (the race between the
    pool's closed-connection check and the server's close) is sent once more; a timeout never is (that is the
    client's policy, with its back-off)."""
    from urllib3.exceptions import ProtocolError, ReadTimeoutError

    from explain_client.transport import _RESEND

    broken = ProtocolError("Connection aborted.", ConnectionResetError())
    again = _RESEND.increment("POST", "/predictions/m", error=broken)
    assert again.total == 0
    with pytest.raises(Exception, match="Max retries"):
        again.increment("POST", "/predictions/m", error=broken)
    timeout = ReadTimeoutError(None, "/predictions/m", "read timed out")  # type: ignore[arg-type]
    with pytest.raises(ReadTimeoutError):
        _RESEND.increment("POST", "/predictions/m", error=timeout)
