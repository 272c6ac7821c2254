"""The client's side of chats, words and citations, on a real answer of the serving core (a tiny Qwen2-style chat
model, in-process): the request's JSON and protobuf forms, the answer parsed identically from JSON and protobuf, the
terminal's ``[n]`` citations after each sentence, the CLI's chat options, and the HTML page in headless Chromium
(choosing a sentence colours its context and its documents by their citation scores, the cited ones outlined)."""

from __future__ import annotations

import argparse
import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from explain_client import Generation, GenerationCall
from explain_client.generation_cli import chat_messages, documents, parse_span, parse_steps, run
from explain_client.generation_render import cited_answer, generation_png, html_generation_page, terminal_generation
from explain_client.protos import explain_messages
from explain_client.render import normalise, score_rgb
from serving_core.config import HandlerConfig
from serving_core.tasks.generation_schema import decode_generation_row, encode_generation
from serving_core.tasks.generation_service import GenerationService
from serving_core.wire import Encoding
from tests.test_cli_html import run_chromium

from .chat_zoo import DOCUMENTS, QUESTION, SYSTEM, save_chat_model

ANSWER = "It was finished in 1889. It stands in Paris! Big Ben is in London."
CONFIG = HandlerConfig.from_model_yaml(
    {"handler": {"task": "generation", "max_length": 320, "max_new_tokens": 32, "device": "cpu"}}
)


@pytest.fixture(scope="module")
def answers(tmp_path_factory: pytest.TempPathFactory) -> tuple[Generation, Generation]:
    folder = save_chat_model("qwen2", tmp_path_factory.mktemp("qwen2") / "model")
    service = GenerationService(CONFIG, folder, torch.device("cpu"))
    call = GenerationCall(
        None,
        continuation=ANSWER,
        method="attnlrp",
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}],
        documents=list(DOCUMENTS),
        granularity="word",
    )
    raw = [
        {"body": json.dumps(call.to_json()).encode()},
        {"request": call.fill_message(_request()).SerializeToString()},
    ]
    rows = [decode_generation_row(row, False, CONFIG) for row in raw]
    outcomes, _ = service.run(rows, [Encoding.JSON, Encoding.PROTOBUF])
    from_json = Generation.from_dict(json.loads(encode_generation(outcomes[0])))
    response = explain_messages().ExplainResponse.FromString(encode_generation(outcomes[1]))
    return from_json, Generation.from_protobuf(response)


def _request() -> Any:
    return explain_messages().ExplainRequest()


def test_requests_carry_messages_documents_units_and_spans() -> None:
    call = GenerationCall(
        None, messages=[{"role": "user", "content": "hi"}], documents=["a", {"title": "B", "text": "b"}],
        method="attnlrp", steps="sentences", granularity="word",
    )  # fmt: skip
    document = call.to_json()
    assert document["messages"] == [{"role": "user", "content": "hi"}] and "prompt" not in document
    assert document["documents"] == ["a", {"title": "B", "text": "b"}]
    assert document["explain"] == {"method": "attnlrp", "steps": "sentences", "granularity": "word"}
    message = call.fill_message(_request()).generation
    assert [m.role for m in message.messages] == ["user"] and [d.title for d in message.documents] == ["", "B"]
    assert message.explain.sentences and message.explain.granularity == "word"
    spanned = GenerationCall("p", method="", span=(3, 9))
    assert spanned.to_json()["explain"] == {"span": {"start": 3, "end": 9}}
    assert spanned.fill_message(_request()).generation.explain.span.end == 9
    with pytest.raises(ValueError, match="not both"):
        GenerationCall("p", messages=[{"role": "user", "content": "hi"}])
    assert parse_steps("sentences") == "sentences" and parse_span("3:9") == (3, 9)


def test_the_answer_reads_the_same_from_json_and_protobuf(answers: tuple[Generation, Generation]) -> None:
    from_json, from_proto = answers
    assert from_json.granularity == from_proto.granularity == "word"
    assert from_json.context is not None and from_proto.context == from_json.context
    assert from_json.messages == from_proto.messages and from_json.documents == from_proto.documents
    assert from_json.rendered_prompt == from_proto.rendered_prompt
    assert from_json.sentences is not None and from_proto.sentences is not None
    assert [s.text for s in from_json.sentences] == ["It was finished in 1889.", "It stands in Paris!",
                                                     "Big Ben is in London."]  # fmt: skip
    for mine, theirs in zip(from_proto.sentences, from_json.sentences, strict=True):
        assert mine.scores == pytest.approx(theirs.scores, rel=1e-4, abs=1e-5)
        assert [c.document for c in mine.documents or ()] == [c.document for c in theirs.documents or ()]
    assert Generation.from_dict(from_json.to_dict()) == from_json


def test_the_terminal_and_the_cli_cite_documents_after_each_sentence(answers: tuple[Generation, Generation]) -> None:
    answer = answers[0]
    assert answer.sentences is not None
    text = terminal_generation(answer, color=False)
    cited = cited_answer(answer)
    for sentence in answer.sentences:
        marks = "".join(f" [{document + 1}]" for document in sentence.cited())
        assert sentence.text + marks in cited
        assert f"{sentence.text!r}" in text
    assert f"with citations: {cited}" in text and "documents:" in text and "[1] Eiffel Tower" in text
    assert "<|im_start|>" not in text.split("documents:")[0].split("explaining")[1]  # template units not in tops
    assert generation_png(answer).startswith(b"\x89PNG")

    class Client:
        def generate(self, model: str, prompt: Any, **kwargs: Any) -> Generation:
            calls.append({"model": model, "prompt": prompt, **kwargs})
            return answer

    calls: list[dict[str, Any]] = []
    args = argparse.Namespace(
        model="writer", text=QUESTION, chat=True, system=SYSTEM, message=["user:Which tower?", "assistant:Eiffel."],
        document=["Eiffel Tower::The Eiffel Tower was finished in 1889."], max_new_tokens=None, sample=False,
        seed=None, temperature=None, top_k=None, top_p=None, continuation=None, no_explain=False, method=None,
        steps=None, contrast=None, granularity="word", span=None, jsonl=None, html=None, png=None,
    )  # fmt: skip
    out = io.StringIO()
    assert run(args, Client(), out, color=False) == 0  # type: ignore[arg-type]
    assert calls[0]["prompt"] is None and [m["role"] for m in calls[0]["messages"]] == [
        "system", "user", "assistant", "user"
    ]  # fmt: skip
    assert calls[0]["documents"] == [{"title": "Eiffel Tower", "text": "The Eiffel Tower was finished in 1889."}]
    assert "with citations:" in out.getvalue() and "summed over their tokens" in out.getvalue()
    with pytest.raises(ValueError, match="ROLE:TEXT"):
        chat_messages(argparse.Namespace(system=None, message=["no role"], text="x"))
    assert documents(["plain"]) == ["plain"]


SENTENCE_CLICK = """<script>
document.querySelector('.sentence[data-sentence="%d"]').click();
const docs = [...document.querySelectorAll('.doc')].map(el => [getComputedStyle(el).backgroundColor,
  el.classList.contains('cited')]);
const units = [...document.querySelectorAll('.ctx .tok')].map(el => getComputedStyle(el).backgroundColor);
const pre = document.createElement('pre'); pre.id = 'state'; pre.textContent = JSON.stringify({docs, units});
document.body.appendChild(pre);
</script>"""


def _rgb(value: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", value)[:3])


def test_choosing_a_sentence_highlights_its_documents_in_chromium(
    answers: tuple[Generation, Generation], tmp_path: Path
) -> None:
    answer = answers[0]
    assert answer.sentences is not None and answer.context is not None
    page = html_generation_page([(QUESTION, answer)], "writer")
    assert "<script src" not in page and page.count('class="sentence"') == len(answer.sentences)
    for index in (0, 2):
        probe = tmp_path / f"probe{index}.html"
        probe.write_text(page.replace("</body>", (SENTENCE_CLICK % index) + "</body>"), encoding="utf-8")
        dom = run_chromium("--dump-dom", probe.as_uri())
        found = re.search(r'<pre id="state">(.*?)</pre>', dom.stdout, re.S)
        assert found, dom.stderr[-2000:]
        state = json.loads(found.group(1).replace("&quot;", '"'))
        sentence = answer.sentences[index]
        by_document = {citation.document: citation.score for citation in sentence.documents or ()}
        expected = normalise([by_document[document] for document in range(len(DOCUMENTS))])
        for (colour, cited), value, document in zip(state["docs"], expected, range(len(DOCUMENTS)), strict=True):
            assert all(abs(a - b) <= 1 for a, b in zip(_rgb(colour), score_rgb(value), strict=True))
            assert cited == (document in sentence.cited())
        units = normalise(list(sentence.scores))
        for colour, value in zip(state["units"], units, strict=False):
            assert all(abs(a - b) <= 1 for a, b in zip(_rgb(colour), score_rgb(value), strict=True))
        assert all(_rgb(colour) == (255, 255, 255) for colour in state["units"][len(units) :])


def test_the_cli_prints_a_stream_as_it_arrives(answers: tuple[Generation, Generation]) -> None:
    """``explain --generate --stream``: each token event's text is written (and flushed) as it comes, before the
    answer's rendering; an error after the first tokens keeps them and is reported."""
    from explain_client.streams import GenerationStream

    answer = answers[0].to_dict()
    written: list[str] = []

    class Out(io.StringIO):
        def flush(self) -> None:
            written.append(self.getvalue())

    def events(error: bool) -> Any:
        yield {"event": "token", "text": answer["text"][:5], "steps": []}
        yield {"event": "token", "text": answer["text"][5:], "steps": []}
        if error:
            yield {"event": "error", "error": {"code": "deadline_exceeded", "message": "late"}, "text": answer["text"]}
        else:
            yield {"event": "answer", **answer}

    class Client:
        def __init__(self, error: bool) -> None:
            self.error = error

        def generate_stream(self, model: str, prompt: Any, **kwargs: Any) -> GenerationStream:
            return GenerationStream(events(self.error))

    args = argparse.Namespace(
        model="writer", text="a prompt", chat=False, system=None, message=[], document=[], max_new_tokens=None,
        sample=False, seed=None, temperature=None, top_k=None, top_p=None, continuation=None, no_explain=False,
        method=None, steps=None, contrast=None, granularity=None, span=None, jsonl=None, html=None, png=None,
        stream=True,
    )  # fmt: skip
    out = Out()
    assert run(args, Client(False), out, color=False) == 0  # type: ignore[arg-type]
    assert written[:2] == [answer["text"][:5], answer["text"]]  # flushed token by token, before the rendering
    assert out.getvalue().startswith(answer["text"] + "\n") and "with citations:" in out.getvalue()
    failed = Out()
    assert run(args, Client(True), failed, color=False) == 1  # type: ignore[arg-type]
    assert failed.getvalue() == f"{answer['text']}\nerror: deadline_exceeded: late\n"
