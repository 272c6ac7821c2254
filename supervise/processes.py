"""Process mechanics shared by the launchers (TorchServe's and the other doors'): spawning a server in its own
session, pid files, waiting until it answers, stopping its process group, and telling a live process from a dead one.

- :func:`spawn` starts a :class:`Launch` (command, folder, environment, log, pid file) in its own session, so that
  :func:`terminate` can end the whole group (TorchServe's workers too); :func:`python_env` is the environment with
  this checkout first on ``PYTHONPATH`` (an installed package adds nothing: its modules are found where they are).
  The launchers start every process in the working directory (:mod:`supervise.workdir`), by module (``-m``).
- :func:`read_pid`, :func:`running_pid` and :func:`refuse_if_running` read the pid files a run folder keeps.
- :func:`wait_until` polls a readiness condition while watching that the processes it depends on still run.
- :func:`pid_alive` is true for a running process only: a zombie (ended, not yet reaped by its parent) is dead.
  :func:`reap` collects the exit status of an ended child of this process; :func:`exit_description` words it.

Standard library only (the watchdog imports it).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

#: The folder that holds the project's packages: the repository's root in a clone, ``site-packages`` when installed.
REPO_ROOT = Path(__file__).resolve().parent.parent
#: Whether the packages run from a source checkout (a clone, an editable install), which every process a launcher
#: starts then finds first on its ``PYTHONPATH``.
FROM_CHECKOUT = (REPO_ROOT / "pyproject.toml").is_file()


class AlreadyRunningError(RuntimeError):
    """A pid file of the run folder names a live process."""


class ExitedEarlyError(RuntimeError):
    """A process :func:`wait_until` depended on ended before the condition held."""

    def __init__(self, name: str, returncode: int, log: Path | None) -> None:
        """Say which process ended, how, and where its log is."""
        where = f"; see {log}" if log is not None else ""
        super().__init__(f"{name} {exit_description(returncode)}{where}")
        self.name = name
        self.returncode = returncode
        self.log = log


@dataclass(frozen=True)
class Launch:
    """How to start one server process (and start it again)."""

    #: What the reports call it ("TorchServe", "the router", ...).
    name: str
    command: tuple[str, ...]
    cwd: Path
    env: Mapping[str, str]
    #: Its standard output and error are appended here.
    log: Path
    #: Where its pid is written (``None``: nowhere).
    pid_file: Path | None = None


def python_env(extra: Mapping[str, str] | None = None, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) with this checkout first on ``PYTHONPATH`` (where the packages
    run from one: :data:`FROM_CHECKOUT`), then ``extra``."""
    environment = dict(os.environ if base is None else base)
    if FROM_CHECKOUT:
        environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), environment.get("PYTHONPATH")]))
    environment.update(extra or {})
    return environment


def spawn(launch: Launch) -> subprocess.Popen[bytes]:
    """Start ``launch`` in its own session (its pid leads a new process group), appending its output to its log and
    writing its pid to its pid file."""
    with launch.log.open("ab") as output:
        process = subprocess.Popen(
            list(launch.command),
            cwd=launch.cwd,
            env=dict(launch.env),
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    if launch.pid_file is not None:
        write_pid(launch.pid_file, process.pid)
    return process


def write_pid(pid_file: Path, pid: int) -> None:
    """Write ``pid`` to ``pid_file`` (replaced in one step, so a reader never sees half a number)."""
    partial = pid_file.with_name(f".{pid_file.name}.{os.getpid()}")
    partial.write_text(str(pid))
    partial.replace(pid_file)


def read_pid(pid_file: Path) -> int | None:
    """The pid in ``pid_file``, or None if there is no such file or it holds no pid."""
    try:
        text = pid_file.read_text().strip()
    except (FileNotFoundError, NotADirectoryError):
        return None
    return int(text) if text.isdigit() and int(text) > 0 else None


def running_pid(pid_file: Path) -> int | None:
    """The pid in ``pid_file`` if that process is alive (:func:`pid_alive`), else None."""
    pid = read_pid(pid_file)
    return pid if pid is not None and pid_alive(pid) else None


def refuse_if_running(pid_files: Iterable[Path], what: str = "a server") -> None:
    """Raise if any of ``pid_files`` names a live process.

    Raises:
        AlreadyRunningError: naming the pid file and ``what`` runs.
    """
    for pid_file in pid_files:
        if running_pid(pid_file) is not None:
            raise AlreadyRunningError(
                f"{what} already runs from {pid_file.parent} (pid file {pid_file}); stop it first (`make stop`, or "
                "Ctrl-C where explain-serve runs)"
            )


def _state(pid: int) -> str | None:
    """The state letter of ``/proc/<pid>/stat`` (``Z``: zombie), or None where it cannot be read."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2 :].split(maxsplit=1)[0]  # after "pid (comm) "


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid runs: it exists (one owned by another user counts) and is not a zombie.

    A zombie has ended and waits for its parent to collect its status (``os.kill(pid, 0)`` still succeeds on it);
    this function never reaps (see :func:`reap`), so a child's exit status stays for its owner.
    """
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return _state(pid) != "Z"


def group_alive(group: int) -> bool:
    """Whether a running process (:func:`pid_alive`: zombies left out) is left in the process group ``group``."""
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    members = group_members(group)
    return True if members is None else bool(members)


def group_members(group: int) -> list[int] | None:
    """The pids of the running processes of ``group`` (from /proc; zombies left out), or None without /proc."""
    proc = Path("/proc")
    if not proc.is_dir():
        return None
    members = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) ": state, ppid, pgrp, ...
        if int(fields[2]) == group and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def reap(pid: int) -> int | None:
    """Collect the exit status of ``pid`` if it is an ended child of this process.

    Returns:
        Its return code as :class:`subprocess.Popen` gives it (negative: the signal that ended it), or None when it
        still runs or is not a child of this process (another process reaps it).
    """
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return None
    return os.waitstatus_to_exitcode(status) if done else None


def exit_description(returncode: int) -> str:
    """``returncode`` (:class:`subprocess.Popen`'s convention) in words: "exited with status 3", "was killed by
    SIGKILL"."""
    if returncode < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-returncode).name}"
        return f"was killed by signal {-returncode}"
    return f"exited with status {returncode}"


def wait_until(
    condition: Callable[[], bool],
    timeout: float,
    watched: Iterable[tuple[subprocess.Popen[bytes], Launch]] = (),
    interval: float = 0.5,
) -> bool:
    """Poll ``condition`` until it holds, raising as soon as a ``watched`` process ends.

    Args:
        condition: True once ready; an ``OSError`` it raises counts as not yet.
        timeout: Seconds to wait.
        watched: The (process, launch) pairs the condition depends on.
        interval: Seconds between polls.

    Returns:
        Whether the condition held before ``timeout`` seconds passed.

    Raises:
        ExitedEarlyError: if a watched process ended first (its name, exit status and log).
    """
    pairs = list(watched)
    deadline = time.monotonic() + timeout
    while True:
        for process, launch in pairs:
            if process.poll() is not None:
                raise ExitedEarlyError(launch.name, process.returncode, launch.log)
        with contextlib.suppress(OSError):
            if condition():
                return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def http_get(url: str, headers: Mapping[str, str] | None = None, timeout: float = 5.0) -> tuple[int, bytes]:
    """GET ``url``: (status, body), HTTP errors included; (0, b"") when nothing answers."""
    request = urllib.request.Request(url, headers=dict(headers or {}))
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return int(response.status), response.read()
    except urllib.error.HTTPError as error:
        return int(error.code), error.read()
    except OSError:
        return 0, b""


def loopback(address: str) -> str:
    """The address to reach a listener bound to ``address`` from this machine (127.0.0.1 for a wildcard)."""
    return "127.0.0.1" if address in ("0.0.0.0", "::", "") else address


def accepting(address: str, port: int, timeout: float = 1.0) -> bool:
    """Whether something accepts TCP connections on ``address:port`` (a wildcard address is tried on loopback)."""
    with contextlib.suppress(OSError), socket.create_connection((loopback(address), port), timeout=timeout):
        return True
    return False


def terminate(pid: int, timeout: float = 20.0) -> None:
    """End the process group led by ``pid`` (TorchServe's workers with their frontend): SIGTERM, then SIGKILL to what
    is left after ``timeout`` seconds. ``pid`` is reaped if it is a child of this process.
    """
    reap(pid)
    if not group_alive(pid):
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        reap(pid)
        if not group_alive(pid):
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def stop_pid_file(pid_file: Path, timeout: float = 20.0) -> bool:
    """:func:`terminate` the process group led by the pid in ``pid_file`` (also when the leader has ended and left
    processes of its group behind) and remove the file; returns whether anything of that group ran."""
    pid = read_pid(pid_file)
    running = pid is not None and group_alive(pid)
    if pid is not None:
        terminate(pid, timeout)
    pid_file.unlink(missing_ok=True)
    return running
