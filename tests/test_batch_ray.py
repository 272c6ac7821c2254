"""explain-batch --ray on a local two-node Ray cluster (a head and a worker started with ``ray start``): the same
lines as the local run (a file's, and a records store's re-explained), and a worker node killed mid-job costs no
line and duplicates none."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("ray.data", reason="Ray Data is not installed (make extras)")

from batch import open_model
from tests.batch_support import assert_same, by_custom_id, line, read_jsonl, records_store, write_jsonl
from tests.checkpoints import multi_label
from tests.ray_cluster import RayCluster, start_cluster

pytestmark = pytest.mark.slow

TEXTS = ("the service was quick", "a slow rude waiter", "food cold not warm good", "the staff were lovely")


@pytest.fixture(scope="module")
def cluster() -> Iterator[RayCluster]:
    running = start_cluster()
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def topics(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return multi_label(tmp_path_factory.mktemp("ray-models") / "topics")


def job(source: Path, output: Path, model: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "batch",
        str(source),
        "-o",
        str(output),
        "--model",
        f"topics={model}",
        "--batch-size",
        "2",
        "--no-progress",
        *extra,
    ]


def test_the_ray_run_writes_the_local_lines(tmp_path: Path, cluster: RayCluster, topics: Path) -> None:
    lines = [
        line(f"r{index}", "/predictions/topics", {"text": TEXTS[index % 4], "explain": {"method": "attnlrp"}})
        for index in range(12)
    ]
    source = write_jsonl(tmp_path / "in.jsonl", [*lines, "{broken", line("x", "/v1/embeddings", {})])
    local = subprocess.run(
        job(source, tmp_path / "local.jsonl", topics), env=cluster.env, capture_output=True, text=True, timeout=300
    )
    on_ray = subprocess.run(
        job(source, tmp_path / "ray.jsonl", topics, "--ray", cluster.address),
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert (local.returncode, on_ray.returncode) == (1, 1), on_ray.stderr[-3000:]
    mine, theirs = by_custom_id(read_jsonl(tmp_path / "local.jsonl")), by_custom_id(read_jsonl(tmp_path / "ray.jsonl"))
    assert list(mine) == list(theirs) == [item["custom_id"] for item in lines]  # the same lines, in input order
    for custom_id, written in mine.items():
        assert written["id"] == theirs[custom_id]["id"]
        assert_same(written["response"], theirs[custom_id]["response"], custom_id)
    assert read_jsonl(tmp_path / "ray.jsonl.errors.jsonl") == read_jsonl(tmp_path / "local.jsonl.errors.jsonl")
    rerun = subprocess.run(
        job(source, tmp_path / "ray.jsonl", topics, "--ray", cluster.address),
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "12 already answered" in rerun.stdout, rerun.stderr[-3000:]


def test_stored_predictions_are_explained_again_on_ray_as_locally(
    tmp_path: Path, cluster: RayCluster, topics: Path
) -> None:
    url = records_store(tmp_path / "records.sqlite3", open_model("topics", topics).served_version)
    arguments = ["--from-records", "--store", url, "--model", f"topics={topics}", "--since", "2026-12-01T10:01Z"]
    arguments += ["--explain", '{"method": "attnlrp"}', "--batch-size", "2", "--no-progress"]
    runs = {}
    for name, extra in (("local", []), ("ray", ["--ray", cluster.address])):
        output = tmp_path / f"{name}.jsonl"
        command = [sys.executable, "-m", "batch", "-o", str(output), *arguments, *extra]
        done = subprocess.run(command, env=cluster.env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 1, done.stderr[-3000:]  # the records it cannot explain again failed
        runs[name] = by_custom_id(read_jsonl(output))
        assert read_jsonl(output.with_name(output.name + ".errors.jsonl")) == read_jsonl(
            tmp_path / "local.jsonl.errors.jsonl"
        )
    assert list(runs["local"]) == list(runs["ray"]) == [*(f"good-{index}" for index in range(4)), "plain-body", "late"]
    for record, written in runs["local"].items():
        assert written["parent"] == runs["ray"][record]["parent"] == record
        assert_same(written["response"], runs["ray"][record]["response"], record)


def test_a_worker_node_killed_mid_job_costs_no_line(tmp_path: Path, cluster: RayCluster, topics: Path) -> None:
    count = 120
    lines = [
        line(f"r{index}", "/predictions/topics", {"text": f"{TEXTS[index % 4]} {index}", "explain": True})
        for index in range(count)
    ]
    source = write_jsonl(tmp_path / "in.jsonl", lines)
    output = tmp_path / "out.jsonl"
    driver = subprocess.Popen(
        job(source, output, topics, "--ray", cluster.address),
        env=cluster.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 240
        while not (output.is_file() and output.read_bytes().count(b"\n") >= 4):
            assert driver.poll() is None and time.monotonic() < deadline, "the job ended before the node was killed"
            time.sleep(0.05)
        assert cluster.kill_worker_node() >= 1
        written_at_kill = output.read_bytes().count(b"\n")
        stdout, stderr = driver.communicate(timeout=400)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    assert driver.returncode == 0, stderr[-3000:]
    assert written_at_kill < count
    answered = read_jsonl(output)
    assert sorted(item["custom_id"] for item in answered) == sorted(item["custom_id"] for item in lines)
    assert f"{count} answered" in stdout
