"""The supervisor (:mod:`supervise.supervisor`) on tiny Python children: an essential child's end ends the service
with a report, a restartable child is started again and counted, a crash loop is reported and stops the service, a
signal or the owner's end stops it, and a background supervisor is started, found ready, refused twice and stopped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from supervise.processes import (
    AlreadyRunningError,
    Launch,
    group_alive,
    pid_alive,
    python_env,
    read_pid,
    spawn,
    stop_pid_file,
)
from supervise.supervisor import (
    LOG_FILE,
    SUPERVISOR_PID,
    Child,
    Supervisor,
    claimed,
    read_status,
    start_in_background,
    stop_supervisor,
)
from tests.serving_support import wait_for

SLEEPER = "import time; time.sleep(120)"


def _launch(tmp_path: Path, name: str, code: str) -> Launch:
    command = (sys.executable, "-c", code)
    return Launch(name, command, tmp_path, python_env(), tmp_path / f"{name}.log", tmp_path / f"{name}.pid")


class Service:
    """Children started for a test and the ``stop_service`` a supervisor calls (by their pid files)."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.children: list[Child] = []
        self.stops = 0

    def child(self, name: str, code: str, restartable: bool = False) -> Child:
        launch = _launch(self.tmp_path, name, code)
        child = Child(name, launch, spawn(launch), restartable)
        self.children.append(child)
        return child

    def stop(self) -> None:
        self.stops += 1
        for child in self.children:
            assert child.launch.pid_file is not None
            stop_pid_file(child.launch.pid_file, timeout=5)

    def supervisor(self, **kwargs: object) -> Supervisor:
        return Supervisor(self.tmp_path, self.children, self.stop, interval=0.05, **kwargs)  # type: ignore[arg-type]


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    started = Service(tmp_path)
    yield started
    for child in started.children:  # whatever a failing test left
        pid = read_pid(child.launch.pid_file) if child.launch.pid_file else None
        for group in {child.process.pid, pid or child.process.pid}:
            if group_alive(group):
                os.killpg(group, signal.SIGKILL)


def _in_background(action: Callable[[], None]) -> threading.Thread:
    thread = threading.Thread(target=action, daemon=True)
    thread.start()
    return thread


def test_an_essential_child_ending_ends_the_service(service: Service) -> None:
    essential = service.child("the server", "import time; time.sleep(0.5); raise SystemExit(4)")
    helper = service.child("the helper", SLEEPER, restartable=True)
    began = time.monotonic()
    assert service.supervisor().run() == 1
    assert time.monotonic() - began < 20
    status = read_status(service.tmp_path)
    assert status is not None and status.state == "failed" and status.pid == os.getpid()
    expected = f"the server (pid {essential.process.pid}) exited with status 4: the service stops; its log: "
    assert status.message == expected + str(service.tmp_path / "the server.log")
    assert service.stops == 1 and not group_alive(helper.process.pid), "the rest of the service was stopped"


def test_a_restartable_child_is_started_again_and_counted(service: Service) -> None:
    service.child("the server", SLEEPER)
    helper = service.child("the helper", SLEEPER, restartable=True)
    first = helper.process.pid
    counted: list[str] = []
    supervisor = service.supervisor(on_restart=lambda child: counted.append(child.key))
    assert helper.launch.pid_file is not None
    pid_file = helper.launch.pid_file

    def kill_then_stop() -> None:
        os.killpg(first, signal.SIGKILL)
        assert wait_for(lambda: read_pid(pid_file) not in (None, first), 30, 0.05)
        assert wait_for(lambda: pid_alive(read_pid(pid_file) or 0), 30, 0.05)
        supervisor.request_stop()

    thread = _in_background(kill_then_stop)
    assert supervisor.run() == 0
    thread.join(timeout=30)
    second = helper.process.pid
    assert second != first and counted == ["the helper"] and len(helper.restarts) == 1
    assert service.stops == 1 and not group_alive(second)
    status = read_status(service.tmp_path)
    assert status is not None and status.state == "stopped"


def test_a_crash_loop_is_reported_and_stops_the_service(service: Service) -> None:
    service.child("the server", SLEEPER)
    service.child("the helper", "raise SystemExit(1)", restartable=True)
    counted: list[str] = []
    supervisor = service.supervisor(on_restart=lambda child: counted.append(child.key), max_restarts=3, window_s=60)
    began = time.monotonic()
    assert supervisor.run() == 1
    assert time.monotonic() - began < 30 and counted == ["the helper"] * 3
    status = read_status(service.tmp_path)
    assert status is not None and status.state == "failed"
    assert (
        "the helper (pid " in status.message and "exited with status 1 after 3 restarts within 60 s" in status.message
    )
    assert "a crash loop, the service stops" in status.message and service.stops == 1


def test_sigterm_stops_the_service_and_the_handlers_come_back(service: Service) -> None:
    server = service.child("the server", SLEEPER)
    supervisor = service.supervisor()
    before = signal.getsignal(signal.SIGTERM)

    def terminate_once_handled() -> None:
        assert wait_for(lambda: signal.getsignal(signal.SIGTERM) == supervisor._on_signal, 30, 0.05)
        os.kill(os.getpid(), signal.SIGTERM)

    thread = _in_background(terminate_once_handled)
    assert supervisor.run() == 0
    thread.join(timeout=30)
    assert signal.getsignal(signal.SIGTERM) == before
    assert service.stops == 1 and not group_alive(server.process.pid)


def test_the_owner_ending_stops_the_service(service: Service) -> None:
    server = service.child("the server", SLEEPER)
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    try:
        assert service.supervisor(owner=owner.pid).run() == 1
    finally:
        owner.wait()
    status = read_status(service.tmp_path)
    assert status is not None and f"owns the service (pid {owner.pid}) ended" in status.message
    assert not group_alive(server.process.pid)


#: A background supervisor as the launchers' ``serve`` is one: claims the run folder, starts a server, says it is
#: ready (or fails when told to), supervises.
SUPERVISOR_SCRIPT = textwrap.dedent(
    """
    import sys
    from pathlib import Path

    from supervise.processes import Launch, python_env, spawn, stop_pid_file
    from supervise.supervisor import Child, Supervisor, claimed, write_status

    run_dir = Path(sys.argv[1])
    if sys.argv[2] == "crash":
        print("something went wrong early", flush=True)
        raise SystemExit(3)
    with claimed(run_dir):
        launch = Launch("the server", (sys.executable, "-c", "import time; time.sleep(120)"), run_dir, python_env(),
                        run_dir / "server.log", run_dir / "server.pid")
        child = Child("server", launch, spawn(launch))
        write_status(run_dir, "ready", "call me on port 1")
        sys.exit(Supervisor(run_dir, [child], lambda: stop_pid_file(run_dir / "server.pid"), interval=0.05).run())
    """
)


def test_a_background_supervisor_is_ready_refused_twice_and_stopped(tmp_path: Path) -> None:
    script = tmp_path / "supervisor_script.py"
    script.write_text(SUPERVISOR_SCRIPT)
    run_dir = tmp_path / "run"
    command = [sys.executable, str(script), str(run_dir), "serve"]
    try:
        assert start_in_background(command, run_dir, timeout=60) == (0, "call me on port 1")
        supervisor, server = read_pid(run_dir / SUPERVISOR_PID), read_pid(run_dir / "server.pid")
        assert supervisor is not None and server is not None and pid_alive(supervisor) and pid_alive(server)
        assert os.getsid(supervisor) == supervisor, "the background supervisor leads its own session"
        with pytest.raises(AlreadyRunningError):
            start_in_background(command, run_dir, timeout=60)
        with pytest.raises(AlreadyRunningError), claimed(run_dir):
            pass
        assert stop_supervisor(run_dir)
        assert not pid_alive(supervisor) and not group_alive(server)
        status = read_status(run_dir)
        assert status is not None and status.state == "stopped" and status.pid == supervisor
        assert not (run_dir / SUPERVISOR_PID).exists() and not stop_supervisor(run_dir)
    finally:
        for name in (SUPERVISOR_PID, "server.pid"):
            stop_pid_file(run_dir / name, timeout=5)


def test_a_background_supervisor_that_fails_early_says_why(tmp_path: Path) -> None:
    script = tmp_path / "supervisor_script.py"
    script.write_text(SUPERVISOR_SCRIPT)
    run_dir = tmp_path / "run"
    code, message = start_in_background([sys.executable, str(script), str(run_dir), "crash"], run_dir, timeout=60)
    assert code == 1 and message.startswith("the supervisor exited with status 3; see ")
    assert str(run_dir / LOG_FILE) in message and "something went wrong early" in message
