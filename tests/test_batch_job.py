"""explain-batch in this process (batch/): JSONL and Parquet over tiny models of every task, bodies equal to the
online answers, bad lines to the error file, resuming after a kill, another job's output refused."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from batch import BatchJob, ForeignOutputError, JobSpec, LoadedModel, TableColumns, open_model
from batch.cli import main
from batch.files import default_errors_path
from batch.lines import request_id
from batch.manifest import manifest_path
from batch.records_source import RecordsQuery, StoredInput
from tests.batch_support import (
    PLAIN_BODY,
    RECORD_TEXTS,
    Online,
    assert_same,
    by_custom_id,
    image_b64,
    line,
    read_jsonl,
    records_store,
    tiny_models,
    write_jsonl,
)

REPO = Path(__file__).resolve().parent.parent
TEXTS = ("the service was quick", "a slow rude waiter", "food cold not warm good", "the staff were lovely")


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return tiny_models(tmp_path_factory.mktemp("batch-models"))


@pytest.fixture(scope="module")
def models(folders: dict[str, Path]) -> dict[str, Any]:
    names = ("topics", "animals", "entities", "writer")
    return {name: open_model(name, folders[name]) for name in names}


@pytest.fixture(scope="module")
def loaded(models: dict[str, Any]) -> dict[str, LoadedModel]:
    return {name: LoadedModel(model) for name, model in models.items()}


@pytest.fixture(scope="module")
def online(loaded: dict[str, LoadedModel]) -> dict[str, Online]:
    return {name: Online(model.model) for name, model in loaded.items()}


def every_task_lines() -> list[dict[str, Any]]:
    lines = []
    for index, text in enumerate(TEXTS):
        lines.append(line(f"topics-{index}", "/predictions/topics", {"text": text, "explain": {"method": "attnlrp"}}))
        lines.append(line(f"entities-{index}", "/explanations/entities", {"text": text}))
        lines.append(line(f"writer-{index}", "/predictions/writer", {"prompt": text, "max_new_tokens": 3}))
    for index in range(3):
        lines.append(
            line(f"animals-{index}", "/predictions/animals", {"image": image_b64(index), "explain": {"method": "gae"}})
        )
    lines.append(
        line(
            "completion",
            "/v1/completions",
            {"model": "writer", "prompt": ["the service was", "good"], "max_tokens": 2, "logprobs": 1},
        )
    )
    lines.append(
        line(
            "explained-completion",
            "/v1/completions",
            {"model": "writer", "prompt": "a slow rude waiter", "max_tokens": 2, "explain": True},
        )
    )
    lines.append(
        line("chat", "/v1/chat/completions", {"model": "writer", "messages": [{"role": "user", "content": "good"}]})
    )
    return lines


def online_answer(online: dict[str, Online], item: dict[str, Any], answer_id: str) -> tuple[int, Any]:
    url, body = item["url"], item["body"]
    if url.startswith("/v1/"):
        return online[body["model"]].openai(url, body, answer_id)
    _, route, model = url.split("/")
    return online[model].rest(body, route == "explanations", answer_id)


def test_jsonl_of_every_task_answers_as_online(
    tmp_path: Path, models: dict[str, Any], loaded: dict[str, LoadedModel], online: dict[str, Online]
) -> None:
    lines = every_task_lines()
    source = write_jsonl(tmp_path / "in.jsonl", lines)
    job = BatchJob(JobSpec(source, tmp_path / "out.jsonl", tuple(models.values()), batch_size=4))
    counts = job.run(progress=False, loaded=loaded)
    written = by_custom_id(read_jsonl(tmp_path / "out.jsonl") + read_jsonl(default_errors_path(tmp_path / "out.jsonl")))
    assert set(written) == {item["custom_id"] for item in lines}
    assert counts.completed + counts.failed == len(lines) and counts.skipped == 0
    for item in lines:
        answer_id = request_id(job.manifest.fingerprint, item["custom_id"])
        status, body = online_answer(online, item, answer_id)
        out = written[item["custom_id"]]
        assert out["id"] == f"batch_req_{answer_id}" and out["error"] is None
        assert out["response"]["status_code"] == status and out["response"]["request_id"] == answer_id
        assert_same(out["response"]["body"], body, item["custom_id"])
    assert written["topics-0"]["response"]["body"]["explanation"]["method"] == "attnlrp"
    assert written["completion"]["response"]["body"]["object"] == "text_completion"
    assert len(written["completion"]["response"]["body"]["choices"]) == 2
    assert written["chat"]["response"]["status_code"] == 400  # the tiny LM has no chat template: as online


def test_bad_lines_go_to_the_error_file_and_the_job_goes_on(
    tmp_path: Path, models: dict[str, Any], loaded: dict[str, LoadedModel], online: dict[str, Online]
) -> None:
    good = [line(f"ok-{index}", "/predictions/topics", {"text": text}) for index, text in enumerate(TEXTS)]
    bad_body = line("bad-body", "/predictions/topics", {"texts": "no such field"})
    lines: list[Any] = [
        good[0],
        "{not json",
        '["a list"]',
        {"method": "POST", "url": "/predictions/topics", "body": {}},
        line("other-url", "/v1/embeddings", {"input": "x"}),
        line("no-model", "/predictions/nobody", {"text": "x"}),
        {**line("get", "/predictions/topics", {"text": "x"}), "method": "GET"},
        good[1],
        bad_body,
        line("ok-0", "/predictions/topics", {"text": "again"}),
        good[2],
        good[3],
        line("stream", "/v1/completions", {"model": "writer", "prompt": "good", "stream": True}),
        line("chat-to-classifier", "/v1/chat/completions", {"model": "topics", "messages": []}),
    ]
    source = write_jsonl(tmp_path / "in.jsonl", lines)
    output = tmp_path / "out.jsonl"
    errors_file = tmp_path / "errors" / "bad.jsonl"
    job = BatchJob(JobSpec(source, output, tuple(models.values()), errors=errors_file, batch_size=2))
    job.run(progress=False, loaded=loaded)
    answered = by_custom_id(read_jsonl(output))
    assert sorted(answered) == ["ok-0", "ok-1", "ok-2", "ok-3"]
    assert answered["ok-0"]["response"]["body"]["label"] is not None
    errors = read_jsonl(errors_file)
    codes = [
        (item["custom_id"], (item["error"] or {}).get("code"), item["response"] and item["response"]["status_code"])
        for item in errors
    ]
    expected = [
        (None, "invalid_json", None),
        (None, "invalid_line", None),
        (None, "invalid_line", None),
        ("other-url", "invalid_url", None),
        ("no-model", "model_not_found", None),
        ("get", "invalid_line", None),
        ("ok-0", "duplicate_custom_id", None),
        ("bad-body", None, 400),
        ("stream", None, 400),
        ("chat-to-classifier", None, 404),
    ]
    assert sorted(codes, key=repr) == sorted(expected, key=repr)  # answered failures come with their batch
    bad = next(item for item in errors if item["custom_id"] == "bad-body")
    bad_id = bad["response"]["request_id"]
    assert_same(bad["response"]["body"], online["topics"].rest(bad_body["body"], request_id=bad_id)[1])
    assert sorted(item["error"]["line"] for item in errors if item["error"])[:3] == [2, 3, 4]
    assert (
        main(
            [
                str(source),
                "-o",
                str(tmp_path / "cli.jsonl"),
                "--model",
                f"topics={models['topics'].path}",
                "--no-progress",
            ]
        )
        == 1
    )


def test_parquet_texts_and_images_answer_as_jsonl(
    tmp_path: Path, models: dict[str, Any], loaded: dict[str, LoadedModel], online: dict[str, Online]
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"id": ["a", "b", "c", "b"], "review": [*TEXTS[:3], "dup"]}), tmp_path / "texts.parquet")
    images = tmp_path / "images"
    images.mkdir()
    for index in range(3):
        (images / f"{index}.png").write_bytes(base64.b64decode(image_b64(index)))
    paths = ["images/0.png", str(images / "1.png"), "images/2.png", "images/missing.png"]
    pq.write_table(pa.table({"key": [10, 11, 12, 13], "path": paths}), tmp_path / "images.parquet")
    explain = {"method": "attnlrp"}
    texts = BatchJob(
        JobSpec(
            tmp_path / "texts.parquet",
            tmp_path / "texts.jsonl",
            (models["topics"],),
            TableColumns("topics", "id", text_column="review", explain=explain),
        )
    )
    texts.run(progress=False, loaded=loaded)
    pictures = BatchJob(
        JobSpec(
            tmp_path / "images.parquet",
            tmp_path / "images.jsonl",
            (models["animals"],),
            TableColumns("animals", "key", image_column="path", explain={"method": "gae"}),
        )
    )
    pictures.run(progress=False, loaded=loaded)
    written = by_custom_id(read_jsonl(tmp_path / "texts.jsonl"))
    assert sorted(written) == ["a", "b", "c"]
    for custom_id, text in zip("abc", TEXTS, strict=False):
        response = written[custom_id]["response"]
        expected = online["topics"].rest({"text": text, "explain": explain}, request_id=response["request_id"])[1]
        assert_same(response["body"], expected)
    assert read_jsonl(default_errors_path(tmp_path / "texts.jsonl"))[0]["error"]["code"] == "duplicate_custom_id"
    shown = by_custom_id(read_jsonl(tmp_path / "images.jsonl"))
    assert sorted(shown) == ["10", "11", "12"]
    for index in range(3):
        response = shown[str(10 + index)]["response"]
        document = {"image": image_b64(index), "explain": {"method": "gae"}}
        assert_same(response["body"], online["animals"].rest(document, request_id=response["request_id"])[1])
    (missing,) = read_jsonl(default_errors_path(tmp_path / "images.jsonl"))
    assert missing["custom_id"] == "13" and "cannot read image" in missing["error"]["message"]
    assert (
        texts.manifest.fingerprint
        != BatchJob(
            JobSpec(
                tmp_path / "texts.parquet",
                tmp_path / "other.jsonl",
                (models["topics"],),
                TableColumns("topics", "id", text_column="review", explain={"method": "gae"}),
            )
        ).manifest.fingerprint
    )


def test_an_archive_folder_is_served_with_its_settings(tmp_path: Path, folders: dict[str, Path]) -> None:
    archive = open_model("topics", folders["topics-archive"])
    checkpoint = open_model("topics", folders["topics"])
    assert archive.batch_size == 3 and checkpoint.batch_size == 8
    assert archive.model_dir == (folders["topics-archive"] / "model").resolve()
    assert archive.config.labels == checkpoint.config.labels
    lines = [line(f"r{index}", "/predictions/topics", {"text": text}) for index, text in enumerate(TEXTS)]
    source = write_jsonl(tmp_path / "in.jsonl", lines)
    assert (
        main(
            [
                str(source),
                "-o",
                str(tmp_path / "out.jsonl"),
                "--model",
                f"topics={folders['topics-archive']}",
                "--no-progress",
            ]
        )
        == 0
    )
    assert sorted(by_custom_id(read_jsonl(tmp_path / "out.jsonl"))) == ["r0", "r1", "r2", "r3"]


def test_another_jobs_output_is_refused(tmp_path: Path, models: dict[str, Any], loaded: dict[str, LoadedModel]) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", [line("a", "/predictions/topics", {"text": "good"})])
    output = tmp_path / "out.jsonl"
    BatchJob(JobSpec(source, output, (models["topics"],))).run(progress=False, loaded=loaded)
    before = output.read_bytes()
    renamed = open_model("entities", models["entities"].path)
    with pytest.raises(ForeignOutputError, match="output of another job"):
        BatchJob(JobSpec(source, output, (models["topics"], renamed))).run(progress=False, loaded=loaded)
    # the same name on other weights is another model version
    other = open_model("topics", models["entities"].path)
    with pytest.raises(ForeignOutputError, match="version"):
        BatchJob(JobSpec(source, output, (other,))).run(progress=False, loaded=loaded)
    assert output.read_bytes() == before
    stray = tmp_path / "stray.jsonl"
    stray.write_text('{"custom_id": "x"}\n')
    with pytest.raises(ForeignOutputError, match="no manifest"):
        BatchJob(JobSpec(source, stray, (models["topics"],))).run(progress=False, loaded=loaded)
    code = main([str(source), "-o", str(output), "--model", f"topics={models['entities'].path}", "--no-progress"])
    assert code == 2


def test_a_rerun_skips_what_was_written_and_retries_what_failed(
    tmp_path: Path, models: dict[str, Any], loaded: dict[str, LoadedModel]
) -> None:
    lines = [line(f"r{index}", "/predictions/topics", {"text": text}) for index, text in enumerate(TEXTS)]
    source = write_jsonl(tmp_path / "in.jsonl", [*lines, line("late", "/predictions/nobody", {"text": "x"})])
    output = tmp_path / "out.jsonl"
    first = BatchJob(JobSpec(source, output, (models["topics"],), batch_size=2)).run(progress=False, loaded=loaded)
    assert (first.completed, first.failed) == (4, 1)
    for torn in (output, default_errors_path(output)):  # a kill in the middle of a write leaves a torn last line
        with torn.open("a") as file:
            file.write('{"id":"batch_req_x","custom_id":"torn","resp')
    lines.append(line("new", "/predictions/topics", {"text": "the staff"}))
    write_jsonl(source, lines)
    again = BatchJob(JobSpec(source, output, (models["topics"],), batch_size=2)).run(progress=False, loaded=loaded)
    assert (again.skipped, again.completed, again.failed, again.retried) == (4, 1, 0, 1)
    assert sorted(by_custom_id(read_jsonl(output))) == ["new", "r0", "r1", "r2", "r3"]
    assert read_jsonl(default_errors_path(output)) == []


def test_a_killed_job_resumes_without_loss_or_duplicates(tmp_path: Path, folders: dict[str, Path]) -> None:
    count = 400
    lines = [
        line(f"r{index}", "/predictions/topics", {"text": f"{TEXTS[index % 4]} {index}", "explain": True})
        for index in range(count)
    ]
    source = write_jsonl(tmp_path / "in.jsonl", lines)
    output = tmp_path / "out.jsonl"
    command = [
        sys.executable,
        "-m",
        "batch",
        str(source),
        "-o",
        str(output),
        "--model",
        f"topics={folders['topics']}",
        "--batch-size",
        "2",
        "--no-progress",
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and process.poll() is None:
            if output.is_file() and output.read_bytes().count(b"\n") >= 20:
                break
            time.sleep(0.02)
        assert process.poll() is None, "the job ended before it could be killed"
        os.killpg(process.pid, signal.SIGKILL)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
    partial = output.read_bytes()
    assert 20 <= partial.count(b"\n") < count
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "already answered" in done.stdout
    answered = by_custom_id(read_jsonl(output))
    assert sorted(answered) == sorted(item["custom_id"] for item in lines)
    assert output.read_bytes().startswith(partial[: partial.rfind(b"\n") + 1])
    manifest = json.loads(manifest_path(output).read_text())
    assert manifest["models"]["topics"]["version"] == open_model("topics", folders["topics"]).version


class MemoryRecords:
    """A records store's reader over a list (what :class:`batch.records_source.RecordsReader` asks)."""

    location = "memory"

    def __init__(self, stored: list[StoredInput]) -> None:
        self.stored = stored

    def count(self, model: str, since: datetime | None, until: datetime | None) -> int:
        return len(list(self.inputs(model, since, until)))

    def inputs(self, model: str, since: datetime | None, until: datetime | None) -> Iterator[StoredInput]:
        return iter([item for item in self.stored if item.model == model])


def test_stored_inputs_are_explained_again_by_another_method(
    tmp_path: Path, models: dict[str, Any], loaded: dict[str, LoadedModel], online: dict[str, Online]
) -> None:
    version = models["topics"].served_version
    body = {"text": "the service was quick", "explain": {"method": "attnlrp"}}
    reader = MemoryRecords(
        [
            StoredInput("rec-1", "topics", version, "/predictions/topics", body),
            StoredInput("rec-2", "topics", version, "/predictions/topics", None),
            StoredInput("rec-3", "topics", "0" * 64, "/predictions/topics", body),
            StoredInput("rec-4", "entities", "x", "/predictions/entities", {"text": "x"}),
            StoredInput("rec-5", "topics", version, "/predictions/topics", {"text": "a slow rude waiter"}),
        ]
    )
    query = RecordsQuery(reader, "topics", explain={"method": "gae"})
    output = tmp_path / "again.jsonl"
    counts = BatchJob(JobSpec(None, output, (models["topics"],), records=query)).run(progress=False, loaded=loaded)
    assert (counts.total, counts.completed, counts.failed) == (4, 2, 2)
    answered = by_custom_id(read_jsonl(output))
    for record, text in (("rec-1", body["text"]), ("rec-5", "a slow rude waiter")):
        response = answered[record]["response"]
        expected = online["topics"].rest(
            {"text": text, "explain": {"method": "gae"}}, request_id=response["request_id"]
        )
        assert_same(response["body"], expected[1], record)
    errors = {item["custom_id"]: item["error"]["code"] for item in read_jsonl(default_errors_path(output))}
    assert errors == {"rec-2": "payload_not_kept", "rec-3": "version_changed"}
    default = BatchJob(
        JobSpec(None, tmp_path / "default.jsonl", (models["topics"],), records=RecordsQuery(reader, "topics"))
    )
    default.run(progress=False, loaded=loaded)
    (first, _) = read_jsonl(tmp_path / "default.jsonl")
    assert first["response"]["body"]["explanation"]["method"] == models["topics"].config.default_method
    assert (
        default.manifest.fingerprint
        != BatchJob(JobSpec(None, output, (models["topics"],), records=query)).manifest.fingerprint
    )

    assert all(item["parent"] == item["custom_id"] for item in read_jsonl(output))


def test_a_records_store_is_explained_again_and_resumed(
    tmp_path: Path,
    folders: dict[str, Path],
    models: dict[str, Any],
    loaded: dict[str, LoadedModel],
    online: dict[str, Online],
    capsys: pytest.CaptureFixture[str],
) -> None:
    from batch.records_source import StoreRecords

    url = records_store(tmp_path / "records.sqlite3", models["topics"].served_version)
    since, until = datetime(2026, 12, 1, 10, 1, tzinfo=UTC), datetime(2026, 12, 1, 10, 30, tzinfo=UTC)
    output = tmp_path / "again.jsonl"
    reader = StoreRecords.open(url)
    query = RecordsQuery(reader, "topics", since, until, {"method": "gae"})
    partial = BatchJob(JobSpec(None, output, (models["topics"],), batch_size=1, records=query))
    first = partial.run(progress=False, loaded=loaded, should_stop=lambda: True)  # stopped after its first batch
    reader.close()
    assert (first.total, first.completed) == (9, 1)
    assert sorted(by_custom_id(read_jsonl(output))) == ["good-0"]
    arguments = [
        "--from-records",
        "--store",
        url,
        "--model",
        f"topics={folders['topics']}",
        "--since",
        "2026-12-01T10:01:00Z",
        "--until",
        "2026-12-01T10:30",
        "--explain",
        '{"method": "gae"}',
        "--batch-size",
        "2",
        "-o",
        str(output),
        "--no-progress",
    ]
    assert main(arguments) == 1  # some records failed
    assert "1 already answered" in capsys.readouterr().out
    answered = by_custom_id(read_jsonl(output))
    assert sorted(answered) == [f"good-{index}" for index in range(len(RECORD_TEXTS))] + ["plain-body"]
    assert len(read_jsonl(output)) == len(RECORD_TEXTS) + 1  # none twice
    plain = answered.pop("plain-body")
    expected = online["topics"].rest({"text": PLAIN_BODY, "explain": {"method": "gae"}},
                                     request_id=plain["response"]["request_id"])[1]  # fmt: skip
    assert_same(plain["response"]["body"], expected, "plain-body")
    for index, text in enumerate(RECORD_TEXTS):
        written = answered[f"good-{index}"]
        assert written["parent"] == f"good-{index}" and written["response"]["status_code"] == 200
        request = written["response"]["request_id"]
        expected = online["topics"].rest({"text": text, "explain": {"method": "gae"}}, request_id=request)[1]
        assert_same(written["response"]["body"], expected, f"good-{index}")
        assert written["response"]["body"]["id"] == request
    errors = {item["custom_id"]: item for item in read_jsonl(default_errors_path(output))}
    assert {key: item["error"]["code"] for key, item in errors.items()} == {
        "other-version": "version_changed",
        "erased": "payload_not_kept",
        "hashed": "payload_not_kept",
        "oip-row": "unreadable_input",
    }
    assert "KServe door" in errors["oip-row"]["error"]["message"]
    assert "sha256:another" in errors["other-version"]["error"]["message"]
    assert "payload: hash" in errors["hashed"]["error"]["message"]
    assert all(item["parent"] == key for key, item in errors.items())
    assert json.loads(manifest_path(output).read_text())["options"]["store"] == reader.location
    # another method, or another window, is another job: its output is refused
    other = list(arguments)
    other[other.index("--explain") + 1] = '{"method": "attnlrp"}'
    assert main(other) == 2
    assert "output of another job" in capsys.readouterr().err


def test_a_checkpoint_folder_has_the_version_its_package_records(tmp_path: Path, folders: dict[str, Path]) -> None:
    from model_store.package import package
    from serving_core.recording import served_version

    checkpoint = open_model("topics", folders["topics"])
    packaged = package(folders["topics"], "topics", tmp_path / "packages")  # as explain-serve packages it
    assert checkpoint.served_version is not None
    assert served_version(packaged.archive) == checkpoint.served_version
    assert open_model("topics", packaged.archive).served_version == checkpoint.served_version
    assert open_model("other", folders["topics"]).served_version != checkpoint.served_version  # the name counts


def test_from_records_arguments_are_checked(
    tmp_path: Path, folders: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("EXPLAIN_RECORDS", raising=False)
    model = ["--model", f"topics={folders['topics']}"]
    source = write_jsonl(tmp_path / "in.jsonl", [line("a", "/predictions/topics", {"text": "good"})])
    store = f"sqlite://{tmp_path / 'none.sqlite3'}"
    out = ["-o", str(tmp_path / "out.jsonl"), "--no-progress"]
    cases = {
        "give no INPUT": [str(source), "--from-records", "--store", store, *model],
        "one --model": ["--from-records", "--store", store, *model, "--model", f"entities={folders['entities']}"],
        "EXPLAIN_RECORDS": ["--from-records", *model],
        "no records store at": ["--from-records", "--store", store, *model],
        "not a store URL": ["--from-records", "--store", "mysql://db", *model],
        "keeps none to read back": ["--from-records", "--store", "http://127.0.0.1:9/records", *model],
        "are for --from-records": [str(source), "--since", "2026-12-01", *model],
        "is not before": ["--from-records", "--store", store, "--since", "2026-12-02", "--until", "2026-12-01", *model],
        "give the INPUT": [*model],
    }
    for message, arguments in cases.items():
        assert main([*arguments, *out]) == 2, message
        assert message in capsys.readouterr().err
    assert not (tmp_path / "none.sqlite3").exists()
    with pytest.raises(SystemExit):
        main(["--from-records", "--since", "yesterday", *model, *out])


def test_parquet_rows_of_token_classifiers_and_causal_lms(
    tmp_path: Path, models: dict[str, Any], loaded: dict[str, LoadedModel], online: dict[str, Online]
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"id": [1, 2], "text": list(TEXTS[:2])}), tmp_path / "rows.parquet")
    for name, field, explain in (("entities", "text", {"method": "attnlrp"}), ("writer", "prompt", True)):
        output = tmp_path / f"{name}.jsonl"
        columns = TableColumns(name, "id", text_column="text", explain=explain)
        BatchJob(JobSpec(tmp_path / "rows.parquet", output, (models[name],), columns)).run(
            progress=False, loaded=loaded
        )
        written = by_custom_id(read_jsonl(output))
        assert sorted(written) == ["1", "2"]
        for custom_id, text in zip(("1", "2"), TEXTS, strict=False):
            response = written[custom_id]["response"]
            expected = online[name].rest({field: text, "explain": explain}, request_id=response["request_id"])[1]
            assert_same(response["body"], expected, f"{name} {custom_id}")
