"""A watchdog that ends a server when the process that owns it ends, however it ends (also by SIGKILL).

The service's processes run in their own sessions (so that ``stop`` can kill each whole process group, TorchServe's
workers included), which also means that nothing stops them when the process that started them dies without running
its clean-up: a test run killed by an outer timeout would leave a TorchServe behind. Setting ``EXPLAIN_OWNER_PID``
(the test suite sets it to the pytest process) makes the launchers (:func:`doors.torchserve.process.start`,
:func:`doors.kserve.launch.start`) start one watchdog per server::

    python -m supervise.watchdog --owner PID [--group PGID ...] [-- COMMAND ...]

It waits for the owner to end (a ``pidfd``, so a reused pid cannot fool it), then sends SIGTERM to each process
group, SIGKILL to what is left after a grace period, and runs COMMAND if one is given (for example a
``docker compose down``). It exits by itself once every group it guards is gone (the server was stopped normally).
Standard library only; it runs in its own session, so a signal to the owner's process group does not reach it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence

from supervise.processes import group_alive, pid_alive, python_env

#: The environment variable naming the process whose end stops the servers started under it.
OWNER_ENV = "EXPLAIN_OWNER_PID"
#: Seconds between SIGTERM and SIGKILL of a guarded group.
GRACE_S = 10.0
#: Seconds a command run after the owner's end may take.
COMMAND_TIMEOUT_S = 120.0


def owner_pid(environ: Mapping[str, str] = os.environ) -> int | None:
    """The pid named by ``EXPLAIN_OWNER_PID``, or None when unset or not a positive integer."""
    value = environ.get(OWNER_ENV, "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


def watch(
    owner: int,
    groups: Sequence[int] = (),
    command: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """Start a watchdog that ends ``groups`` (process-group ids) and runs ``command`` once ``owner`` has ended.

    Returns the watchdog's process; terminate it (its pid leads its own group) to cancel the guard, for example after
    a normal clean-up that ``command`` would repeat.
    """
    arguments = [sys.executable, "-m", "supervise.watchdog", "--owner", str(owner)]
    for group in groups:
        arguments += ["--group", str(group)]
    if command:
        arguments += ["--", *command]
    return subprocess.Popen(
        arguments,
        env=python_env(base=env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def _owner_ended(owner: int) -> tuple[int | None, bool]:
    """A pidfd of ``owner`` (None where pidfds are unavailable), and whether it has already ended."""
    try:
        return os.pidfd_open(owner), False
    except ProcessLookupError:
        return None, True
    except OSError:  # an old kernel: fall back to polling the pid
        return None, False


def _end_groups(groups: Sequence[int]) -> None:
    for group in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    while time.monotonic() < deadline and any(group_alive(group) for group in groups):
        time.sleep(0.2)
    for group in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGKILL)


def run(owner: int, groups: Sequence[int], command: Sequence[str], interval: float = 1.0) -> int:
    """Wait for ``owner`` to end, then end ``groups`` and run ``command``; return 0 then, or 1 if every group ended
    first (nothing to do)."""
    descriptor, ended = _owner_ended(owner)
    try:
        while not ended:
            if descriptor is not None:
                ready, _, _ = select.select([descriptor], [], [], interval)
                ended = bool(ready)
            else:
                time.sleep(interval)
                ended = not pid_alive(owner)
            if not ended and groups and not command and not any(group_alive(group) for group in groups):
                return 1
    finally:
        if descriptor is not None:
            os.close(descriptor)
    _end_groups(groups)
    if command:
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run(list(command), stdin=subprocess.DEVNULL, timeout=COMMAND_TIMEOUT_S, check=False)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m supervise.watchdog", description=__doc__.split("\n")[0])
    parser.add_argument("--owner", type=int, required=True, help="the pid whose end ends the groups")
    parser.add_argument("--group", type=int, action="append", default=[], help="a process-group id to end")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ...: run after the owner has ended")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C meant for the owner must not cancel the guard
    return run(args.owner, args.group, command)


if __name__ == "__main__":
    sys.exit(main())
