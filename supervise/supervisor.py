"""Watch a started service's processes until it is stopped: the launchers' ``serve`` runs a :class:`Supervisor` in
the foreground, and their ``start`` runs that same ``serve`` in the background (:func:`start_in_background`).

The supervisor is the parent of the service's processes, so it reaps them and learns how each ended. A process that
the service cannot do without (TorchServe, a door's server process) ending by itself ends the service: the
supervisor says which process ended, how (its exit status or signal) and where its log is, stops the rest and exits
with status 1. A restartable process (TorchServe's explanation-pool router and metrics exporter) is started again,
with the same command, environment and log, and counted (``on_restart``); more than ``max_restarts`` restarts of one
process within ``window_s`` seconds is a crash loop, reported like the end of an essential process.

SIGTERM or SIGINT stops the service and exits with status 0: ``make stop`` (:func:`stop_supervisor`) sends SIGTERM
to the pid in ``RUN_DIR/supervisor.pid`` and waits for it to exit. ``RUN_DIR/supervisor.json`` holds the
supervisor's pid, its state (``starting``, ``ready``, ``failed``, ``stopped``) and a message (how to call the service
once ready, the report once failed); the background supervisor's output goes to ``RUN_DIR/supervisor.log``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from supervise.processes import (
    ExitedEarlyError,
    Launch,
    exit_description,
    pid_alive,
    python_env,
    reap,
    refuse_if_running,
    running_pid,
    spawn,
    wait_until,
    write_pid,
)
from supervise.workdir import workdir

logger = logging.getLogger(__name__)

SUPERVISOR_PID = "supervisor.pid"
STATUS_FILE = "supervisor.json"
LOG_FILE = "supervisor.log"
#: Restarts of one process allowed within :data:`RESTART_WINDOW_S` seconds; one more is a crash loop.
MAX_RESTARTS = 5
RESTART_WINDOW_S = 300.0
#: Seconds :func:`stop_supervisor` waits for the supervisor to stop the service and exit.
STOP_TIMEOUT_S = 90.0


@dataclass
class Child:
    """One supervised process."""

    #: Short name (``torchserve``, ``router``, ``exporter``, ``door``): the restart counter's label.
    key: str
    #: How it was started (and is started again); its name and log are in the reports.
    launch: Launch
    process: subprocess.Popen[bytes]
    #: Whether it is started again when it ends (else its end ends the service).
    restartable: bool = False
    #: When it was restarted (monotonic seconds).
    restarts: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class Status:
    """What ``RUN_DIR/supervisor.json`` says."""

    pid: int
    #: ``starting``, ``ready``, ``failed`` or ``stopped``.
    state: str
    message: str = ""


def read_status(run_dir: Path) -> Status | None:
    """The supervisor status of ``run_dir``, or None if there is none (or it cannot be read)."""
    try:
        return Status(**json.loads((run_dir / STATUS_FILE).read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError):
        return None


def write_status(run_dir: Path, state: str, message: str = "") -> None:
    """Record this process's supervisor state (replaced in one step)."""
    partial = run_dir / f".{STATUS_FILE}.{os.getpid()}"
    partial.write_text(json.dumps(asdict(Status(os.getpid(), state, message))), encoding="utf-8")
    partial.replace(run_dir / STATUS_FILE)


@contextlib.contextmanager
def claimed(run_dir: Path) -> Iterator[None]:
    """This process supervises the service of ``run_dir`` while the block runs: its pid is in ``supervisor.pid``
    (removed at the end if it still names this process).

    Raises:
        AlreadyRunningError: if another live supervisor runs from ``run_dir``.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    pid_file = run_dir / SUPERVISOR_PID
    if running_pid(pid_file) != os.getpid():  # `start` writes its background supervisor's pid itself
        refuse_if_running([pid_file], "the service")
        write_pid(pid_file, os.getpid())
    write_status(run_dir, "starting")
    try:
        yield
    finally:
        if running_pid(pid_file) == os.getpid():
            pid_file.unlink(missing_ok=True)


class Supervisor:
    """Watches :class:`Child` processes until a signal stops the service or an essential one ends (module
    docstring)."""

    def __init__(
        self,
        run_dir: Path,
        children: Sequence[Child],
        stop_service: Callable[[], object],
        on_restart: Callable[[Child], None] | None = None,
        owner: int | None = None,
        max_restarts: int = MAX_RESTARTS,
        window_s: float = RESTART_WINDOW_S,
        interval: float = 0.5,
    ) -> None:
        """Supervise ``children``.

        Args:
            run_dir: The service's run folder (the status file).
            children: The processes, started by this process.
            stop_service: Stops the whole service (every child, by its pid file); called once, at the end.
            on_restart: Called after a child was started again (count it).
            owner: A pid whose end stops the service (``EXPLAIN_OWNER_PID``; None: none).
            max_restarts: Restarts of one child allowed within ``window_s`` seconds.
            window_s: The crash-loop window.
            interval: Seconds between checks.
        """
        self.run_dir = run_dir
        self.children = list(children)
        self.stop_service = stop_service
        self.on_restart = on_restart
        self.owner = owner
        self.max_restarts = max_restarts
        self.window_s = window_s
        self.interval = interval
        self._stop = threading.Event()

    def request_stop(self) -> None:
        """Stop the service at the next check (what SIGTERM and SIGINT do)."""
        self._stop.set()

    def run(self) -> int:
        """Supervise until stopped (returns 0) or until the service fails (reports, stops it, returns 1).

        SIGTERM and SIGINT request the stop while this runs (in the main thread; elsewhere call
        :meth:`request_stop`).
        """
        previous: dict[signal.Signals, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for number in (signal.SIGTERM, signal.SIGINT):
                previous[number] = signal.signal(number, self._on_signal)
        try:
            failure = self._watch()
            if failure is None:
                logger.info("stopping the service")
            else:
                logger.error("%s", failure)
            try:
                self.stop_service()
            finally:
                write_status(self.run_dir, "stopped" if failure is None else "failed", failure or "")
            return 0 if failure is None else 1
        finally:
            for number, handler in previous.items():
                signal.signal(number, handler)

    def _on_signal(self, number: int, frame: FrameType | None) -> None:
        self._stop.set()

    def _watch(self) -> str | None:
        """Check until stopped (None) or failed (the report)."""
        while not self._stop.wait(self.interval):
            if self.owner is not None and not pid_alive(self.owner):
                return f"the process that owns the service (pid {self.owner}) ended: the service stops"
            for child in self.children:
                returncode = child.process.poll()
                if returncode is None:
                    continue
                if self._stop.is_set():  # a stop requested meanwhile may have ended it
                    return None
                ended = f"{child.launch.name} (pid {child.process.pid}) {exit_description(returncode)}"
                where = f"its log: {child.launch.log}"
                if not child.restartable:
                    return f"{ended}: the service stops; {where}"
                now = time.monotonic()
                child.restarts = [moment for moment in child.restarts if now - moment < self.window_s]
                if len(child.restarts) >= self.max_restarts:
                    return (
                        f"{ended} after {len(child.restarts)} restarts within {self.window_s:.0f} s: a crash loop, "
                        f"the service stops; {where}"
                    )
                child.process = spawn(child.launch)
                child.restarts.append(now)
                logger.warning("%s: started again (pid %d); %s", ended, child.process.pid, where)
                if self.on_restart is not None:
                    self.on_restart(child)
        return None


def start_in_background(command: Sequence[str], run_dir: Path, timeout: float = 900.0) -> tuple[int, str]:
    """Run ``command`` (a launcher's ``serve`` command line) as a background supervisor, in its own session with its
    output in ``RUN_DIR/supervisor.log``, and wait until it says the service is ready or failed.

    Returns:
        (0, how to call the service) once ready, else (1, why not: its report, or the end of its log).

    Raises:
        AlreadyRunningError: if a supervisor already runs from ``run_dir``.
    """
    run_dir = run_dir.resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    pid_file = run_dir / SUPERVISOR_PID
    refuse_if_running([pid_file], "the service")
    (run_dir / STATUS_FILE).unlink(missing_ok=True)
    launch = Launch("the supervisor", tuple(command), workdir(), python_env(), run_dir / LOG_FILE, pid_file)
    process = spawn(launch)

    def settled() -> bool:
        status = read_status(run_dir)
        return status is not None and status.pid == process.pid and status.state in ("ready", "failed", "stopped")

    try:
        if not wait_until(settled, timeout, [(process, launch)]):
            stop_supervisor(run_dir)
            return 1, f"the service was not ready after {timeout:.0f} s and was stopped; see {launch.log}"
    except ExitedEarlyError as error:
        return 1, f"{error}:\n{_tail(launch.log)}"
    status = read_status(run_dir)
    assert status is not None
    if status.state == "ready":
        return 0, status.message
    return 1, f"{status.message}; see {launch.log}"


def _tail(log: Path, lines: int = 20) -> str:
    try:
        return "\n".join(log.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def stop_supervisor(run_dir: Path, timeout: float = STOP_TIMEOUT_S) -> bool:
    """Have the supervisor of ``run_dir`` (another process) stop the service: SIGTERM, then wait until it exits
    (SIGKILL to it alone after ``timeout`` seconds: it may share a terminal's process group). Returns whether one
    ran."""
    pid = running_pid(run_dir / SUPERVISOR_PID)
    if pid is None or pid == os.getpid():
        return False
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    except PermissionError:  # a stale pid file naming another user's process: not this service's supervisor
        logger.warning("%s names pid %d, a process of another user: left alone", run_dir / SUPERVISOR_PID, pid)
        return False
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if reap(pid) is not None or not pid_alive(pid):
            return True
        time.sleep(0.1)
    logger.warning("the supervisor (pid %d) did not stop in %.0f s: killing it", pid, timeout)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    return True
