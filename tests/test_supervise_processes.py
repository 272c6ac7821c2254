"""The launchers' process mechanics (:mod:`supervise.processes`) on tiny Python children: spawning in a session of its
own with a pid file and the repository on ``PYTHONPATH``, the "already running" refusal, readiness that stops waiting
when the child exits, stopping a whole process group with SIGKILL after the grace, and a zombie seen as dead."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervise.processes import (
    REPO_ROOT,
    AlreadyRunningError,
    ExitedEarlyError,
    Launch,
    exit_description,
    group_alive,
    http_get,
    pid_alive,
    python_env,
    read_pid,
    reap,
    refuse_if_running,
    spawn,
    stop_pid_file,
    terminate,
    wait_until,
)

#: Ignores SIGTERM, starts a grandchild (same process group) that ignores it too, says so, then sleeps.
STUBBORN = (
    "import signal, subprocess, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "subprocess.Popen([sys.executable, '-c', 'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "time.sleep(60)'])\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"
)


def _launch(tmp_path: Path, code: str, name: str = "child") -> Launch:
    command = (sys.executable, "-c", code)
    return Launch(name, command, tmp_path, python_env(), tmp_path / f"{name}.log", tmp_path / f"{name}.pid")


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    """The children a test spawns; each group is killed at the end, whatever the test left."""
    processes: list[subprocess.Popen[bytes]] = []
    yield processes
    for process in processes:
        if group_alive(process.pid):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def test_spawn_in_own_session_with_pid_file_log_and_pythonpath(
    tmp_path: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    code = "import os, sys; print(os.environ['PYTHONPATH']); print('err', file=sys.stderr)"
    launch = _launch(tmp_path, code)
    process = spawn(launch)
    started.append(process)
    assert process.wait(timeout=30) == 0
    assert read_pid(tmp_path / "child.pid") == process.pid
    out, err = launch.log.read_text().splitlines()
    assert out.split(os.pathsep)[0] == str(REPO_ROOT) and err == "err", "output and errors go to the log"
    sleeper = spawn(_launch(tmp_path, "import time; time.sleep(60)", "sleeper"))
    started.append(sleeper)
    assert os.getsid(sleeper.pid) == sleeper.pid != os.getsid(0), "the child leads a session of its own"


def test_a_live_pid_file_refuses_a_second_start(tmp_path: Path, started: list[subprocess.Popen[bytes]]) -> None:
    pid_file = tmp_path / "child.pid"
    refuse_if_running([pid_file])  # no file: nothing runs
    pid_file.write_text("not a pid")
    refuse_if_running([pid_file])
    process = spawn(_launch(tmp_path, "import time; time.sleep(60)"))
    started.append(process)
    with pytest.raises(AlreadyRunningError, match=r"already runs from .*child\.pid.*make stop"):
        refuse_if_running([tmp_path / "other.pid", pid_file], "the thing")
    process.kill()
    process.wait()
    refuse_if_running([pid_file])  # a stale pid file (the process ended) does not refuse


def test_readiness_stops_waiting_when_the_child_exits(tmp_path: Path, started: list[subprocess.Popen[bytes]]) -> None:
    launch = _launch(tmp_path, "import time; time.sleep(0.5); raise SystemExit(3)", "server")
    process = spawn(launch)
    started.append(process)
    began = time.monotonic()
    with pytest.raises(ExitedEarlyError) as raised:
        wait_until(lambda: False, 60, [(process, launch)], interval=0.05)
    assert time.monotonic() - began < 20, "it did not wait for the timeout"
    assert raised.value.returncode == 3 and raised.value.name == "server"
    assert str(raised.value) == f"server exited with status 3; see {launch.log}"


def test_readiness_holds_or_times_out(tmp_path: Path, started: list[subprocess.Popen[bytes]]) -> None:
    launch = _launch(tmp_path, "import time; time.sleep(60)")
    process = spawn(launch)
    started.append(process)
    assert not wait_until(lambda: False, 0.3, [(process, launch)], interval=0.05)
    polls = iter([None, False, True])  # None: the server refuses the connection

    def condition() -> bool:
        outcome = next(polls)
        if outcome is None:
            raise ConnectionRefusedError
        return outcome

    assert wait_until(condition, 30, [(process, launch)], interval=0.01), "an OSError is 'not yet'"


def test_stop_ends_the_group_with_sigkill_after_the_grace(
    tmp_path: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    launch = _launch(tmp_path, STUBBORN)
    process = spawn(launch)
    started.append(process)
    assert wait_until(lambda: launch.log.read_text().strip() == "ready", 30, [(process, launch)], interval=0.05)
    began = time.monotonic()
    assert stop_pid_file(tmp_path / "child.pid", timeout=1.0)
    assert 1.0 <= time.monotonic() - began < 15
    assert not group_alive(process.pid), "the grandchild went with the group"
    assert process.returncode is None and reap(process.pid) is None, "terminate reaped its own child"
    assert not (tmp_path / "child.pid").exists()
    assert not stop_pid_file(tmp_path / "child.pid"), "nothing left to stop"


def test_stop_is_prompt_for_a_child_that_obeys_sigterm(tmp_path: Path, started: list[subprocess.Popen[bytes]]) -> None:
    launch = _launch(tmp_path, "import time; print('ready', flush=True); time.sleep(60)")
    process = spawn(launch)
    started.append(process)
    assert wait_until(lambda: launch.log.read_text().strip() == "ready", 30, [(process, launch)], interval=0.05)
    began = time.monotonic()
    terminate(process.pid, timeout=30)
    assert time.monotonic() - began < 10 and not pid_alive(process.pid)


def test_a_group_whose_leader_died_is_still_stopped(tmp_path: Path, started: list[subprocess.Popen[bytes]]) -> None:
    code = "import subprocess, sys; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])"
    launch = _launch(tmp_path, code)
    process = spawn(launch)
    started.append(process)
    assert process.wait(timeout=30) == 0
    assert not pid_alive(process.pid) and group_alive(process.pid), "the leader ended, its child runs on"
    assert stop_pid_file(tmp_path / "child.pid", timeout=5)
    assert not group_alive(process.pid)


def test_a_zombie_child_is_dead_and_reaping_collects_its_status(
    tmp_path: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    process = spawn(_launch(tmp_path, "raise SystemExit(3)"))
    started.append(process)
    deadline = time.monotonic() + 30
    while pid_alive(process.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(process.pid, 0)  # still there: a zombie, waiting for this process to reap it
    assert not pid_alive(process.pid), "a zombie is not a running process"
    assert reap(process.pid) == 3
    with pytest.raises(ProcessLookupError):
        os.kill(process.pid, 0)
    assert reap(process.pid) is None and reap(1) is None, "nothing to reap; not a child of this process"


def test_exit_descriptions_and_an_unanswered_get() -> None:
    assert exit_description(0) == "exited with status 0" and exit_description(2) == "exited with status 2"
    assert exit_description(-signal.SIGKILL) == "was killed by SIGKILL"
    assert exit_description(-signal.SIGTERM) == "was killed by SIGTERM"
    assert not pid_alive(0) and not pid_alive(-5)
    assert http_get("http://127.0.0.1:9/", timeout=2) == (0, b"")
