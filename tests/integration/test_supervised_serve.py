"""The launcher sees its servers: ``python -m doors serve`` (what ``make serve`` runs) in a subprocess,
serving the tiny ``sentiment`` archive on free loopback ports, returns 0 promptly after ``stop``, reports TorchServe
killed under it and exits 1, and starts the router and the metrics exporter again when they are killed (counted in
``explain_process_restarts_total``, served by the exporter), the service answering again; ``start`` gets the same
supervision in the background. The KServe door (``--server kserve``) likewise, where its extras are installed.

Every server is stopped by its pid files when a test ends, however it ends (and by the watchdogs if pytest is
killed)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from doors.kserve.launch import stop as stop_door
from doors.torchserve.config import Ports
from doors.torchserve.process import stop
from supervise.processes import group_alive, http_get, pid_alive, read_pid
from supervise.supervisor import SUPERVISOR_PID, read_status
from tests.doors_support import EXTRAS
from tests.serving_support import REPO_ROOT, http_post, owned_popen, wait_for

pytestmark = pytest.mark.slow

TEXT = "the crew were lovely and the food was fine"
#: Seconds a server may take to start on a loaded 2-core machine, and to stop.
READY_S, STOP_S = 300, 60


@dataclass
class Launched:
    """A supervised service: its run folder, ports, the supervisor's output, and the supervisor when it is a child of
    this process (a foreground ``serve``; ``None`` after ``start``: its pid is in the run folder)."""

    run_dir: Path
    ports: Ports
    output: Path
    process: subprocess.Popen[bytes] | None = None

    def supervising(self) -> bool:
        """Whether the supervisor still runs."""
        if self.process is not None:
            return self.process.poll() is None
        return pid_alive(read_pid(self.run_dir / SUPERVISOR_PID) or 0)

    def text(self) -> str:
        return self.output.read_text(encoding="utf-8", errors="replace")

    def pid(self, name: str) -> int:
        pid = read_pid(self.run_dir / name)
        assert pid is not None, f"no {name} in {self.run_dir}"
        return pid

    def wait_ready(self) -> None:
        """Until the supervisor says the service is ready (fails if it ends first)."""
        deadline = time.monotonic() + READY_S
        while time.monotonic() < deadline:
            status = read_status(self.run_dir)
            if status is not None and status.state == "ready":
                return
            assert self.supervising(), f"the launcher ended:\n{self.text()}"
            time.sleep(0.5)
        pytest.fail(f"not ready after {READY_S} s:\n{self.text()[-4000:]}")


def _environment(ports: Ports) -> dict[str, str]:
    ports_env = {f"{name.upper()}_PORT": str(value) for name, value in vars(ports).items()}
    return {**os.environ, **ports_env, "OMP_NUM_THREADS": "1"}


def _command(command: str, run_dir: Path, archives: dict[str, Path], *options: str) -> list[str]:
    sentiment = archives["sentiment"]
    store = sentiment.parent.parent
    line = [sys.executable, "-m", "doors", command, "--run-dir", str(run_dir)]
    return [*line, "--model-store", str(store), "--archive", f"sentiment={sentiment.relative_to(store)}", *options]


@pytest.fixture
def launch(archives: dict[str, Path], tmp_path: Path) -> Iterator[Callable[..., Launched]]:
    """Runs ``python -m doors serve OPTIONS`` in the background; everything it started is stopped at
    the end by the pid files."""
    started: list[Launched] = []

    def run(*options: str) -> Launched:
        run_dir, ports = tmp_path / f"run{len(started)}", Ports.free()
        output = tmp_path / f"serve{len(started)}.log"
        with output.open("wb") as log:
            process = owned_popen(_command("serve", run_dir, archives, *options), cwd=REPO_ROOT,
                                  env=_environment(ports), stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
        started.append(Launched(run_dir, ports, output, process))
        return started[-1]

    yield run
    for launched in started:
        stop(launched.run_dir)
        stop_door(launched.run_dir)
        assert launched.process is not None
        if group_alive(launched.process.pid):
            os.killpg(launched.process.pid, signal.SIGKILL)
        launched.process.wait(timeout=STOP_S)


def _predict(launched: Launched, explain: bool = False) -> int:
    """The HTTP status of a prediction (with an explanation: served by the pool) through the public port; 0 when
    nothing answers there."""
    keys = json.loads((launched.run_dir / "key_file.json").read_text())
    body = {"text": TEXT, **({"explain": {"method": "attnlrp"}} if explain else {})}
    url = f"http://127.0.0.1:{launched.ports.inference}/predictions/sentiment"
    try:
        return int(http_post(url, json.dumps(body).encode(), keys["inference"]["key"], timeout=60)[0])
    except OSError:
        return 0


def _restarts(launched: Launched) -> dict[str, float]:
    """``explain_process_restarts_total`` per process, as the exporter serves it ({} while it does not answer)."""
    status, body = http_get(f"http://127.0.0.1:{launched.ports.exporter}/metrics", timeout=10)
    if status != 200:
        return {}
    pattern = r'^explain_process_restarts_total\{process="(\w+)"\} ([0-9.]+)$'
    return {name: float(value) for name, value in re.findall(pattern, body.decode(), re.MULTILINE)}


def _until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    assert wait_for(condition, timeout, 0.25), f"{what}: not within {timeout} s"


def _kill_and_wait_for_restart(launched: Launched, pid_name: str) -> int:
    """SIGKILL the process of ``pid_name``; return the new pid once it is started again."""
    old = launched.pid(pid_name)
    os.kill(old, signal.SIGKILL)
    _until(lambda: read_pid(launched.run_dir / pid_name) not in (None, old), 30, f"{pid_name} started again")
    new = launched.pid(pid_name)
    assert pid_alive(new) and launched.supervising(), launched.text()
    return new


def _stop_command(launched: Launched) -> subprocess.CompletedProcess[str]:
    line = [sys.executable, "-m", "doors", "stop", "--run-dir", str(launched.run_dir)]
    return subprocess.run(line, cwd=REPO_ROOT, env=_environment(launched.ports), capture_output=True, text=True,
                          timeout=STOP_S * 2, check=False)  # fmt: skip


def _all_gone(pids: list[int]) -> None:
    _until(lambda: not any(group_alive(pid) for pid in pids), 30, "every process of the service gone")


def test_router_and_exporter_are_restarted_and_stop_returns_serve_0(launch: Callable[..., Launched]) -> None:
    launched = launch("--profile", "cpu-pooled")  # an explanation pool: the router is in front
    launched.wait_ready()
    assert _predict(launched) == 200 and _predict(launched, explain=True) == 200
    _until(lambda: _restarts(launched) == {"router": 0.0, "exporter": 0.0}, 30, "the restart counter at 0")
    torchserve = launched.pid("torchserve.pid")

    router = _kill_and_wait_for_restart(launched, "router.pid")
    _until(lambda: _predict(launched) == 200 and _predict(launched, explain=True) == 200, 30, "answers again")
    assert _restarts(launched) == {"router": 1.0, "exporter": 0.0}
    exporter = _kill_and_wait_for_restart(launched, "exporter.pid")
    _until(lambda: _restarts(launched) == {"router": 1.0, "exporter": 1.0}, 30, "the new exporter serves the count")
    assert launched.pid("torchserve.pid") == torchserve and _predict(launched) == 200
    output = launched.text()
    assert "the router (pid " in output and "was killed by SIGKILL: started again (pid " in output
    assert "the metrics exporter (pid " in output

    began = time.monotonic()
    stopped = _stop_command(launched)
    assert stopped.returncode == 0 and stopped.stdout.strip() == "stopped", stopped.stdout + stopped.stderr
    assert launched.process is not None and launched.process.wait(timeout=STOP_S) == 0, launched.text()
    assert time.monotonic() - began < STOP_S
    _all_gone([torchserve, router, exporter])
    status = read_status(launched.run_dir)
    assert status is not None and status.state == "stopped"
    assert not (launched.run_dir / SUPERVISOR_PID).exists()


def test_torchserve_killed_under_serve_is_reported_with_a_non_zero_exit(launch: Callable[..., Launched]) -> None:
    launched = launch()
    launched.wait_ready()
    torchserve, exporter = launched.pid("torchserve.pid"), launched.pid("exporter.pid")
    os.kill(torchserve, signal.SIGKILL)
    assert launched.process is not None and launched.process.wait(timeout=STOP_S) == 1
    log = launched.run_dir.resolve() / "torchserve.out"
    expected = f"TorchServe (pid {torchserve}) was killed by SIGKILL: the service stops; its log: {log}"
    assert expected in launched.text()
    _all_gone([torchserve, exporter])
    status = read_status(launched.run_dir)
    assert status is not None and status.state == "failed" and status.message == expected


def test_start_supervises_in_the_background(archives: dict[str, Path], tmp_path: Path) -> None:
    run_dir, ports = tmp_path / "run", Ports.free()
    command = _command("start", run_dir, archives, "--profile", "cpu-pooled")
    try:
        started = subprocess.run(command, cwd=REPO_ROOT, env=_environment(ports), capture_output=True, text=True,
                                 timeout=READY_S + 60, check=False)  # fmt: skip
        assert started.returncode == 0, started.stdout + started.stderr
        assert "/predictions/sentiment" in started.stdout, "start prints how to call the service"
        launched = Launched(run_dir, ports, run_dir / "supervisor.log")
        supervisor = launched.pid(SUPERVISOR_PID)
        assert pid_alive(supervisor) and os.getsid(supervisor) == supervisor
        processes = [launched.pid(name) for name in ("torchserve.pid", "exporter.pid")]
        processes.append(_kill_and_wait_for_restart(launched, "router.pid"))
        _until(lambda: _predict(launched) == 200, 30, "answers again")
        assert "the router (pid " in launched.text() and _restarts(launched)["router"] == 1.0
        stopped = _stop_command(launched)
        assert stopped.stdout.strip() == "stopped", stopped.stdout + stopped.stderr
        assert not pid_alive(supervisor)
        _all_gone(processes)
        status = read_status(run_dir)
        assert status is not None and status.state == "stopped" and status.pid == supervisor
    finally:
        stop(run_dir)


@EXTRAS
def test_the_kserve_door_under_serve_returns_0_on_stop(launch: Callable[..., Launched]) -> None:
    launched = launch("--server", "kserve")
    launched.wait_ready()
    door = launched.pid("doors.pid")
    url = f"http://127.0.0.1:{launched.ports.inference}/v2/models/sentiment/ready"
    assert http_get(url)[0] == 200
    stopped = _stop_command(launched)
    assert stopped.returncode == 0 and stopped.stdout.strip() == "stopped", stopped.stdout + stopped.stderr
    assert launched.process is not None and launched.process.wait(timeout=STOP_S) == 0, launched.text()
    _all_gone([door])


@EXTRAS
def test_the_kserve_door_killed_under_serve_is_reported(launch: Callable[..., Launched]) -> None:
    launched = launch("--server", "kserve")
    launched.wait_ready()
    door = launched.pid("doors.pid")
    os.kill(door, signal.SIGKILL)
    assert launched.process is not None and launched.process.wait(timeout=STOP_S) == 1
    log = launched.run_dir.resolve() / "doors.log"
    assert f"the kserve door (pid {door}) was killed by SIGKILL: the service stops; its log: {log}" in launched.text()
    assert not group_alive(door)
