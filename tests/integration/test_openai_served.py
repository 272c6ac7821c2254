"""The OpenAI API served for real: a tiny chat model (tests/chat_zoo.py's Llama, a Llama-3-style template) and the tiny
sentiment classifier behind TorchServe's router (``make serve``'s door), and the chat model on the KServe door, called
with the official ``openai`` client and with plain HTTP. Every OpenAI answer equals the REST door's answer to the same
generation document (the same tokens, log-probabilities, scores and citations), streamed or not; errors come in
OpenAI's shape with the error table's statuses and codes; plain predictions still pass through the router."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from openai import OpenAI

from doors.torchserve.config import Ports
from doors.torchserve.process import Server, start, stop
from model_store.package import Settings, package
from tests.chat_zoo import DOCUMENTS, QUESTION, SYSTEM, save_chat_model
from tests.doors_support import EXTRAS
from tests.serving_support import http_call, http_post, tiny_archives

pytestmark = pytest.mark.slow

MESSAGES = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
EXPLAIN = {"method": "attnlrp", "granularity": "word"}


@pytest.fixture(scope="module")
def archives(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("chat")
    checkpoint = save_chat_model("llama", folder / "model")
    settings = Settings(max_length=400, batch_size=8, max_batch_delay=20, max_new_tokens=32, default_new_tokens=4)
    chat = package(checkpoint, "chat", folder / "store", settings).archive  # what `make serve MODELS=chat=...` runs
    return {"chat": chat.resolve(), "sentiment": tiny_archives()["sentiment"].resolve()}


@pytest.fixture(scope="module")
def torchserve(archives: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    run_dir = tmp_path_factory.mktemp("run")
    try:
        yield start(run_dir, Path("/"), {name: str(path) for name, path in archives.items()}, Ports.free(), timeout=300)
    finally:
        stop(run_dir)


@pytest.fixture(scope="module")
def kserve(archives: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from doors.kserve import launch as launcher

    run_dir = tmp_path_factory.mktemp("kserve")
    ports = Ports.free()
    try:
        door = launcher.start("kserve", {"chat": archives["chat"]}, run_dir, ports.inference, ports.grpc_inference,
                              timeout=400, env={"OMP_NUM_THREADS": "1"})  # fmt: skip
        yield door.url
    finally:
        launcher.stop(run_dir)


def _client(server: Server, token: str | None = None) -> OpenAI:
    return OpenAI(api_key=token or server.keys["inference"], base_url=f"{server.inference_url}/v1", max_retries=0,
                  timeout=120)  # fmt: skip


def _rest(server: Server, document: dict[str, Any]) -> dict[str, Any]:
    status, answer = http_post(f"{server.inference_url}/predictions/chat", json.dumps(document).encode(),
                               server.keys["inference"], timeout=120)  # fmt: skip
    assert status == 200, answer
    return dict(answer)


def _extra(model: Any) -> dict[str, Any]:
    return dict(model.model_extra or {})


def _same_explanation(mine: dict[str, Any], rest: dict[str, Any]) -> None:
    """The OpenAI choice's explanation is the REST answer's (``seconds`` aside: each call is timed)."""
    assert {key: value for key, value in mine.items() if key not in ("seconds", "rendered_prompt", "messages",
            "documents", "documents_placement")} == {
        key: value for key, value in rest["explanation"].items() if key != "seconds"
    }  # fmt: skip
    for key in ("rendered_prompt", "messages", "documents", "documents_placement"):
        assert mine[key] == rest[key]


def test_a_chat_with_documents_equals_the_rest_answer(torchserve: Server) -> None:
    completion = _client(torchserve).chat.completions.create(
        model="chat", messages=MESSAGES, max_tokens=6, logprobs=True, top_logprobs=2,  # type: ignore[arg-type]
        extra_body={"explain": EXPLAIN, "documents": list(DOCUMENTS)},
    )  # fmt: skip
    rest = _rest(torchserve, {"messages": MESSAGES, "documents": list(DOCUMENTS), "max_new_tokens": 6, "logprobs": 2,
                              "explain": EXPLAIN})  # fmt: skip
    choice = completion.choices[0]
    assert completion.object == "chat.completion" and completion.model == "chat" and len(completion.choices) == 1
    assert choice.message.role == "assistant" and choice.message.content == rest["text"]
    assert choice.finish_reason == {"eos": "stop", "length": "length"}[rest["stop_reason"]]
    assert completion.usage is not None and completion.usage.completion_tokens == len(rest["steps"])
    assert completion.usage.prompt_tokens == len(rest["prompt_tokens"])
    assert choice.logprobs is not None and choice.logprobs.content is not None
    for entry, step in zip(choice.logprobs.content, rest["steps"], strict=True):
        assert (entry.token, entry.logprob, entry.bytes) == (step["text"], step["logprob"], step["bytes"])
        assert [top.logprob for top in entry.top_logprobs] == [top["logprob"] for top in step["top_logprobs"]]
    explanation = _extra(choice)["explanation"]
    _same_explanation(explanation, rest)
    assert explanation["sentences"] and all("documents" in sentence for sentence in explanation["sentences"])
    assert {unit["document"] for unit in explanation["context"]} >= {0, 1, 2}


def test_the_stream_is_the_same_answer_in_chunks(torchserve: Server) -> None:
    request: dict[str, Any] = {"model": "chat", "messages": MESSAGES, "max_tokens": 5, "stop": ["zz"],
                               "extra_body": {"explain": {"method": "grad_x_input"}}}  # fmt: skip
    whole = _client(torchserve).chat.completions.create(**request)
    chunks = list(
        _client(torchserve).chat.completions.create(**request, stream=True, stream_options={"include_usage": True})
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert (
        "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
        == whole.choices[0].message.content
    )
    finished = chunks[-2].choices[0]
    assert finished.finish_reason == whole.choices[0].finish_reason
    assert {k: v for k, v in _extra(finished)["explanation"].items() if k != "seconds"} == {
        k: v for k, v in _extra(whole.choices[0])["explanation"].items() if k != "seconds"
    }
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
    body = json.dumps({key: value for key, value in request.items() if key != "extra_body"} | {"stream": True})
    raw = urllib.request.Request(f"{torchserve.inference_url}/v1/chat/completions", data=body.encode(), method="POST",
                                 headers={"Authorization": f"Bearer {torchserve.keys['inference']}",
                                          "Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(raw, timeout=120) as response:
        assert response.headers["Content-Type"] == "text/event-stream"
        events = response.read().decode().split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""] and all(event.startswith("data: {") for event in events[:-2])
    assert json.loads(events[-3][len("data: ") :])["choices"][0]["finish_reason"] == whole.choices[0].finish_reason


def test_completions_several_samples_and_the_model_list(torchserve: Server) -> None:
    client = _client(torchserve)
    completion = client.completions.create(model="chat", prompt="The Eiffel Tower", max_tokens=4, n=2,
                                           temperature=0.9, seed=3, logprobs=2)  # fmt: skip
    assert completion.object == "text_completion" and [choice.index for choice in completion.choices] == [0, 1]
    for index, choice in enumerate(completion.choices):  # choice j samples with seed + j, as the REST door does
        sampling = {"do_sample": True, "temperature": 0.9, "seed": 3 + index}
        rest = _rest(
            torchserve, {"prompt": "The Eiffel Tower", "max_new_tokens": 4, "logprobs": 2, "generation": sampling}
        )
        assert choice.text == rest["text"]
        assert choice.logprobs is not None and choice.logprobs.token_logprobs == [s["logprob"] for s in rest["steps"]]
    assert [model.id for model in client.models.list()] == ["chat"]  # the classifier is not a generation model


def test_errors_come_in_openais_shape(torchserve: Server) -> None:
    client = _client(torchserve)
    with pytest.raises(openai.AuthenticationError) as denied:
        _client(torchserve, token="wrong").chat.completions.create(model="chat", messages=MESSAGES)  # type: ignore[arg-type]
    assert denied.value.status_code == 401 and denied.value.code == "unauthenticated"
    calls: list[tuple[dict[str, Any], type[Exception], int, str, str | None]] = [
        ({"model": "nope"}, openai.NotFoundError, 404, "model_not_found", "model"),
        ({"max_tokens": 999}, openai.BadRequestError, 400, "too_many_tokens", None),
        ({"extra_body": {"explain": {"method": "saliency"}}}, openai.BadRequestError, 400, "unknown_method", "explain"),
        ({"extra_body": {"documents": ["x"] * 17}}, openai.APIStatusError, 413, "too_many_documents", "documents"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, openai.BadRequestError, 400, "invalid_request",
         "tools"),
        ({"model": "sentiment"}, openai.NotFoundError, 404, "model_not_found", "model"),
    ]  # fmt: skip
    for extra, error_type, status, code, param in calls:
        arguments = {"model": "chat", "messages": MESSAGES, "max_tokens": 2, **extra}
        with pytest.raises(error_type) as raised:
            client.chat.completions.create(**arguments)
        error: Any = raised.value
        assert (error.status_code, error.code, error.param) == (status, code, param), error.body
    for path, body, token, status, code in [
        ("/v1/chat/completions", b"{not json", torchserve.keys["inference"], 400, "invalid_json"),
        ("/v1/completions", json.dumps({"model": "chat", "prompt": "a"}).encode(), None, 401, "unauthenticated"),
        ("/v1/completions", json.dumps({"model": "chat", "prompt": [1, 2]}).encode(), torchserve.keys["inference"],
         400, "invalid_request"),
        ("/v1/completions", b" " * 3_000_001, torchserve.keys["inference"], 413, "request_too_large"),
        ("/v1/completions", json.dumps({"model": "chat", "prompt": [1]}).encode(), None, 401, "unauthenticated"),
    ]:  # fmt: skip
        got, answer = http_post(f"{torchserve.inference_url}{path}", body, token)
        assert got == status and set(answer) == {"error"} and answer["error"]["code"] == code
        assert set(answer["error"]) == {"message", "type", "param", "code"}
    got, answer = http_call(urllib.request.Request(f"{torchserve.inference_url}/v1/models"), 30)
    assert (got, answer["error"]["type"]) == (401, "authentication_error")


def test_plain_predictions_pass_through_the_router(torchserve: Server) -> None:
    assert torchserve.router_pid is not None and torchserve.generation == ("chat",)
    status, answer = http_post(f"{torchserve.inference_url}/predictions/sentiment", b'{"text": "lovely day"}',
                               torchserve.keys["inference"])  # fmt: skip
    assert status == 200 and "label" in answer
    status, answer = http_post(f"{torchserve.inference_url}/predictions/sentiment", b'{"text": "x"}', "wrong")
    assert status == 400  # TorchServe's own refusal, passed unchanged outside the OpenAI API


@EXTRAS
def test_the_kserve_door_answers_as_torchserve(torchserve: Server, kserve: str) -> None:
    request: dict[str, Any] = {"model": "chat", "messages": MESSAGES, "max_tokens": 6, "logprobs": True,
                               "extra_body": {"explain": EXPLAIN, "documents": list(DOCUMENTS)}}  # fmt: skip
    ours = OpenAI(api_key="any", base_url=f"{kserve}/v1", max_retries=0, timeout=120)
    theirs = _client(torchserve).chat.completions.create(**request)
    answer = ours.chat.completions.create(**request)
    assert answer.choices[0].message.content == theirs.choices[0].message.content
    assert answer.choices[0].logprobs == theirs.choices[0].logprobs and answer.usage == theirs.usage
    mine, reference = _extra(answer.choices[0])["explanation"], _extra(theirs.choices[0])["explanation"]
    assert [s["documents"] for s in mine["sentences"]] == [s["documents"] for s in reference["sentences"]]
    for sentence, expected in zip(mine["sentences"], reference["sentences"], strict=True):
        assert sentence["scores"] == pytest.approx(expected["scores"], rel=1e-4, abs=1e-5)
    chunks = list(ours.chat.completions.create(**request, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == theirs.choices[0].message.content
    assert "explanation" in _extra(chunks[-1].choices[0])
    completion = ours.completions.create(model="chat", prompt="The Eiffel Tower", max_tokens=3)
    assert completion.choices[0].text == _rest(torchserve, {"prompt": "The Eiffel Tower", "max_new_tokens": 3})["text"]
    with pytest.raises(openai.BadRequestError) as raised:
        ours.chat.completions.create(model="chat", messages=[{"role": "robot", "content": "hi"}])  # type: ignore[misc,list-item]
    assert raised.value.code == "unknown_role"
    got, listed = http_call(urllib.request.Request(f"{kserve}/v1/models"), 30)
    assert got == 200 and [entry["id"] for entry in listed["data"]] == ["chat"] and listed["models"] == ["chat"]


@EXTRAS
def test_both_doors_answer_with_the_callers_request_id(torchserve: Server, kserve: str) -> None:
    clients = [_client(torchserve), OpenAI(api_key="any", base_url=f"{kserve}/v1", max_retries=0, timeout=120)]
    for door, client in zip(["torchserve", "kserve"], clients, strict=True):
        request_id = f"oa-{door}"
        raw = client.completions.with_raw_response.create(model="chat", prompt="The Eiffel Tower", max_tokens=2, n=2,
                                                           extra_headers={"X-Request-Id": request_id})  # fmt: skip
        assert raw.headers["x-request-id"] == request_id and raw.parse().id == request_id, door
        chunks = list(client.completions.create(model="chat", prompt="The Eiffel Tower", max_tokens=2, stream=True,
                                                extra_headers={"X-Request-Id": f"{request_id}-stream"}))  # fmt: skip
        assert chunks and {chunk.id for chunk in chunks} == {f"{request_id}-stream"}, door
        made = client.completions.with_raw_response.create(model="chat", prompt="The Eiffel Tower", max_tokens=2)
        assert made.parse().id == made.headers["x-request-id"], door
