"""The OpenAI API's translation (serving_core/openai_api/), door-neutral and in-process: requests become the generation
task's JSON documents (every parameter's mapping, the refused ones named in ``param``), the generation service's
answers become OpenAI's objects — each accepted by the official ``openai`` package's own types — and errors come in
OpenAI's shape with the error table's statuses and codes. The doors' routes are tested against real servers in
tests/integration/test_openai_served.py."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
from openai.types import Completion, Model
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from serving_core.config import HandlerConfig
from serving_core.errors import ERROR_TABLE
from serving_core.openai_api import (
    OpenAIError,
    Translated,
    chat_request,
    completion_answer,
    completion_request,
    events,
    model_list,
    row_failure,
    stream_chunks,
)
from serving_core.openai_api.requests import MAX_CHOICES
from serving_core.tasks.generation_service import GenerationService
from tests.generation_checkpoint import PROMPTS, causal_lm, serve_rows

CONFIG = HandlerConfig.from_model_yaml(
    {"handler": {"task": "generation", "default_method": "grad_x_input", "max_length": 16, "max_new_tokens": 6,
                 "default_new_tokens": 3, "device": "cpu"}}
)  # fmt: skip
USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> GenerationService:
    return GenerationService(CONFIG, causal_lm(tmp_path_factory.mktemp("lm") / "model"), torch.device("cpu"))


def _refused(call: Any, body: dict[str, Any]) -> OpenAIError:
    with pytest.raises(OpenAIError) as raised:
        call(body)
    return raised.value


# -- requests -----------------------------------------------------------------------------------------------------


def test_a_chat_request_maps_onto_the_generation_document() -> None:
    translated = chat_request(
        {"model": "writer", "messages": [{"role": "developer", "content": [{"type": "text", "text": "Be "},
                                                                           {"type": "text", "text": "brief."}]},
                                         {"role": "user", "content": "When?"}],
         "max_completion_tokens": 5, "max_tokens": 9, "stop": "\n", "logprobs": True, "top_logprobs": 3,
         "temperature": 0.7, "top_p": 0.9, "top_k": 4, "seed": 11, "n": 2, "stream": True,
         "stream_options": {"include_usage": True}, "user": "ignored", "metadata": {"a": "b"}, "unknown": 1,
         "explain": {"method": "attnlrp", "granularity": "word"}, "documents": ["d1", {"title": "t", "text": "d2"}]}
    )  # fmt: skip
    assert translated.kind == "chat" and translated.model == "writer" and translated.id.startswith("chatcmpl-")
    assert translated.n == 2 and translated.prompts == 1 and translated.stream and translated.include_usage
    assert translated.logprobs == 3
    first, second = translated.documents
    assert first == {
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "When?"}],
        "max_new_tokens": 5,
        "stop": "\n",
        "logprobs": 3,
        "explain": {"method": "attnlrp", "granularity": "word"},
        "documents": ["d1", {"title": "t", "text": "d2"}],
        "generation": {"do_sample": True, "temperature": 0.7, "top_p": 0.9, "top_k": 4, "seed": 11},
    }
    assert second == {**first, "generation": {**first["generation"], "seed": 12}}  # choice j samples with seed + j
    assert translated.distinct() == ([first, second], [0, 1])


def test_sampling_greedy_by_default_and_choices_merged_only_when_greedy() -> None:
    greedy = chat_request({"model": "m", "messages": USER, "n": 3, "seed": 5, "max_tokens": 2})
    assert all("generation" not in document for document in greedy.documents)  # greedy: the seed changes nothing
    assert greedy.distinct() == ([{"messages": USER, "max_new_tokens": 2}], [0, 0, 0])
    assert chat_request({"model": "m", "messages": USER, "temperature": 0}).documents[0] == {"messages": USER}
    unseeded = chat_request({"model": "m", "messages": USER, "n": 2, "top_p": 0.5})
    assert unseeded.documents[0]["generation"] == {"do_sample": True, "temperature": 1.0, "top_p": 0.5}
    assert unseeded.distinct()[1] == [0, 1]  # two samples, not one twice
    no_logprobs = chat_request({"model": "m", "messages": USER, "logprobs": False})
    assert no_logprobs.logprobs is None and "logprobs" not in no_logprobs.documents[0]
    assert chat_request({"model": "m", "messages": USER, "logprobs": True}).logprobs == 0


def test_a_completion_request_with_several_prompts() -> None:
    translated = completion_request({"model": "m", "prompt": ["a", "b"], "n": 2, "logprobs": 2, "max_tokens": 3,
                                     "best_of": 2, "echo": False, "suffix": ""})  # fmt: skip
    assert translated.kind == "completion" and translated.id.startswith("cmpl-") and translated.prompts == 2
    assert [document["prompt"] for document in translated.documents] == ["a", "a", "b", "b"]
    assert all(document["logprobs"] == 2 and document["max_new_tokens"] == 3 for document in translated.documents)
    assert translated.distinct()[1] == [0, 0, 1, 1]
    assert completion_request({"model": "m", "prompt": "a"}).documents == ({"prompt": "a"},)


@pytest.mark.parametrize(
    ("body", "code", "param"),
    [
        ({"model": "m", "messages": USER, "tools": [{"type": "function"}]}, "invalid_request", "tools"),
        ({"model": "m", "messages": USER, "tool_choice": "auto"}, "invalid_request", "tool_choice"),
        ({"model": "m", "messages": USER, "logit_bias": {"1": 5}}, "invalid_request", "logit_bias"),
        ({"model": "m", "messages": USER, "presence_penalty": 0.5}, "invalid_request", "presence_penalty"),
        ({"model": "m", "messages": USER, "response_format": {"type": "json_object"}}, "invalid_request",
         "response_format"),
        ({"model": "m", "messages": USER, "n": 0}, "invalid_request", "n"),
        ({"model": "m", "messages": USER, "n": MAX_CHOICES + 1}, "invalid_request", "n"),
        ({"model": "m", "messages": USER, "temperature": 3}, "invalid_request", "temperature"),
        ({"model": "m", "messages": USER, "max_tokens": 0}, "invalid_request", "max_tokens"),
        ({"model": "m", "messages": USER, "top_logprobs": 2}, "invalid_request", "top_logprobs"),
        ({"model": "m", "messages": USER, "logprobs": True, "top_logprobs": 21}, "invalid_request", "top_logprobs"),
        ({"model": "m", "messages": USER, "seed": -1}, "invalid_request", "seed"),
        ({"model": "m", "messages": []}, "invalid_request", "messages"),
        ({"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "invalid_messages",
         "messages"),
        ({"model": "m", "messages": [{"role": "assistant", "content": None, "tool_calls": [{}]}]}, "invalid_messages",
         "messages"),
        ({"messages": USER}, "invalid_request", "model"),
    ],
)  # fmt: skip
def test_refused_chat_requests_name_the_parameter(body: dict[str, Any], code: str, param: str) -> None:
    error = _refused(chat_request, body)
    assert (error.code, error.param, error.status) == (code, param, 400)
    assert error.to_dict() == {"error": {"message": error.message, "type": "invalid_request_error", "param": param,
                                         "code": code}}  # fmt: skip


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "m", "prompt": [1, 2, 3]}, "prompt"),
        ({"model": "m", "prompt": "a", "echo": True}, "echo"),
        ({"model": "m", "prompt": "a", "suffix": "z"}, "suffix"),
        ({"model": "m", "prompt": "a", "best_of": 3}, "best_of"),
        ({"model": "m", "prompt": "a", "logprobs": 21}, "logprobs"),
        ({"model": "m", "prompt": ["a"] * 9, "n": 2}, "n"),
    ],
)
def test_refused_completion_requests_name_the_parameter(body: dict[str, Any], param: str) -> None:
    error = _refused(completion_request, body)
    assert (error.code, error.param) == ("invalid_request", param)


def test_errors_take_the_error_tables_status_and_openais_type() -> None:
    for code, kind in ERROR_TABLE.items():
        error = OpenAIError(code, "why")
        assert error.status == kind.http_status and error.to_dict()["error"]["code"] == code
    assert OpenAIError("unauthenticated", "x").type == "authentication_error"
    assert OpenAIError("model_not_found", "x").type == "not_found_error"
    assert OpenAIError("too_many_documents", "x").type == "invalid_request_error"
    assert OpenAIError("unavailable", "x").type == OpenAIError("internal", "x").type == "server_error"
    failure = row_failure({"error": {"code": "unknown_role", "http_status": 400, "message": "role 'robot'"}})
    assert failure is not None and (failure.code, failure.param, failure.status) == ("unknown_role", "messages", 400)
    assert row_failure({"text": "fine"}) is None
    with pytest.raises(KeyError):
        OpenAIError("no_such_code", "x")


# -- answers ------------------------------------------------------------------------------------------------------


def _served(service: GenerationService, translated: Translated) -> list[dict[str, Any]]:
    documents, index = translated.distinct()
    answers = serve_rows(service, CONFIG, [dict(document) for document in documents])
    return [answers[position] for position in index]


def test_a_completion_answer_is_openais_object_with_its_explanation(service: GenerationService) -> None:
    translated = completion_request(
        {"model": "writer", "prompt": [PROMPTS[0], PROMPTS[1]], "n": 2, "max_tokens": 4, "logprobs": 2,
         "explain": {"method": "grad_x_input", "steps": [0, -1]}}
    )  # fmt: skip
    answers = _served(service, translated)
    completion = Completion.model_validate(completion_answer(translated, answers))
    assert [choice.index for choice in completion.choices] == [0, 1, 2, 3]
    assert completion.usage is not None
    prompt_tokens = len(answers[0]["prompt_tokens"]) + len(answers[2]["prompt_tokens"])
    steps = sum(len(answer["steps"]) for answer in answers)
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (prompt_tokens, steps)
    assert completion.usage.total_tokens == prompt_tokens + steps
    for choice, answer in zip(completion.choices, answers, strict=True):
        assert choice.text == answer["text"]
        assert choice.finish_reason == {"eos": "stop", "length": "length"}[answer["stop_reason"]]
        assert choice.logprobs is not None and choice.logprobs.token_logprobs is not None
        assert choice.logprobs.token_logprobs == [step["logprob"] for step in answer["steps"]]
        assert choice.logprobs.tokens == [step["text"] for step in answer["steps"]]
        assert choice.logprobs.top_logprobs is not None and all(len(top) <= 2 for top in choice.logprobs.top_logprobs)
        explanation = (choice.model_extra or {})["explanation"]
        explained = [index for index, step in enumerate(answer["steps"]) if "scores" in step]
        assert [step["step"] for step in explanation["steps"]] == explained == answer["explanation"]["steps"]
        assert [step["scores"] for step in explanation["steps"]] == [answer["steps"][i]["scores"] for i in explained]
        assert explanation["context"] == answer["explanation"]["context"]


def test_chat_logprobs_and_the_stream(service: GenerationService) -> None:
    body = {"model": "writer", "messages": USER, "max_tokens": 3, "logprobs": True, "top_logprobs": 2,
            "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    translated = chat_request(body)
    # the tiny LM has no chat template: its answer to a prompt stands for the chat's
    documents = [{"prompt": PROMPTS[0], "max_new_tokens": 3, "logprobs": 2, "explain": {"method": "grad_x_input"}}]
    answers = serve_rows(service, CONFIG, documents)
    whole = ChatCompletion.model_validate(completion_answer(translated, answers))
    choice = whole.choices[0]
    assert choice.message.role == "assistant" and choice.message.content == answers[0]["text"]
    assert choice.logprobs is not None and choice.logprobs.content is not None
    for entry, step in zip(choice.logprobs.content, answers[0]["steps"], strict=True):
        assert (entry.token, entry.logprob, entry.bytes) == (step["text"], step["logprob"], step["bytes"])
        assert [top.logprob for top in entry.top_logprobs] == sorted(
            [top.logprob for top in entry.top_logprobs], reverse=True
        )
    chunks = stream_chunks(translated, answers)
    parsed = [ChatCompletionChunk.model_validate(chunk) for chunk in chunks]
    assert parsed[0].choices[0].delta.role == "assistant"
    assert "".join(chunk.choices[0].delta.content or "" for chunk in parsed if chunk.choices) == answers[0]["text"]
    finished = [chunk for chunk in parsed if chunk.choices and chunk.choices[0].finish_reason is not None]
    assert len(finished) == 1 and finished[0] is parsed[-2]  # the explanation comes last, before the usage
    assert (finished[0].choices[0].model_extra or {})["explanation"] == (choice.model_extra or {})["explanation"]
    assert parsed[-1].choices == [] and parsed[-1].usage == whole.usage
    assert all(chunk.id == parsed[0].id and chunk.object == "chat.completion.chunk" for chunk in parsed)
    stream = events(chunks).decode()
    assert stream.endswith("data: [DONE]\n\n") and stream.count("data: ") == len(chunks) + 1
    assert [json.loads(event[len("data: ") :]) for event in stream.split("\n\n")[:-2]] == chunks


def test_a_failed_choice_fails_the_request_and_the_model_list() -> None:
    translated = chat_request({"model": "writer", "messages": USER})
    failed = [{"error": {"code": "too_many_tokens", "http_status": 400, "message": "the prompt has 900 tokens"}}]
    for answer in (completion_answer, stream_chunks):
        with pytest.raises(OpenAIError) as raised:
            answer(translated, failed)
        assert (raised.value.code, raised.value.status) == ("too_many_tokens", 400)
    listed = model_list(["writer", "chat"], 1700000000)
    assert listed["object"] == "list"
    assert [Model.model_validate(entry).id for entry in listed["data"]] == ["writer", "chat"]


def test_torchserves_answers_become_the_error_tables() -> None:
    from doors.torchserve.openai_door import OpenAIRoutes, _upstream_answer

    def refused(status: int, body: Any) -> tuple[str, int]:
        with pytest.raises(OpenAIError) as raised:
            _upstream_answer(status, body if isinstance(body, bytes) else json.dumps(body).encode())
        return raised.value.code, raised.value.status

    token = {"code": 400, "type": "InvalidKeyException", "message": "Token Authorization failed. Token either ..."}
    assert refused(400, token) == ("unauthenticated", 401)
    assert refused(404, {"code": 404, "type": "ModelNotFoundException", "message": "Model not found"}) == (
        "model_not_found",
        404,
    )
    assert refused(503, {"code": 503, "type": "ServiceUnavailableException", "message": "queue full"}) == (
        "unavailable",
        503,
    )
    assert refused(500, b"<html>worker died</html>") == ("internal", 500)
    row = {"error": {"code": "too_many_documents", "http_status": 413, "grpc_code": "X", "message": "17 documents"}}
    assert refused(413, row) == ("too_many_documents", 413)
    assert _upstream_answer(200, b'{"task": "generation", "text": "ok"}') == {"task": "generation", "text": "ok"}
    routes = OpenAIRoutes(["writer"], lambda path, body: path, created=0)
    reply = routes.refusal("/v1/chat/completions", 413, "request body of 3000001 bytes exceeds 3000000")
    assert reply is not None and reply.status == 413
    assert isinstance(reply.body, bytes) and json.loads(reply.body)["error"]["code"] == "request_too_large"
    assert routes.refusal("/predictions/writer", 413, "too large") is None


def test_the_routers_openai_routes_without_torchserve() -> None:
    from doors.torchserve.openai_door import OpenAIRoutes

    class Down:
        def request(self, method: str, path: str, body: bytes | None, headers: Any) -> Any:
            raise ConnectionRefusedError("nothing listens")

    routes = OpenAIRoutes(["writer"], lambda path, body: path, created=0)
    body = json.dumps({"model": "writer", "messages": USER}).encode()
    reply = routes.respond("POST", "/v1/chat/completions", "Bearer t", body, Down())  # type: ignore[arg-type]
    assert reply is not None and reply.status == 503 and isinstance(reply.body, bytes)
    error = json.loads(reply.body)["error"]
    assert (error["type"], error["param"], error["code"]) == ("server_error", None, "unavailable")
    assert routes.respond("POST", "/predictions/writer", "Bearer t", body, Down()) is None  # type: ignore[arg-type]
    assert routes.respond("GET", "/v1/chat/completions", "Bearer t", b"", Down()) is None  # type: ignore[arg-type]


def test_the_routers_openai_answers_carry_the_request_id_and_send_each_choice_its_record_id() -> None:
    from doors.torchserve.openai_door import OpenAIRoutes

    sent: list[dict[str, str]] = []

    class Up:
        def request(self, method: str, path: str, body: bytes | None, headers: Any) -> Any:
            sent.append(dict(headers))
            answer = {"task": "generation", "text": "ok", "prompt_tokens": [1, 2], "steps": [], "stop_reason": "eos"}
            return type("Response", (), {"status": 200})(), json.dumps(answer).encode()

    routes = OpenAIRoutes(["writer"], lambda path, body: path, created=0)
    body = json.dumps({"model": "writer", "messages": USER, "n": 2}).encode()
    reply = routes.respond("POST", "/v1/chat/completions", "Bearer t", body, Up(), {"X-Request-Id": "oa-ts"})  # type: ignore[arg-type]
    assert reply is not None and reply.status == 200 and isinstance(reply.body, bytes)
    assert reply.headers == {"X-Request-Id": "oa-ts"} and json.loads(reply.body)["id"] == "oa-ts"
    assert sorted(headers["X-Request-Id"] for headers in sent) == ["oa-ts-0", "oa-ts-1"]  # greedy choices: each sent
    sent.clear()
    one = json.dumps({"model": "writer", "messages": USER}).encode()
    made = routes.respond("POST", "/v1/chat/completions", "Bearer t", one, Up(), {})  # type: ignore[arg-type]
    assert made is not None and isinstance(made.body, bytes)
    assert (
        [headers["X-Request-Id"] for headers in sent] == [json.loads(made.body)["id"]] == [made.headers["X-Request-Id"]]
    )
    refused = routes.respond("POST", "/v1/chat/completions", "Bearer t", one, Up(), {"X-Request-Id": "../x"})  # type: ignore[arg-type]
    assert refused is not None and refused.status == 400 and isinstance(refused.body, bytes)
    assert json.loads(refused.body)["error"]["code"] == "invalid_request"
    many = json.dumps({"model": "writer", "messages": USER, "n": 12}).encode()
    too_long = routes.respond("POST", "/v1/chat/completions", "Bearer t", many, Up(), {"X-Request-Id": "a" * 126})  # type: ignore[arg-type]
    assert too_long is not None and too_long.status == 400 and isinstance(too_long.body, bytes)
    assert "too long for 12 choices" in json.loads(too_long.body)["error"]["message"]
