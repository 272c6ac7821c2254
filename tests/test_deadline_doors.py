"""A request's deadline as each door receives it, for every task: the OIP parameter ``explain_deadline_ms`` and the
``Explain-Deadline-Ms`` header (KServe/Ray REST, gRPC metadata), the OpenAI API's body extension and header, the
protobuf ``ExplainRequest.deadline_ms``, and the client that sends its timeout as the deadline (REST header, gRPC
field). The earlier of two deadlines wins; a malformed one is ``invalid_request``."""

from __future__ import annotations

import http.server
import json
import threading
import time
from typing import Any, ClassVar

import pytest

from doors.kserve import oip
from explain_client import ExplainClient
from explain_client.protos import explain_messages
from serving_core.config import HandlerConfig
from serving_core.deadlines import header_deadline
from serving_core.errors import RowError
from serving_core.openai_api import OpenAIError, chat_request, with_deadline_header
from serving_core.tasks.classify_schema import decode_row
from serving_core.tasks.generation_schema import decode_generation_row

TEXT = HandlerConfig(task="text", labels=("negative", "positive"))
TOKENS = HandlerConfig(task="token_classification", labels=("O", "B-PER", "I-PER"))
GENERATION = HandlerConfig(task="generation", labels=())


def _now_ms() -> int:
    return int(time.time() * 1000)


def _request(name: str, values: list[Any], **parameters: Any) -> oip.OipRequest:
    return oip.OipRequest({name: oip.Tensor(name, "BYTES", (len(values),), values)}, parameters)


def _deadline(row: Any) -> Any:
    return row.deadline if hasattr(row, "deadline") else row.request.deadline


@pytest.mark.parametrize(("config", "field"), [(TEXT, "text"), (TOKENS, "text"), (GENERATION, "prompt")])
def test_the_oip_parameter_and_the_header_give_every_row_of_every_task_its_deadline(
    config: HandlerConfig, field: str
) -> None:
    due = _now_ms() + 5000
    rows = oip.decode_request(_request(field, ["one", "two"], explain_deadline_ms=due), config)
    assert all(4 < _deadline(row).remaining() <= 5.01 for row in rows)
    sooner = header_deadline(str(_now_ms() + 2000))
    rows = oip.decode_request(_request(field, ["one"], explain_deadline_ms=due), config, sooner)
    assert _deadline(rows[0]) is sooner  # the earlier wins
    assert _deadline(oip.decode_request(_request(field, ["one"]), config)[0]) is None
    with pytest.raises(RowError, match="explain_deadline_ms' must be the Unix time") as caught:
        oip.decode_request(_request(field, ["one"], explain_deadline_ms="soon"), config)
    assert caught.value.code == "invalid_request"


def test_the_header_is_unix_milliseconds() -> None:
    assert header_deadline(None) is None and header_deadline("") is None
    assert 9 < header_deadline(f" {_now_ms() + 10_000} ".encode()).remaining() <= 10.01  # type: ignore[union-attr]
    for bad in ("soon", "-5", "1.5e12"):
        with pytest.raises(RowError, match="explain-deadline-ms header") as caught:
            header_deadline(bad)
        assert caught.value.code == "invalid_request"


def test_the_protobuf_field_and_the_json_fields() -> None:
    messages = explain_messages()
    due = _now_ms() + 5000
    text = messages.ExplainRequest(text="hi", deadline_ms=due)
    deadline = decode_row({"request": text.SerializeToString()}, False, TEXT).request.deadline
    assert deadline is not None and 4 < deadline.remaining() <= 5.01
    assert (
        decode_row({"request": messages.ExplainRequest(text="hi").SerializeToString()}, False, TEXT).request.deadline
        is None
    )
    prompt = messages.ExplainRequest(deadline_ms=due)
    prompt.generation.prompt = "hi"
    assert decode_generation_row({"request": prompt.SerializeToString()}, False, GENERATION).deadline is not None
    body = {"prompt": "hi", "deadline_ms": due + 5000, "explain": {"method": "attnlrp", "deadline_ms": due}}
    row = decode_generation_row({"body": json.dumps(body)}, False, GENERATION)
    assert row.deadline is not None and row.deadline.remaining() <= 5.01 and row.ask is not None
    assert "deadline_ms" not in row.ask.options  # read as the deadline, not passed to the method
    with pytest.raises(RowError, match="deadline_ms' must be the Unix time"):
        decode_generation_row({"body": json.dumps({"prompt": "hi", "deadline_ms": "soon"})}, False, GENERATION)


def test_the_openai_door_takes_the_body_extension_and_the_header() -> None:
    due = _now_ms() + 5000
    body = {"model": "writer", "messages": [{"role": "user", "content": "hi"}], "deadline_ms": due}
    assert all(document["deadline_ms"] == due for document in chat_request(body).documents)
    earlier = with_deadline_header(body, {"Explain-Deadline-Ms": str(due - 1000)})
    assert earlier["deadline_ms"] == due - 1000
    assert with_deadline_header(body, {"explain-deadline-ms": str(due + 1000)})["deadline_ms"] == due
    plain = {"model": "writer", "prompt": "hi"}
    assert with_deadline_header(plain, {}) is plain
    assert with_deadline_header(plain, {"EXPLAIN-DEADLINE-MS": str(due)})["deadline_ms"] == due
    with pytest.raises(OpenAIError) as refused:
        with_deadline_header(plain, {"Explain-Deadline-Ms": "tomorrow"})
    assert refused.value.status == 400


class _Recorder(http.server.BaseHTTPRequestHandler):
    """Records each request's deadline header and answers a prediction."""

    seen: ClassVar[list[str | None]] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        type(self).seen.append(self.headers.get("Explain-Deadline-Ms"))
        body = json.dumps({"label": "positive", "label_id": 1, "probabilities": {"positive": 1.0}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        return None


def test_the_client_sends_its_timeout_as_the_deadline() -> None:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}"
        with ExplainClient("rest", url=url, timeout=7.0, retries=0) as client:
            before = _now_ms()
            client.predict("m", "hello")
        sent = _Recorder.seen[-1]
        assert sent is not None and before + 6_900 <= int(sent) <= _now_ms() + 7_100
    finally:
        httpd.shutdown()
        httpd.server_close()
