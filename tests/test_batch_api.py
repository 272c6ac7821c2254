"""The OpenAI Batch API's state and scheduling (batch/api.py, batch/scheduler.py), door-neutral, in this process: the
objects and refusals of every route, a batch run to ``completed`` with the bodies the online route answers, error
lines (a malformed line, another ``url``, a bad body), cancelling (finished lines kept), and a job stopped by a
restart resuming where it was, no line lost or written twice."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from batch.answers import LoadedModel
from batch.api import ApiError, BatchApi, BatchLimits, BatchStore
from batch.models import BatchModel, open_model
from batch.scheduler import BatchScheduler, OnlineTraffic, ThreadRunner, execute
from tests.batch_support import Online, assert_same, by_custom_id, line, read_jsonl, tiny_models

ENDPOINT = "/predictions/topics-archive"


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> BatchModel:
    folders = tiny_models(tmp_path_factory.mktemp("batch-api-models"))
    return open_model("topics-archive", folders["topics-archive"])


@pytest.fixture(scope="module")
def loaded(model: BatchModel) -> LoadedModel:
    return LoadedModel(model)


@pytest.fixture(scope="module")
def online(model: BatchModel) -> Online:
    return Online(model)


def multipart(data: bytes, purpose: str = "batch", filename: str = "input.jsonl") -> tuple[dict[str, str], bytes]:
    """A ``multipart/form-data`` upload as the openai client sends it: headers and body."""
    boundary = "b0undary"
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\n{purpose}\r\n'
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{filename}"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n"
        ).encode()
        + data
        + f"\r\n--{boundary}--\r\n".encode()
    )
    return {"Content-Type": f"multipart/form-data; boundary={boundary}"}, body


def call(api: BatchApi, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None) -> Any:
    """One route's answer: (status, JSON document or bytes)."""
    raw = body if isinstance(body, bytes) else json.dumps(body).encode() if body is not None else b""
    answer = api.handle(method, path, headers or {"Content-Type": "application/json"}, raw)
    if answer.content_type == "application/json":
        return answer.status, json.loads(answer.body)
    return answer.status, answer.body


def upload(api: BatchApi, lines: list[Any]) -> str:
    data = "".join((item if isinstance(item, str) else json.dumps(item)) + "\n" for item in lines).encode()
    headers, body = multipart(data)
    status, document = call(api, "POST", "/v1/files", body, headers)
    assert status == 200, document
    return str(document["id"])


def topic_lines(count: int) -> list[dict[str, Any]]:
    return [line(f"r{index}", ENDPOINT, {"text": f"review number {index} is good"}) for index in range(count)]


def run_until_done(scheduler: BatchScheduler, batch_id: str) -> dict[str, Any]:
    return scheduler.run_one(batch_id)


def test_files_are_stored_and_read_back(tmp_path: Path) -> None:
    api = BatchApi(BatchStore(tmp_path), ["topics-archive"])
    data = b'{"custom_id": "a", "method": "POST", "url": "/predictions/topics-archive", "body": {"text": "x"}}\n'
    headers, body = multipart(data)
    status, document = call(api, "POST", "/v1/files", body, headers)
    assert status == 200
    assert document["object"] == "file" and document["purpose"] == "batch" and document["bytes"] == len(data)
    assert document["filename"] == "input.jsonl" and document["id"].startswith("file-")
    assert call(api, "GET", f"/v1/files/{document['id']}") == (200, document)
    assert call(api, "GET", f"/v1/files/{document['id']}/content") == (200, data)


@pytest.mark.parametrize(
    ("method", "path", "status", "code"),
    [
        ("GET", "/v1/files/file-000000000000000000000000", 404, "file_not_found"),
        ("GET", "/v1/files/file-000000000000000000000000/content", 404, "file_not_found"),
        ("GET", "/v1/batches/batch_000000000000000000000000", 404, "batch_not_found"),
        ("POST", "/v1/batches/batch_000000000000000000000000/cancel", 404, "batch_not_found"),
        ("GET", "/v1/files/..%2F..%2Fetc%2Fpasswd", 400, "invalid_id"),
        ("GET", "/v1/files/file-..", 400, "invalid_id"),
        ("GET", "/v1/batches/..", 400, "invalid_id"),
        ("GET", "/v1/batches/batch_../content", 404, "not_found"),
    ],
)
def test_unknown_and_path_like_ids_are_refused(tmp_path: Path, method: str, path: str, status: int, code: str) -> None:
    api = BatchApi(BatchStore(tmp_path), ["topics-archive"])
    answer_status, document = call(api, method, path)
    assert answer_status == status and document["error"]["code"] == code
    assert sorted(path.name for path in tmp_path.iterdir()) == ["batches", "files"]


def test_files_over_the_limits_and_bad_uploads_are_refused(tmp_path: Path) -> None:
    api = BatchApi(BatchStore(tmp_path, BatchLimits(max_file_bytes=100, max_lines=2)), ["topics-archive"])
    for data, status, code in [
        (b"x" * 101, 413, "file_too_large"),
        (b"{}\n{}\n{}\n", 413, "too_many_lines"),
    ]:
        headers, body = multipart(data)
        answer_status, document = call(api, "POST", "/v1/files", body, headers)
        assert (answer_status, document["error"]["code"]) == (status, code)
    headers, body = multipart(b"{}\n", purpose="fine-tune")
    assert call(api, "POST", "/v1/files", body, headers)[1]["error"]["code"] == "invalid_purpose"
    assert call(api, "POST", "/v1/files", b"{}", {"Content-Type": "application/json"})[0] == 400
    assert list((tmp_path / "files").iterdir()) == []


def test_batches_are_created_listed_and_validated(tmp_path: Path) -> None:
    api = BatchApi(BatchStore(tmp_path), ["topics-archive"])
    file_id = upload(api, topic_lines(2))
    status, batch = call(
        api, "POST", "/v1/batches",
        {"input_file_id": file_id, "endpoint": ENDPOINT, "completion_window": "24h", "metadata": {"team": "a"}},
    )  # fmt: skip
    assert status == 200
    assert batch["object"] == "batch" and batch["status"] == "validating" and batch["metadata"] == {"team": "a"}
    assert batch["request_counts"] == {"total": 0, "completed": 0, "failed": 0}
    assert batch["expires_at"] == batch["created_at"] + 24 * 3600
    second = call(api, "POST", "/v1/batches", {"input_file_id": file_id, "endpoint": ENDPOINT,
                                                "completion_window": "24h"})[1]  # fmt: skip
    listed = call(api, "GET", "/v1/batches?limit=1")[1]
    assert listed["object"] == "list" and listed["has_more"] is True and len(listed["data"]) == 1
    rest = call(api, "GET", f"/v1/batches?after={listed['last_id']}")[1]
    assert {listed["data"][0]["id"], rest["data"][0]["id"]} == {batch["id"], second["id"]}
    assert rest["has_more"] is False
    refusals = [
        ({"input_file_id": "file-000000000000000000000000", "endpoint": ENDPOINT, "completion_window": "24h"}, 404),
        ({"input_file_id": file_id, "endpoint": "/v1/embeddings", "completion_window": "24h"}, 400),
        ({"input_file_id": file_id, "endpoint": "/predictions/nope", "completion_window": "24h"}, 404),
        ({"input_file_id": file_id, "endpoint": ENDPOINT, "completion_window": "1h"}, 400),
        ({"input_file_id": file_id, "endpoint": ENDPOINT, "completion_window": "24h", "metadata": {"a": 1}}, 400),
    ]
    for body, status in refusals:
        assert call(api, "POST", "/v1/batches", body)[0] == status, body


class Interrupting:
    """A runner that runs the job through a loaded model and stops the service after ``batches`` batches of lines
    (a restart mid-job), or runs it to the end."""

    def __init__(self, models: dict[str, BatchModel], loaded: dict[str, LoadedModel], batches: int | None) -> None:
        self.models, self.loaded, self.left = models, loaded, batches
        self.stopped = False

    def before_batch(self) -> None:
        if self.left is not None:
            self.left -= 1
            self.stopped = self.left < 0

    def run(self, store: BatchStore, batch_id: str, stopping: Callable[[], bool]) -> None:
        execute(store, batch_id, self.models, self.loaded, self.before_batch, lambda: self.stopped or stopping())


def test_a_batch_answers_as_the_online_route_and_keeps_its_error_lines(
    tmp_path: Path, model: BatchModel, loaded: LoadedModel, online: Online
) -> None:
    store = BatchStore(tmp_path)
    scheduler = BatchScheduler(store, ThreadRunner({model.name: model}, {model.name: loaded}, OnlineTraffic()))
    api = BatchApi(store, [model.name], scheduler.wake)
    lines: list[Any] = [
        *topic_lines(4),
        "{not json",
        line("other-url", "/explanations/topics-archive", {"text": "x"}),
        line("bad-body", ENDPOINT, {"txt": "no text field"}),
        line("explained", ENDPOINT, {"text": "a fine film", "explain": {"method": "attnlrp"}}),
    ]
    file_id = upload(api, lines)
    batch = call(api, "POST", "/v1/batches", {"input_file_id": file_id, "endpoint": ENDPOINT,
                                               "completion_window": "24h"})[1]  # fmt: skip
    done = scheduler.run_one(batch["id"])
    assert done["status"] == "completed", done
    assert done["request_counts"] == {"total": 8, "completed": 5, "failed": 3}
    assert done["in_progress_at"] and done["finalizing_at"] and done["completed_at"]
    assert call(api, "GET", f"/v1/batches/{batch['id']}")[1] == done
    output = by_custom_id(
        [json.loads(text) for text in call(api, "GET", f"/v1/files/{done['output_file_id']}/content")[1].splitlines()]
    )
    errors = by_custom_id(
        [json.loads(text) for text in call(api, "GET", f"/v1/files/{done['error_file_id']}/content")[1].splitlines()]
    )
    assert sorted(output) == ["explained", "r0", "r1", "r2", "r3"]
    for item in lines:
        if isinstance(item, dict) and item["custom_id"] in output:
            answer = output[item["custom_id"]]
            assert answer["id"] == f"batch_req_{answer['response']['request_id']}" and answer["error"] is None
            status, body = online.rest(item["body"], request_id=answer["response"]["request_id"])
            assert answer["response"]["status_code"] == status == 200
            assert answer["response"]["body"]["id"] == answer["response"]["request_id"]
            assert_same(answer["response"]["body"], body)
    assert errors["other-url"]["error"]["code"] == "invalid_url" and errors["other-url"]["response"] is None
    refused = errors["bad-body"]["response"]
    status, body = online.rest({"txt": "no text field"}, request_id=refused["request_id"])
    assert refused["status_code"] == status and refused["body"] == body and body["id"] == refused["request_id"]
    assert [item["error"]["code"] for item in errors.values() if item["custom_id"] is None] == ["invalid_json"]
    assert call(api, "GET", f"/v1/files/{done['output_file_id']}")[1]["purpose"] == "batch_output"


def test_a_cancelled_batch_keeps_its_finished_lines(tmp_path: Path, model: BatchModel, loaded: LoadedModel) -> None:
    store = BatchStore(tmp_path)
    runner = Interrupting({model.name: model}, {model.name: loaded}, None)
    scheduler = BatchScheduler(store, runner)
    api = BatchApi(store, [model.name])
    file_id = upload(api, topic_lines(9))  # batches of 3 lines (the archive's batchSize)
    batch_id = call(api, "POST", "/v1/batches", {"input_file_id": file_id, "endpoint": ENDPOINT,
                                                  "completion_window": "24h"})[1]["id"]  # fmt: skip
    original = runner.before_batch

    def cancel_after_first() -> None:
        original()
        if store.get_batch(batch_id)["request_counts"]["completed"] >= 3:
            assert call(api, "POST", f"/v1/batches/{batch_id}/cancel")[1]["status"] == "cancelling"

    runner.before_batch = cancel_after_first  # type: ignore[method-assign]
    done = scheduler.run_one(batch_id)
    assert done["status"] == "cancelled" and done["cancelling_at"] and done["cancelled_at"]
    assert done["request_counts"] == {"total": 9, "completed": 3, "failed": 0}
    kept = call(api, "GET", f"/v1/files/{done['output_file_id']}/content")[1].splitlines()
    assert sorted(json.loads(text)["custom_id"] for text in kept) == ["r0", "r1", "r2"]
    status, refusal = call(api, "POST", f"/v1/batches/{batch_id}/cancel")
    assert status == 200 and refusal["status"] == "cancelled"


def test_a_job_stopped_by_a_restart_resumes_where_it_was(
    tmp_path: Path, model: BatchModel, loaded: LoadedModel
) -> None:
    store = BatchStore(tmp_path)
    api = BatchApi(store, [model.name])
    file_id = upload(api, topic_lines(10))
    batch_id = call(api, "POST", "/v1/batches", {"input_file_id": file_id, "endpoint": ENDPOINT,
                                                  "completion_window": "24h"})[1]["id"]  # fmt: skip
    first = BatchScheduler(store, Interrupting({model.name: model}, {model.name: loaded}, 2))
    stopped = first.run_one(batch_id)
    assert stopped["status"] == "in_progress" and stopped["request_counts"]["completed"] == 6
    assert BatchStore(tmp_path).active_batches() == [batch_id]  # a new process finds it
    second = BatchScheduler(BatchStore(tmp_path), Interrupting({model.name: model}, {model.name: loaded}, None))
    done = second.run_one(batch_id)
    assert done["status"] == "completed" and done["request_counts"] == {"total": 10, "completed": 10, "failed": 0}
    lines = read_jsonl(tmp_path / "batches" / batch_id / "output.jsonl")
    assert sorted(by_custom_id(lines)) == sorted(f"r{index}" for index in range(10))


def test_an_empty_input_fails_the_batch(tmp_path: Path, model: BatchModel, loaded: LoadedModel) -> None:
    store = BatchStore(tmp_path)
    api = BatchApi(store, [model.name])
    file_id = upload(api, [""])
    batch_id = call(api, "POST", "/v1/batches", {"input_file_id": file_id, "endpoint": ENDPOINT,
                                                  "completion_window": "24h"})[1]["id"]  # fmt: skip
    BatchScheduler(store, Interrupting({model.name: model}, {model.name: loaded}, None)).run_one(batch_id)
    failed = store.get_batch(batch_id)
    assert failed["status"] == "failed" and failed["failed_at"] and failed["errors"]["data"][0]["code"] == "empty_file"


def test_the_api_error_shape_is_openais() -> None:
    assert ApiError(404, "file_not_found", "no file").to_dict() == {
        "error": {"message": "no file", "type": "invalid_request_error", "param": None, "code": "file_not_found"}
    }


def test_a_job_waits_for_online_requests_in_flight() -> None:
    traffic = OnlineTraffic()
    started = time.monotonic()
    traffic.wait_idle(quiet=0.01)
    assert time.monotonic() - started < 1.0
    traffic.started()
    started = time.monotonic()
    traffic.wait_idle(quiet=0.01, longest=0.3)  # an online request in flight: the job waits (at most ``longest``)
    assert time.monotonic() - started >= 0.3
    timer = threading.Timer(0.1, traffic.ended)
    timer.start()
    started = time.monotonic()
    traffic.wait_idle(quiet=0.01, longest=5.0)  # it ends: the job goes on
    assert time.monotonic() - started < 2.0
    timer.join()


def test_a_batch_cancelled_before_it_starts_is_cancelled(
    tmp_path: Path, model: BatchModel, loaded: LoadedModel
) -> None:
    store = BatchStore(tmp_path)
    api = BatchApi(store, [model.name])
    file_id = upload(api, topic_lines(3))
    batch_id = call(api, "POST", "/v1/batches", {"input_file_id": file_id, "endpoint": ENDPOINT,
                                                  "completion_window": "24h"})[1]["id"]  # fmt: skip
    assert call(api, "POST", f"/v1/batches/{batch_id}/cancel")[1]["status"] == "cancelling"
    done = BatchScheduler(store, Interrupting({model.name: model}, {model.name: loaded}, None)).run_one(batch_id)
    assert done["status"] == "cancelled" and done["output_file_id"] is None
    assert call(api, "POST", f"/v1/batches/{batch_id}/cancel")[1]["status"] == "cancelled"
