"""Streams served by the real TorchServe behind its router (``make serve``'s door), over a tiny causal LM written in
the test: REST ``/predictions`` with ``"stream": true`` answers chunked JSON lines as the tokens are written (its
token events, then the answer with its explanation, which comes well after the first token), gRPC
``StreamPredictions`` the same events as messages (a call that is not a streaming request is refused with
``INVALID_ARGUMENT`` before it reaches TorchServe), the official ``openai`` client's ``stream=True`` through the
router gets the same text chunk by chunk, rows of one batch stream independently, and
``ExplainClient.generate_stream`` (the CLI's ``explain --generate``) reads the events as they come."""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import pytest
from openai import OpenAI

from doors.torchserve.config import Ports
from doors.torchserve.process import Server, start, stop
from explain_client.protos import inference_stubs
from model_store.package import Settings, package
from serving_core.streaming import read_lines
from tests.generation_checkpoint import PROMPTS, causal_lm

pytestmark = pytest.mark.slow

STREAM_RPC = "/org.pytorch.serve.grpc.inference.InferenceAPIsService/StreamPredictions"


@pytest.fixture(scope="module")
def writer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    checkpoint = causal_lm(tmp_path_factory.mktemp("lm") / "model")
    store = tmp_path_factory.mktemp("store")
    run_dir = tmp_path_factory.mktemp("run")
    settings = Settings(max_length=32, batch_size=8, max_batch_delay=50, max_new_tokens=60, default_new_tokens=4)
    package(checkpoint, "writer", store, settings)
    # a time budget of a day admits the deadline test's long explanation, which its deadline then cuts (the estimates
    # the budget rests on err high on a loaded machine, a tiny model's most of all: test_expensive_requests checks them)
    overrides = {"writer": {"handler": {"time_budget_s": 86400}}}
    try:
        yield start(run_dir, store, {"writer": "writer"}, Ports.free(), timeout=240, overrides=overrides)
    finally:
        stop(run_dir)


def _stream(server: Server, document: dict[str, Any]) -> tuple[int, str, list[tuple[float, dict[str, Any]]]]:
    """A streaming REST call: its status, its content type, and each event with the time it arrived."""
    connection = http.client.HTTPConnection("127.0.0.1", server.ports.inference, timeout=120)
    body = json.dumps(document).encode()
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {server.keys['inference']}"}
    connection.request("POST", "/predictions/writer", body, headers)
    response = connection.getresponse()
    arrived: list[tuple[float, dict[str, Any]]] = []

    def chunks() -> Iterator[bytes]:
        while chunk := response.read1(65536):
            yield chunk

    for event in read_lines(chunks()):
        arrived.append((time.perf_counter(), event))
    connection.close()
    return response.status, str(response.getheader("Content-Type")), arrived


def _plain(server: Server, document: dict[str, Any]) -> dict[str, Any]:
    connection = http.client.HTTPConnection("127.0.0.1", server.ports.inference, timeout=120)
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {server.keys['inference']}"}
    connection.request("POST", "/predictions/writer", json.dumps(document).encode(), headers)
    answer = json.loads(connection.getresponse().read())
    connection.close()
    return dict(answer)


def test_rest_streams_json_lines_as_the_tokens_are_written(writer: Server) -> None:
    document = {"prompt": PROMPTS[1], "max_new_tokens": 40, "explain": {"method": "integrated_gradients"}}
    plain = _plain(writer, document)
    status, content_type, events = _stream(writer, {**document, "stream": True})
    assert status == 200 and content_type == "application/jsonl"
    tokens = [(at, event) for at, event in events if event["event"] == "token"]
    assert len(tokens) >= 5 and events[-1][1]["event"] == "answer" and len(events) == len(tokens) + 1
    assert "".join(event["text"] for _, event in tokens) == plain["text"] == events[-1][1]["text"]
    assert [step["token_id"] for _, event in tokens for step in event["steps"]] == [
        step["token_id"] for step in plain["steps"]
    ]
    assert events[-1][1]["explanation"]["method"] == "integrated_gradients"
    # the tokens were read while the explanation was still being computed
    assert tokens[0][0] < events[-1][0] and events[-1][0] - tokens[-1][0] > 0


def test_an_error_before_any_token_keeps_its_status(writer: Server) -> None:
    status, _, events = _stream(writer, {"prompt": PROMPTS[0], "max_new_tokens": 500, "stream": True})
    assert status == 400 and len(events) == 1 and events[0][1]["error"]["code"] == "too_many_tokens"


def test_rows_of_one_batch_stream_independently(writer: Server) -> None:
    documents = [{"prompt": PROMPTS[0], "max_new_tokens": 3, "stream": True},
                 {"prompt": PROMPTS[1], "max_new_tokens": 50, "stream": True},
                 {"prompt": PROMPTS[2], "max_new_tokens": 20}]  # fmt: skip
    with ThreadPoolExecutor(3) as pool:
        streamed = list(pool.map(lambda document: _stream(writer, document), documents[:2]))
        plain = pool.submit(_plain, writer, documents[2]).result()
    assert "text" in plain and "event" not in plain
    for (status, _, events), document in zip(streamed, documents, strict=False):
        assert status == 200 and events[-1][1]["event"] == "answer"
        expected = _plain(writer, {key: value for key, value in document.items() if key != "stream"})
        assert "".join(event.get("text", "") for _, event in events[:-1]) == expected["text"]


def test_grpc_stream_predictions_sends_the_events_as_messages(writer: Server) -> None:
    messages, _ = inference_stubs()
    channel = grpc.insecure_channel(f"127.0.0.1:{writer.ports.grpc_inference}")
    call = channel.unary_stream(STREAM_RPC, request_serializer=messages.PredictionsRequest.SerializeToString,
                                response_deserializer=messages.PredictionResponse.FromString)  # fmt: skip
    metadata = [("authorization", f"Bearer {writer.keys['inference']}")]
    document = {"prompt": PROMPTS[1], "max_new_tokens": 20}
    request = messages.PredictionsRequest(model_name="writer", input={"body": json.dumps({**document, "stream": True})
                                                                      .encode()})  # fmt: skip
    events = [json.loads(reply.prediction) for reply in call(request, metadata=metadata, timeout=120)]
    assert events[-1]["event"] == "answer" and {event["event"] for event in events[:-1]} == {"token"}
    assert "".join(event["text"] for event in events[:-1]) == _plain(writer, document)["text"]
    plain_request = messages.PredictionsRequest(model_name="writer", input={"body": json.dumps(document).encode()})
    with pytest.raises(grpc.RpcError) as refused:
        list(call(plain_request, metadata=metadata, timeout=60))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    channel.close()


def test_the_openai_client_streams_through_the_router(writer: Server) -> None:
    client = OpenAI(api_key=writer.keys["inference"], base_url=f"{writer.inference_url}/v1", max_retries=0,
                    timeout=120)  # fmt: skip
    request: dict[str, Any] = {"model": "writer", "prompt": PROMPTS[1], "max_tokens": 30, "logprobs": 1}
    whole = client.completions.create(**request)
    chunks = list(client.completions.create(**request, stream=True))
    contents = [chunk for chunk in chunks if chunk.choices and chunk.choices[0].text]
    assert len(contents) >= 3
    assert "".join(chunk.choices[0].text for chunk in contents) == whole.choices[0].text
    tokens = [token for chunk in chunks if chunk.choices and chunk.choices[0].logprobs
              for token in chunk.choices[0].logprobs.tokens]  # fmt: skip
    assert tokens == whole.choices[0].logprobs.tokens
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason


def test_the_client_streams_events(writer: Server) -> None:
    from explain_client import ExplainClient

    with ExplainClient("rest", url=writer.inference_url, token=writer.keys["inference"]) as client:
        stream = client.generate_stream("writer", PROMPTS[1], max_new_tokens=12)
        tokens = list(stream)
        answer = stream.result()
    assert len(tokens) >= 2 and "".join(token.text for token in tokens) == answer.text == stream.text
    assert [step["token_id"] for token in tokens for step in token.steps] == [step.token_id for step in answer.steps]
    with ExplainClient("grpc", grpc_address=f"127.0.0.1:{writer.ports.grpc_inference}",
                       token=writer.keys["inference"]) as client:  # fmt: skip
        over_grpc = client.generate_stream("writer", PROMPTS[1], max_new_tokens=12)
        assert "".join(token.text for token in over_grpc) == answer.text and over_grpc.result().text == answer.text


def _seconds(call: Callable[[], object]) -> float:
    """How long ``call`` took, in seconds."""
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def test_a_deadline_that_passes_after_the_first_tokens_ends_with_an_error_event(writer: Server) -> None:
    """The answer is written in well under its deadline, its explanation (integrated gradients, one path point at a
    time, over every step) is not: its tokens come, then an error event with the text they carried."""
    document: dict[str, Any] = {"prompt": PROMPTS[1], "max_new_tokens": 40, "stream": True}
    written = min(_seconds(lambda: _stream(writer, document)) for _ in range(2))  # the first call may be a cold one
    # 512 path points one at a time for each of the 40 steps: some 50 times the (warm) writing on a quiet machine
    explain = {"method": "integrated_gradients", "n_steps": 512, "internal_batch_size": 1}
    due = int((time.time() + 3 * written + 0.5) * 1000)
    status, _, events = _stream(writer, {**document, "explain": explain, "deadline_ms": due})
    last = {key: value for key, value in events[-1][1].items() if key not in ("steps", "text")}
    assert status == 200 and last["event"] == "error", f"written in {written:.2f} s: {json.dumps(last)}"
    assert events[-1][1]["error"]["code"] == "deadline_exceeded"
    tokens = [event for _, event in events[:-1]]
    assert tokens and events[-1][1]["text"] == "".join(event["text"] for event in tokens)
