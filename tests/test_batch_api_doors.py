"""The OpenAI Batch API on both doors, through the official ``openai`` client (``files.create``, ``batches.create``,
``retrieve``, ``files.content``, ``cancel``, ``list``): TorchServe through its router (``batches=True``) and the KServe
door, each serving the tiny ``sentiment`` archive and the tiny causal LM ``writer``. Each output line's body is what
the online route answers; a malformed line and a line of another ``url`` go to the error file; unknown ids are 404, a
file over the limits 413, a wrong token 401 (TorchServe); a cancelled batch keeps its finished lines; a batch
survives a restart of the door."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from batch.models import open_model
from doors.torchserve.config import Ports
from tests.batch_support import Online, assert_same, by_custom_id, line
from tests.doors_support import EXTRAS
from tests.generation_checkpoint import causal_lm
from tests.serving_support import REPO_ROOT, http_call, tiny_archives

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.slow


@dataclass
class Door:
    """A started door: its name, base URL, token, run folder, and how it is started and stopped."""

    name: str
    port: int
    token: str
    run_dir: Path
    models: dict[str, Path]

    def client(self, token: str | None = None) -> Any:
        return openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key=token or self.token, max_retries=0)


@pytest.fixture(scope="module")
def archives(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from model_store.package import package, validate

    root = tmp_path_factory.mktemp("batch-door-models")
    folder = causal_lm(root / "writer")
    writer = package(folder, "writer", root / "packages", None, validate(folder, "writer")).archive
    return {"sentiment": tiny_archives()["sentiment"], "writer": writer}


def _start(name: str, run_dir: Path, models: dict[str, Path], ports: Ports) -> Door:
    if name == "torchserve":
        from doors.torchserve.process import start

        server = start(run_dir, REPO_ROOT, {key: str(path) for key, path in models.items()}, ports, 300, batches=True)
        return Door(name, ports.inference, server.keys["inference"], run_dir, models)
    from doors.kserve import launch

    launch.start("kserve", models, run_dir, ports.inference, ports.grpc_inference, timeout=400,
                 env={"OMP_NUM_THREADS": "1"})  # fmt: skip
    return Door(name, ports.inference, "none", run_dir, models)


def _stop(door: Door) -> None:
    if door.name == "torchserve":
        from doors.torchserve.process import stop

        stop(door.run_dir)
    else:
        from doors.kserve import launch

        launch.stop(door.run_dir)


@pytest.fixture(scope="module", params=["torchserve", pytest.param("kserve", marks=EXTRAS)])
def door(
    request: pytest.FixtureRequest, archives: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Door]:
    run_dir = tmp_path_factory.mktemp(f"batch-{request.param}")
    started = _start(request.param, run_dir, archives, Ports.free())
    try:
        yield started
    finally:
        _stop(started)


def _jsonl(lines: list[Any]) -> bytes:
    return "".join((item if isinstance(item, str) else json.dumps(item)) + "\n" for item in lines).encode()


def _wait(client: Any, batch_id: str, statuses: set[str], timeout: float = 240) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        batch = client.batches.retrieve(batch_id)
        if batch.status in statuses:
            return batch
        time.sleep(0.3)
    raise AssertionError(f"batch {batch_id} is still {batch.status} after {timeout} s")


def _lines(client: Any, file_id: str | None) -> dict[str, dict[str, Any]]:
    if file_id is None:
        return {}
    return by_custom_id([json.loads(text) for text in client.files.content(file_id).text.splitlines() if text])


def _online(door: Door, model: str, body: Any, request_id: str) -> tuple[int, Any]:
    """What ``/predictions/<model>`` answers a request of id ``request_id`` (its ``X-Request-Id``): TorchServe's own
    route, or the serving core alone (KServe has no such route; its Batch API answers as TorchServe's does)."""
    if door.name == "torchserve":
        url = f"http://127.0.0.1:{door.port}/predictions/{model}"
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {door.token}",
                   "X-Request-Id": request_id}  # fmt: skip
        request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="POST")
        return http_call(request, 60.0)
    return Online(open_model(model, door.models[model])).rest(body, request_id=request_id)


def test_a_batch_of_predictions_answers_as_the_online_route(door: Door) -> None:
    client = door.client()
    texts = ["a wonderful film", "dull and long", "fine", "great acting, weak plot"]
    lines: list[Any] = [line(f"t{index}", "/predictions/sentiment", {"text": text}) for index, text in enumerate(texts)]
    lines.append(line("explained", "/predictions/sentiment", {"text": "superb", "explain": {"method": "attnlrp"}}))
    lines += ["{broken", line("elsewhere", "/explanations/sentiment", {"text": "x"}),
              line("no-text", "/predictions/sentiment", {"txt": "x"})]  # fmt: skip
    uploaded = client.files.create(file=("input.jsonl", _jsonl(lines)), purpose="batch")
    assert uploaded.object == "file" and uploaded.purpose == "batch" and uploaded.bytes == len(_jsonl(lines))
    assert client.files.retrieve(uploaded.id).id == uploaded.id
    created = client.batches.create(input_file_id=uploaded.id, endpoint="/predictions/sentiment",
                                    completion_window="24h", metadata={"run": "1"})  # fmt: skip
    assert created.status == "validating" and created.metadata == {"run": "1"}
    batch = _wait(client, created.id, {"completed", "failed"})
    assert batch.status == "completed", batch
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (8, 5, 3)
    output, errors = _lines(client, batch.output_file_id), _lines(client, batch.error_file_id)
    assert sorted(output) == ["explained", "t0", "t1", "t2", "t3"]
    for item in lines:
        if isinstance(item, dict) and item["custom_id"] in output:
            answer = output[item["custom_id"]]["response"]
            status, body = _online(door, "sentiment", item["body"], answer["request_id"])
            assert answer["status_code"] == status == 200 and answer["body"]["id"] == answer["request_id"]
            assert_same(answer["body"], body)
    assert errors["elsewhere"]["error"]["code"] == "invalid_url"
    assert [item["error"]["code"] for item in errors.values() if item["custom_id"] is None] == ["invalid_json"]
    status, body = _online(door, "sentiment", {"txt": "x"}, errors["no-text"]["response"]["request_id"])
    assert errors["no-text"]["response"]["status_code"] == status
    assert errors["no-text"]["response"]["body"]["error"]["code"] == body["error"]["code"]
    assert created.id in [item.id for item in client.batches.list(limit=100).data]


def test_a_completions_batch_answers_as_the_completions_route(door: Door) -> None:
    client = door.client()
    bodies = [{"model": "writer", "prompt": f"hello {index}", "max_tokens": 3, "temperature": 0} for index in range(2)]
    lines: list[Any] = [line(f"c{index}", "/v1/completions", body) for index, body in enumerate(bodies)]
    lines.append(line("no-model", "/v1/completions", {"model": "sentiment", "prompt": "x"}))
    uploaded = client.files.create(file=("completions.jsonl", _jsonl(lines)), purpose="batch")
    created = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/completions", completion_window="24h")
    batch = _wait(client, created.id, {"completed", "failed"})
    assert batch.status == "completed", batch
    output, errors = _lines(client, batch.output_file_id), _lines(client, batch.error_file_id)
    assert sorted(output) == ["c0", "c1"] and errors["no-model"]["error"]["code"] == "model_not_found"
    for index, body in enumerate(bodies):
        online = client.completions.create(**body).model_dump(exclude_none=True)
        answer = output[f"c{index}"]["response"]
        assert answer["status_code"] == 200 and answer["body"]["object"] == "text_completion"
        assert answer["body"]["id"] == answer["request_id"]
        assert [choice["text"] for choice in answer["body"]["choices"]] == [
            choice["text"] for choice in online["choices"]
        ]
        assert answer["body"]["usage"] == online["usage"]


def test_refusals(door: Door) -> None:
    client = door.client()
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve("file-000000000000000000000000")
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve("batch_000000000000000000000000")
    with pytest.raises(openai.NotFoundError):
        client.batches.cancel("batch_000000000000000000000000")
    with pytest.raises(openai.APIStatusError) as refused:
        client.files.content("file-..")
    assert refused.value.status_code in (400, 404)
    big = _jsonl([line(f"l{index}", "/predictions/sentiment", {"text": "x" * 100}) for index in range(30_000)])
    with pytest.raises(openai.APIStatusError) as too_large:
        client.files.create(file=("big.jsonl", big), purpose="batch")
    assert too_large.value.status_code == 413
    client = door.client()  # the refusal closed the connection (the body was not read)
    with pytest.raises(openai.BadRequestError):
        client.batches.create(input_file_id="file-000000000000000000000000"[:-1] + "x", endpoint="/v1/completions",
                              completion_window="24h")  # fmt: skip
    if door.name == "torchserve":
        with pytest.raises(openai.AuthenticationError):
            door.client("wrong-token").batches.list()


def test_a_cancelled_batch_keeps_its_finished_lines(door: Door) -> None:
    client = door.client()
    lines = [line(f"k{index}", "/predictions/sentiment", {"text": f"text {index}", "explain": {"method": "attnlrp"}})
             for index in range(200)]  # fmt: skip
    uploaded = client.files.create(file=("long.jsonl", _jsonl(lines)), purpose="batch")
    created = client.batches.create(input_file_id=uploaded.id, endpoint="/predictions/sentiment",
                                    completion_window="24h")  # fmt: skip
    _wait(client, created.id, {"in_progress"})
    cancelling = client.batches.cancel(created.id)
    assert cancelling.status in ("cancelling", "cancelled")
    batch = _wait(client, created.id, {"cancelled"})
    assert batch.cancelled_at is not None
    kept = _lines(client, batch.output_file_id)
    assert len(kept) == batch.request_counts.completed
    assert set(kept) <= {item["custom_id"] for item in lines}


def test_a_batch_survives_a_restart_of_the_door(door: Door) -> None:
    client = door.client()
    lines = [line(f"s{index}", "/predictions/sentiment", {"text": f"sample {index}", "explain": {"method": "attnlrp"}})
             for index in range(TOTAL)]  # fmt: skip
    uploaded = client.files.create(file=("restart.jsonl", _jsonl(lines)), purpose="batch")
    created = client.batches.create(input_file_id=uploaded.id, endpoint="/predictions/sentiment",
                                    completion_window="24h")  # fmt: skip
    end = time.monotonic() + 240
    while (batch := client.batches.retrieve(created.id)).request_counts.completed == 0 and time.monotonic() < end:
        time.sleep(0.1)
    _stop(door)  # mid-job: some lines answered, not all
    assert batch.status == "in_progress" and 0 < batch.request_counts.completed < TOTAL, batch
    restarted = _start(door.name, door.run_dir, door.models, Ports.free())
    door.port, door.token = restarted.port, restarted.token
    client = door.client()
    batch = _wait(client, created.id, {"completed", "failed"})
    assert batch.status == "completed", batch
    output = _lines(client, batch.output_file_id)  # by_custom_id: no line twice
    assert sorted(output) == sorted(item["custom_id"] for item in lines)
    assert batch.request_counts.completed == TOTAL and batch.request_counts.failed == 0


#: The lines of the restarted batch: enough that the door is stopped before it is done.
TOTAL = 3000


def test_the_batch_state_lives_in_the_run_folder(door: Door) -> None:
    state = door.run_dir / "batch_api"
    assert (state / "files").is_dir() and (state / "batches").is_dir()
    assert any((folder / "state.json").is_file() for folder in (state / "batches").iterdir())
