"""Streams on the KServe door's LLM routes, served for real by uvicorn in this process over a tiny causal LM (so that
the test can see the model's own forwards): the official ``openai`` client's ``stream=True`` gets its first content
chunk while the model is still writing (before its last forward), the chunks' contents join to the non-streamed
answer, ``logprobs`` come per chunk, the explanation comes in the last choice chunk before ``[DONE]``; a deadline that
passes after the first tokens ends the stream with an OpenAI ``error`` object (the client raises it) after the text
written so far; choices of one request stream independently; the generate extension (``/v2/models/{m}/generate`` and
``/generate_stream``) answers in Triton's shape, streamed as server-sent events of JSON documents. With records on
(SQLite, payload full), an OpenAI answer's ``id`` (every chunk's) is the caller's ``X-Request-Id``, echoed, and the
records are found under it (choice ``i`` of several: ``<id>-<i>``, identical greedy choices served once yet each
recorded), a streamed row's record is committed before its last event leaves, and a generate stream's events carry
the id its record has."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("kserve")

import openai
import uvicorn
from fastapi import FastAPI
from openai import OpenAI

from doors.kserve.backends import LocalBackend
from doors.kserve.generate_routes import add_generate_routes, generation_document
from doors.kserve.kserve_model import ExplainModel
from doors.kserve.openai_routes import add_openai_routes
from doors.kserve.request_ids import RequestIds
from doors.kserve.settings import ModelSettings
from records import open_store
from records.recorder import Recorder
from serving_core.config import HandlerConfig
from serving_core.errors import RowError
from tests.generation_checkpoint import PROMPTS, causal_lm

CONFIG = HandlerConfig.from_model_yaml(
    {"handler": {"task": "generation", "default_method": "grad_x_input", "max_length": 16, "max_new_tokens": 60,
                 "default_new_tokens": 3, "device": "cpu"}}
)  # fmt: skip


class _Door:
    def __init__(self, url: str, model: ExplainModel, store: str) -> None:
        self.url = url
        self.model = model
        self.forwards: list[float] = []
        self.store = store

    def record(self, record_id: str) -> dict[str, Any] | None:
        """The stored event of ``record_id`` (None: no such record)."""
        with open_store(self.store, payload="full") as store:
            stored = store.get(record_id)
        return None if stored is None else dict(stored.event)


@pytest.fixture(scope="module")
def door(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Door]:
    folder = tmp_path_factory.mktemp("lm")
    causal_lm(folder / "model")
    model = ExplainModel(LocalBackend(ModelSettings("lm", folder, CONFIG, batch_size=4, max_batch_delay=0.01)))
    model.load()
    store = f"sqlite:///{folder / 'records.sqlite3'}"
    model.recorder = Recorder.open("lm", {"store": store, "payload": "full"})
    app = FastAPI()
    add_openai_routes(app, {"lm": model})
    add_generate_routes(app, {"lm": model})
    app.add_middleware(RequestIds)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    running = _Door(f"http://127.0.0.1:{port}", model, store)
    service: Any = model.backend._service  # type: ignore[attr-defined]
    hook = service.model.register_forward_hook(lambda *_: running.forwards.append(time.perf_counter()))
    try:
        yield running
    finally:
        hook.remove()
        server.should_exit = True
        thread.join(timeout=10)
        model.stop()


def _client(door: _Door) -> OpenAI:
    return OpenAI(api_key="any", base_url=f"{door.url}/v1", max_retries=0, timeout=60)


def test_the_openai_stream_sends_tokens_as_they_are_written(door: _Door) -> None:
    request: dict[str, Any] = {"model": "lm", "prompt": PROMPTS[1], "max_tokens": 40, "logprobs": 2}
    whole = _client(door).completions.create(**request)
    door.forwards.clear()
    arrivals: list[tuple[float, Any]] = []
    for chunk in _client(door).completions.create(**request, stream=True, stream_options={"include_usage": True},
                                                  extra_body={"explain": {"method": "grad_x_input"}}):  # fmt: skip
        arrivals.append((time.perf_counter(), chunk))
    contents = [(at, chunk) for at, chunk in arrivals if chunk.choices and chunk.choices[0].text]
    assert len(contents) >= 5
    assert contents[0][0] < door.forwards[-1]  # the first token was read before the model wrote the last one
    assert "".join(chunk.choices[0].text for _, chunk in contents) == whole.choices[0].text
    tokens = [token for _, chunk in contents for token in chunk.choices[0].logprobs.tokens]
    assert tokens == whole.choices[0].logprobs.tokens
    offsets = [offset for _, chunk in contents for offset in chunk.choices[0].logprobs.text_offset]
    assert offsets == whole.choices[0].logprobs.text_offset
    finished = [chunk for _, chunk in arrivals if chunk.choices and chunk.choices[0].finish_reason is not None]
    assert len(finished) == 1 and finished[0] is arrivals[-2][1]
    assert "explanation" in (finished[0].choices[0].model_extra or {})
    assert arrivals[-1][1].usage.completion_tokens == whole.usage.completion_tokens


def test_choices_of_one_request_stream_independently(door: _Door) -> None:
    request: dict[str, Any] = {
        "model": "lm",
        "prompt": PROMPTS[0],
        "max_tokens": 20,
        "n": 2,
        "temperature": 1.0,
        "seed": 3,
    }
    whole = _client(door).completions.create(**request)
    texts = ["", ""]
    for chunk in _client(door).completions.create(**request, stream=True):
        for choice in chunk.choices:
            texts[choice.index] += choice.text
    assert texts == [choice.text for choice in whole.choices]


def test_a_deadline_after_the_first_tokens_ends_the_stream_with_an_error_object(door: _Door) -> None:
    service: Any = door.model.backend._service  # type: ignore[attr-defined]
    slow = service.model.register_forward_hook(lambda *_: time.sleep(0.05))  # 60 tokens: 3 s at least
    try:
        texts: list[str] = []
        with pytest.raises(openai.APIError) as raised:
            due = str(int((time.time() + 1.5) * 1000))  # the header is the deadline's instant, in Unix milliseconds
            for chunk in _client(door).completions.create(model="lm", prompt=PROMPTS[1], max_tokens=60, stream=True,
                                                          extra_headers={"Explain-Deadline-Ms": due}):  # fmt: skip
                texts.extend(choice.text for choice in chunk.choices)
    finally:
        slow.remove()
    assert "deadline" in str(raised.value).lower() and "".join(texts)


def test_an_error_before_the_first_chunk_is_an_http_status(door: _Door) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        list(_client(door).completions.create(model="lm", prompt=PROMPTS[0], max_tokens=500, stream=True))
    assert raised.value.status_code == 400 and raised.value.code == "too_many_tokens"


def _post(url: str, document: dict[str, Any]) -> Any:
    request = urllib.request.Request(url, json.dumps(document).encode(), {"Content-Type": "application/json"})
    return urllib.request.urlopen(request, timeout=60)


def test_the_generate_extension_answers_and_streams(door: _Door) -> None:
    request = {"text_input": PROMPTS[1], "parameters": {"max_tokens": 20, "logprobs": 1}}
    whole = json.loads(_post(f"{door.url}/v2/models/lm/generate", request).read())
    assert whole["model_name"] == "lm" and whole["text_output"] == whole["text"] and len(whole["steps"]) >= 1
    with _post(f"{door.url}/v2/models/lm/generate_stream", request) as response:
        assert response.headers["Content-Type"].startswith("text/event-stream")
        events = [json.loads(line[len(b"data: ") :]) for line in response if line.startswith(b"data: ")]
    assert [event["event"] for event in events[:-1]] == ["token"] * (len(events) - 1) and len(events) > 2
    assert "".join(event["text_output"] for event in events[:-1]) == whole["text"]
    assert events[-1]["event"] == "answer" and events[-1]["steps"] == whole["steps"]
    with pytest.raises(urllib.error.HTTPError) as refused:
        _post(f"{door.url}/v2/models/nope/generate_stream", request)
    assert refused.value.code == 404


def test_generate_requests_are_generation_documents() -> None:
    document = generation_document({"text_input": "hi", "parameters": {"max_tokens": 3, "temperature": 0.5,
                                                                       "stream": True}, "explain": True})  # fmt: skip
    assert document == {"prompt": "hi", "max_new_tokens": 3, "generation": {"temperature": 0.5}, "explain": True}
    with pytest.raises(RowError):
        generation_document({"text_input": "hi", "parameters": {"beams": 3}})


def test_openai_answers_carry_the_callers_id_and_each_choice_is_recorded(door: _Door) -> None:
    request: dict[str, Any] = {"model": "lm", "prompt": PROMPTS[0], "max_tokens": 4, "n": 2}
    raw = _client(door).completions.with_raw_response.create(**request, extra_headers={"X-Request-Id": "oa-whole"})
    whole = raw.parse()
    assert raw.headers["x-request-id"] == "oa-whole" and whole.id == "oa-whole"
    for choice in whole.choices:  # two greedy choices: served once, recorded each
        event = door.record(f"oa-whole-{choice.index}")
        assert event is not None and event["data"]["door"] == "kserve", event
        assert event["data"]["prediction"]["text"] == choice.text
        assert event["data"]["input"]["document"]["prompt"] == PROMPTS[0]
    assert door.record("oa-whole") is None
    made = _client(door).completions.with_raw_response.create(model="lm", prompt=PROMPTS[1], max_tokens=3)
    assert made.parse().id == made.headers["x-request-id"] and door.record(made.parse().id) is not None


def test_a_streamed_row_is_recorded_before_its_last_chunk(door: _Door) -> None:
    stream = _client(door).completions.create(model="lm", prompt=PROMPTS[1], max_tokens=6, stream=True,
                                              extra_headers={"X-Request-Id": "oa-stream"})  # fmt: skip
    texts: list[str] = []
    for chunk in stream:
        assert chunk.id == "oa-stream"
        texts.extend(choice.text for choice in chunk.choices)
        if chunk.choices and chunk.choices[0].finish_reason is not None:  # the last chunk: its record is there
            event = door.record("oa-stream")
            assert event is not None and event["data"]["error"] is None
            recorded = event["data"]["prediction"]["text"]
    assert recorded == "".join(texts)


def test_a_generate_stream_is_recorded_under_the_id_its_events_carry(door: _Door) -> None:
    request = {"text_input": PROMPTS[1], "parameters": {"max_tokens": 5}}
    headers = {"Content-Type": "application/json", "X-Request-Id": "gen-stream"}
    call = urllib.request.Request(f"{door.url}/v2/models/lm/generate_stream", json.dumps(request).encode(), headers)
    with urllib.request.urlopen(call, timeout=60) as response:
        assert response.headers["X-Request-Id"] == "gen-stream"
        for line in response:
            if not line.startswith(b"data: "):
                continue
            event = json.loads(line[len(b"data: ") :])
            assert event["id"] == "gen-stream"
            if event["event"] == "answer":
                stored = door.record("gen-stream")
                assert stored is not None and stored["data"]["prediction"]["text"] == event["text"]
                assert stored["data"]["input"]["document"] == {"prompt": PROMPTS[1], "max_new_tokens": 5}
    whole = json.loads(_post(f"{door.url}/v2/models/lm/generate", {**request, "id": "gen-own"}).read())
    assert whole["id"] == "gen-own" and door.record("gen-own") is not None
