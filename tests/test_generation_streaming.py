"""Streaming generation in the serving core, in-process: a streaming row's token events arrive while the decoding loop
is still writing (each step's event before the next step runs), their texts joined are the answer's text, their steps
its steps (log-probabilities included when asked), a stop sequence is never sent, rows of one batch stream
independently (each its own events; a row that ends early has sent everything before the others end), a row whose
deadline passes mid-stream ends with an error event keeping the text sent, and streaming changes no answer."""

from __future__ import annotations

import json
import time
from functools import partial
from typing import Any

import pytest
import torch

from explainers import Deadline, GeneratedStep, generate_continuation
from serving_core.config import HandlerConfig
from serving_core.errors import RowError
from serving_core.streaming import RowStream, json_line, read_lines
from serving_core.tasks.generation import GENERATION
from serving_core.tasks.generation_service import GenerationService
from serving_core.wire import Encoding
from tests.generation_checkpoint import PROMPTS, causal_lm

CONFIG = HandlerConfig.from_model_yaml(
    {"handler": {"task": "generation", "default_method": "grad_x_input", "max_length": 16, "max_new_tokens": 40,
                 "default_new_tokens": 3, "device": "cpu"}}
)  # fmt: skip


def _arrived(sent: list[tuple[float, Any]], event: Any) -> None:
    """Keep ``event`` with the time it arrived."""
    sent.append((time.perf_counter(), event))


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> GenerationService:
    return GenerationService(CONFIG, causal_lm(tmp_path_factory.mktemp("lm") / "model"), torch.device("cpu"))


def _serve(service: GenerationService, documents: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[list]]:
    """The documents served as one batch: each row's answer, and each streaming row's events (with the time each
    was sent), its last event included."""
    rows: list[Any] = []
    sent: list[list[tuple[float, dict[str, Any]]]] = [[] for _ in documents]
    streams: dict[int, RowStream] = {}
    for index, document in enumerate(documents):
        try:
            row = GENERATION.decode_document(document, False, CONFIG)
        except RowError as error:
            rows.append(error)
            continue
        if GENERATION.streams(row):
            stream = RowStream(partial(_arrived, sent[index]))
            streams[index] = stream
            row = GENERATION.with_listener(row, stream.listener)
        rows.append(row)
    outcomes, _ = service.run(rows, [Encoding.JSON] * len(rows))
    answers = [GENERATION.to_dict(outcome, CONFIG) for outcome in outcomes]
    for index, stream in streams.items():
        sent[index].append((time.perf_counter(), stream.final(answers[index])))
    return answers, sent


def _text(events: list[tuple[float, dict[str, Any]]]) -> str:
    return "".join(event["text"] for _, event in events if event["event"] == "token")


def test_events_join_to_the_answer_and_streaming_changes_nothing(service: GenerationService) -> None:
    document = {"prompt": PROMPTS[0], "max_new_tokens": 12, "logprobs": 2, "explain": True}
    plain = _serve(service, [document])[0][0]
    answers, sent = _serve(service, [{**document, "stream": True}])
    assert answers[0] == {
        **plain,
        "explanation": {**plain["explanation"], "seconds": answers[0]["explanation"]["seconds"]},
    }
    events = [event for _, event in sent[0]]
    assert [event["event"] for event in events[:-1]] == ["token"] * (len(events) - 1) and len(events) > 2
    last = events[-1]
    assert last["event"] == "answer" and last["text"] == plain["text"] and last["steps"] == plain["steps"]
    assert "explanation" in last
    assert _text(sent[0]) == plain["text"]
    streamed = [step for event in events[:-1] for step in event["steps"]]
    assert streamed == [{k: v for k, v in step.items() if k not in ("scores", "value")} for step in plain["steps"]]
    assert all("logprob" in step and len(step["top_logprobs"]) == 2 for step in streamed)


def test_tokens_arrive_while_the_loop_is_writing(service: GenerationService) -> None:
    """Each token event is sent before the next step's forward: the loop's ``on_step`` is what sends it."""
    forwards: list[float] = []
    model = service.model
    hook = model.register_forward_hook(lambda *_: forwards.append(time.perf_counter()))
    try:
        _, sent = _serve(service, [{"prompt": PROMPTS[1], "max_new_tokens": 30, "stream": True}])
    finally:
        hook.remove()
    tokens = [(at, event) for at, event in sent[0] if event["event"] == "token"]
    assert len(tokens) >= 5
    assert tokens[0][0] < forwards[-1] < sent[0][-1][0]  # the first token was out before the last step ran
    for at, _ in tokens[:-1]:
        assert any(forward > at for forward in forwards)


def test_rows_of_a_batch_stream_independently(service: GenerationService) -> None:
    documents = [
        {"prompt": PROMPTS[0], "max_new_tokens": 2, "stream": True},
        {"prompt": PROMPTS[1], "max_new_tokens": 30, "stream": True},
        {"prompt": PROMPTS[2], "max_new_tokens": 30},
        {"prompt": PROMPTS[2], "max_new_tokens": 30, "stream": True, "stop": "the"},
    ]
    answers, sent = _serve(service, documents)
    alone = [_serve(service, [document])[0][0] for document in documents]
    assert [answer["text"] for answer in answers] == [answer["text"] for answer in alone]
    assert sent[2] == []
    for index in (0, 1, 3):
        assert _text(sent[index]) == answers[index]["text"] and sent[index][-1][1]["event"] == "answer"
        assert sum(len(event["steps"]) for _, event in sent[index][:-1]) == len(answers[index]["steps"])
    short_done = max(at for at, event in sent[0] if event["event"] == "token")
    long_tokens = [at for at, event in sent[1] if event["event"] == "token"]
    assert short_done < long_tokens[-1]  # the short row had sent its tokens while the long one was still writing
    if answers[3]["stop_reason"] == "stop":
        assert "the" not in _text(sent[3])


def test_a_deadline_that_passes_mid_stream_ends_with_an_error_keeping_the_text(service: GenerationService) -> None:
    row = GENERATION.decode_document({"prompt": PROMPTS[1], "max_new_tokens": 40, "stream": True}, False, CONFIG)
    events: list[dict[str, Any]] = []
    stream = RowStream(events.append)
    deadline = Deadline.within(1.0)

    def listener(event: dict[str, Any]) -> None:
        stream.listener(event)
        if len(events) == 3:  # the deadline passes once three events were sent
            time.sleep(max(deadline.remaining(), 0) + 0.01)

    row = GENERATION.with_deadline(GENERATION.with_listener(row, listener), deadline)
    outcomes, _ = service.run([row], [Encoding.JSON])
    last = stream.final(GENERATION.to_dict(outcomes[0], CONFIG))
    assert last["event"] == "error" and last["error"]["code"] == "deadline_exceeded"
    assert last["text"] == "".join(event["text"] for event in events) and last["text"]


def test_on_step_sees_each_step_and_changes_nothing(service: GenerationService) -> None:
    inputs = service.tokenizer([PROMPTS[0], PROMPTS[1]], return_tensors="pt", padding=True)
    steps: list[GeneratedStep] = []
    seen = generate_continuation(service.model, inputs, [3, 6], on_step=steps.append)
    plain = generate_continuation(service.model, inputs, [3, 6])
    assert torch.equal(seen.tokens, plain.tokens) and torch.equal(seen.token_mask, plain.token_mask)
    assert len(steps) == seen.steps and [step.index for step in steps] == list(range(seen.steps))
    written = torch.stack([step.written for step in steps], dim=1)
    assert torch.equal(written, seen.token_mask)
    ended = torch.stack([step.ended for step in steps], dim=1)
    assert ended.sum(dim=1).tolist() == [1, 1]  # every row ends once, at its last step
    assert all(bool(step.ended[row]) == (index == int(seen.token_mask[row].sum()) - 1)
               for index, step in enumerate(steps) for row in range(2))  # fmt: skip


def test_json_lines_are_read_as_their_chunks_arrive() -> None:
    events: list[dict[str, Any]] = [
        {"event": "token", "text": "a\nb", "steps": []},
        {"event": "answer", "text": "a\nb"},
    ]
    data = b"".join(json_line(event) for event in events)
    chunks = [data[:5], data[5:31], data[31:]]
    assert list(read_lines(chunks)) == events
    assert json.loads(json_line(events[0])) == events[0]
