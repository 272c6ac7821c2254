"""Servers started by tests end with the test process, even when pytest is killed by an outer timeout (SIGKILL: no
fixture teardown, no ``finally`` runs). The mechanism is :mod:`supervise.watchdog`; the first tests check
it alone on plain processes, the last one kills a real pytest that runs tests/cleanup_probe.py (two TorchServes, one
started in-process and one by the launcher's command line in a subprocess, and a child of ``owned_popen``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from supervise.processes import group_alive, group_members
from supervise.watchdog import OWNER_ENV, owner_pid, watch
from tests.serving_support import REPO_ROOT, wait_for


def _group_members(group: int) -> list[int]:
    """Pids of the live processes whose process group is ``group`` (from /proc; zombies left out)."""
    members = group_members(group)
    assert members is not None, "these tests read /proc"
    return members


def _watchdogs_of(owner: int) -> list[int]:
    """Pids of the watchdogs guarding for ``owner``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            arguments = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"supervise.watchdog" in arguments and str(owner).encode() in arguments:
            found.append(int(entry.name))
    return found


def _sleeper() -> subprocess.Popen[bytes]:
    """A process in its own session, with a child of its own (both must end: the group is ended, not the pid)."""
    script = "import subprocess, time; subprocess.Popen(['sleep', '300']); time.sleep(300)"
    process = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    assert wait_for(lambda: len(_group_members(process.pid)) == 2, 10), "the sleeper's child did not start"
    return process


def test_owner_pid_reads_the_environment() -> None:
    assert owner_pid({OWNER_ENV: "123"}) == 123
    assert owner_pid({}) is None and owner_pid({OWNER_ENV: "x"}) is None and owner_pid({OWNER_ENV: "0"}) is None
    assert owner_pid() == os.getpid(), "conftest names this pytest process as the owner of its servers"


def test_a_killed_owner_ends_the_group_and_runs_the_command(tmp_path: Path) -> None:
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    guarded = _sleeper()
    marker = tmp_path / "command-ran"
    guard = watch(owner.pid, groups=[guarded.pid], command=["touch", str(marker)])
    try:
        time.sleep(1.5)
        assert group_alive(guarded.pid) and guard.poll() is None, "nothing happens while the owner lives"
        owner.kill()
        owner.wait()
        assert wait_for(lambda: not _group_members(guarded.pid), 20), "the guarded group outlived its owner"
        assert guard.wait(timeout=20) == 0 and marker.is_file()
    finally:
        owner.kill()
        owner.wait()
        for process in (guarded, guard):  # both lead their own group
            if group_alive(process.pid):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def test_the_watchdog_leaves_when_the_group_ends_first() -> None:
    guarded = _sleeper()
    guard = watch(os.getpid(), groups=[guarded.pid])
    os.killpg(guarded.pid, signal.SIGTERM)
    guarded.wait()
    assert guard.wait(timeout=20) == 1, "a watchdog with nothing left to guard exits by itself"


def test_a_watchdog_started_after_its_owner_died_ends_the_group_at_once() -> None:
    owner = subprocess.Popen([sys.executable, "-c", "pass"])
    owner.wait()
    guarded = _sleeper()
    guard = watch(owner.pid, groups=[guarded.pid])
    assert guard.wait(timeout=20) == 0
    assert wait_for(lambda: not _group_members(guarded.pid), 5)
    guarded.wait()


@pytest.mark.slow
def test_servers_end_when_pytest_is_killed(tmp_path: Path) -> None:
    mark = tmp_path / "servers.json"
    env = {**os.environ, "CLEANUP_PROBE_MARK": str(mark)}
    env.pop(OWNER_ENV, None)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/cleanup_probe.py"]
    log = (tmp_path / "pytest.log").open("wb")
    probe = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    groups: dict[str, int] = {}
    try:
        assert wait_for(lambda: mark.is_file() or probe.poll() is not None, 500), "the probe never started its servers"
        assert mark.is_file(), (tmp_path / "pytest.log").read_text()[-4000:]
        groups = json.loads(mark.read_text())["groups"]
        members = {name: _group_members(group) for name, group in groups.items()}
        assert all(members.values()), f"every server runs before the kill: {members}"
        for name in ("fixture torchserve", "launcher torchserve"):
            assert len(members[name]) >= 2, f"{name}: the Java frontend and its model worker(s) share one group"
        assert len(_watchdogs_of(probe.pid)) == 3, "one watchdog per TorchServe and one for the owned child"
        probe.send_signal(signal.SIGKILL)  # what an outer timeout does: no teardown, no finally
        probe.wait()
        assert wait_for(lambda: not any(_group_members(group) for group in groups.values()), 60), {
            name: _group_members(group) for name, group in groups.items()
        }
        assert wait_for(lambda: not _watchdogs_of(probe.pid), 30), "the watchdogs leave after their work"
    finally:
        if probe.poll() is None:
            probe.kill()
            probe.wait()
        for group in groups.values():  # only if the assertion above failed: do not leave them running
            if group_alive(group):
                os.killpg(group, signal.SIGKILL)
