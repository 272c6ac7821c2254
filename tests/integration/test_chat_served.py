"""A chat model (a tiny Llama with a Llama-3-style chat template, written in the test) served by the real
TorchServe: chats with documents over REST (plain HTTP and ``ExplainClient.chat``) and gRPC answer each sentence with
its cited documents, equal to the same checkpoint explained in-process; words and a span of the answer; the error
table's codes for bad chats, the good rows of a concurrent batch served; the CLI cites documents on both
transports."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from doors.torchserve.config import Ports
from doors.torchserve.process import Server, start, stop
from explain_client import ExplainClient, ServiceError
from explainers import explain_spans, render_chat
from explainers.tasks.continuation import given_continuation
from model_store.package import Settings, package
from tests.chat_zoo import DOCUMENTS, QUESTION, SYSTEM, save_chat_model
from tests.serving_support import http_post

pytestmark = pytest.mark.slow

ANSWER = "It was finished in 1889. It stands in Paris!"
MESSAGES = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_chat_model("llama", tmp_path_factory.mktemp("chat") / "model")


@pytest.fixture(scope="module")
def server(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    store = tmp_path_factory.mktemp("store")
    run_dir = tmp_path_factory.mktemp("run")
    settings = Settings(max_length=400, batch_size=8, max_batch_delay=20, max_new_tokens=32, default_new_tokens=4)
    packaged = package(checkpoint, "chat", store, settings)  # what `make serve MODELS=chat=PATH` runs
    assert (packaged.archive / "model" / "chat_template.jinja").is_file()
    try:
        yield start(run_dir, store, {"chat": "chat"}, Ports.free(), timeout=240)
    finally:
        stop(run_dir)


def _clients(server: Server) -> list[ExplainClient]:
    token = server.keys["inference"]
    return [
        ExplainClient("rest", url=server.inference_url, token=token),
        ExplainClient("grpc", grpc_address=f"127.0.0.1:{server.ports.grpc_inference}", token=token),
    ]


def _post(server: Server, document: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    url = f"{server.inference_url}/predictions/chat"
    status, answer = http_post(url, json.dumps(document).encode(), server.keys["inference"], timeout=120)
    assert isinstance(answer, dict), answer
    return status, answer


def test_chats_with_documents_cite_over_rest_and_grpc(server: Server, checkpoint: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(str(checkpoint), attn_implementation="eager").eval()
    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
    rendered = render_chat(tokenizer, MESSAGES, DOCUMENTS)
    answer_ids = tokenizer(ANSWER, add_special_tokens=False)["input_ids"]
    made = given_continuation(
        model, {"input_ids": torch.tensor([list(rendered.input_ids)])}, torch.tensor([answer_ids])
    )
    request = {"messages": MESSAGES, "documents": list(DOCUMENTS), "continuation": ANSWER,
               "explain": {"method": "attnlrp"}}  # fmt: skip
    status, plain = _post(server, request)
    assert status == 200, plain
    explanation = plain["explanation"]
    assert plain["rendered_prompt"] == rendered.text and plain["documents_placement"] == "system"
    assert [sentence["text"] for sentence in explanation["sentences"]] == ["It was finished in 1889.",
                                                                           "It stands in Paris!"]  # fmt: skip
    for sentence in explanation["sentences"]:
        expected = explain_spans(model, made, [[tuple(sentence["steps"])]], method="attnlrp").context_scores(0, 0)
        scale = float(expected.abs().max())
        assert sentence["scores"] == pytest.approx(expected.tolist(), rel=1e-4, abs=1e-4 * scale)
        assert [c["document"] for c in sentence["documents"]] == sorted(
            range(len(DOCUMENTS)), key=lambda d: -next(c["score"] for c in sentence["documents"] if c["document"] == d)
        )
    for client in _clients(server):
        with client:
            chat = client.chat("chat", MESSAGES, documents=list(DOCUMENTS), continuation=ANSWER, method="attnlrp")
            assert chat.granularity == "word" and chat.context is not None and chat.sentences is not None
            assert any(unit.document == 0 for unit in chat.context) and any(unit.template for unit in chat.context)
            assert next(unit.message for unit in chat.context if unit.message is not None) == 0
            for mine, theirs in zip(chat.sentences, explanation["sentences"], strict=True):
                assert [c.document for c in mine.documents or ()] == [c["document"] for c in theirs["documents"]]
                assert sum(mine.scores) == pytest.approx(sum(theirs["scores"]), rel=1e-3, abs=1e-4)
            start = ANSWER.index("Paris")
            spanned = client.generate(
                "chat", messages=MESSAGES, continuation=ANSWER, method="grad_x_input", span=(start, start + 5)
            )
            assert spanned.span is not None and spanned.span.text == "Paris" and spanned.span.documents is None
            written = client.chat("chat", MESSAGES[1:], max_new_tokens=3, granularity="sentence")
            assert written.granularity == "sentence" and written.context is not None and written.context[-1].generated


def test_bad_chats_get_their_codes_and_a_concurrent_batch_answers_the_good_rows(server: Server) -> None:
    calls: list[dict[str, Any]] = [
        {"messages": MESSAGES, "max_new_tokens": 2, "explain": {"granularity": "word"}},
        {"messages": [{"role": "robot", "content": "hi"}]},
        {"messages": MESSAGES, "documents": ["x"] * 17},
        {"messages": MESSAGES, "continuation": ANSWER, "explain": {"span": {"start": 0, "end": 999}}},
        {"messages": MESSAGES, "explain": {"granularity": "paragraph"}},
        {"messages": [{"role": "user", "content": "Paris " * 500}]},
        {"messages": MESSAGES * 33},
    ]
    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        answers = list(pool.map(lambda call: _post(server, call), calls))
    codes = [answer.get("error", {}).get("code", "ok") for _, answer in answers]
    assert codes == ["ok", "unknown_role", "too_many_documents", "invalid_target", "invalid_option",
                     "too_many_tokens", "too_many_messages"]  # fmt: skip
    assert [status for status, _ in answers] == [200, 400, 413, 400, 400, 400, 413]
    with _clients(server)[1] as grpc:
        with pytest.raises(ServiceError) as raised:
            grpc.chat("chat", [{"role": "robot", "content": "hi"}])
        assert raised.value.code == "unknown_role"


def test_the_cli_cites_documents_on_both_transports(server: Server, tmp_path: Path) -> None:
    from explain_client.cli import main

    token = server.keys["inference"]
    transports = [
        ["--url", server.inference_url],
        ["--grpc", "--grpc-address", f"127.0.0.1:{server.ports.grpc_inference}"],
    ]
    for index, transport in enumerate(transports):
        out = io.StringIO()
        html = tmp_path / f"chat{index}.html"
        arguments = [
            QUESTION, "--chat", "--system", SYSTEM, "--model", "chat", "--continuation", ANSWER, "--granularity",
            "word", f"--token={token}", "--color", "never", "--html", str(html), *transport,
        ]  # fmt: skip
        for document in DOCUMENTS:
            text = document if isinstance(document, str) else f"{document['title']}::{document['text']}"
            arguments += ["--document", text]
        status = main(arguments, stdout=out)
        assert status == 0, out.getvalue()
        printed = out.getvalue()
        assert "with citations:" in printed and "documents: [" in printed and "[1] Eiffel Tower" in printed
        assert html.read_text(encoding="utf-8").count('class="sentence"') == 2
