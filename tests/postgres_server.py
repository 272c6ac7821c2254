"""A PostgreSQL server of the test session's own, from the distribution's package (``apt-get install postgresql``).

:func:`postgres_server` runs ``initdb`` and ``postgres`` from ``/usr/lib/postgresql/<version>/bin`` in a temporary
folder, listening on a free port of 127.0.0.1 only, as an unprivileged user (``nobody`` when the tests run as root:
PostgreSQL refuses to run as root), and stops it by its own pid however the tests end. Where the server or psycopg
is not installed, the tests that need it are skipped with one line saying what to install.
"""

from __future__ import annotations

import glob
import itertools
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

#: The database user the server is made with (trusted on 127.0.0.1 only).
USER = "explain"


def _bindir() -> Path | None:
    found = glob.glob("/usr/lib/postgresql/*/bin/initdb")
    if not found:
        return None
    return Path(max(found, key=lambda path: int(Path(path).parent.parent.name))).parent


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class PostgresServer:
    """A running server: its port, and fresh databases on it."""

    port: int
    process: subprocess.Popen[bytes]
    _names: Iterator[int] = field(default_factory=itertools.count)

    def url(self, database: str = "postgres") -> str:
        """The URL of ``database`` on this server."""
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """Make an empty database; its URL."""
        import psycopg

        name = f"records_{os.getpid()}_{next(self._names)}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url(name)


@contextmanager
def postgres_server() -> Iterator[PostgresServer]:
    """Start a server for the duration of the ``with`` block (skips the test when it cannot be had)."""
    bindir = _bindir()
    if bindir is None:
        pytest.skip("PostgreSQL is not installed: apt-get install postgresql (make test's system set-up does)")
    try:
        import psycopg
    except ImportError:
        pytest.skip("psycopg is not installed: pip install '.[records]' (make extras does)")
    base = Path(tempfile.mkdtemp(prefix="explain-records-pg-"))
    run_as: dict[str, Any] = {}
    if os.geteuid() == 0:
        nobody = pwd.getpwnam("nobody")
        os.chown(base, nobody.pw_uid, nobody.pw_gid)
        run_as = {"user": nobody.pw_uid, "group": nobody.pw_gid, "extra_groups": []}
    env = {"PATH": "/usr/bin:/bin", "LANG": "C", "LC_ALL": "C"}
    data, log = base / "data", base / "server.log"
    process: subprocess.Popen[bytes] | None = None
    try:
        subprocess.run(
            [str(bindir / "initdb"), "-D", str(data), "-U", USER, "--auth=trust", "-E", "UTF8", "--locale=C"],
            cwd=base, env=env, check=True, capture_output=True, timeout=120, **run_as,
        )  # fmt: skip
        port = _free_port()
        with open(log, "wb") as out:
            if run_as:
                os.chown(log, run_as["user"], run_as["group"])
            process = subprocess.Popen(
                [str(bindir / "postgres"), "-D", str(data), "-p", str(port), "-h", "127.0.0.1", "-k", str(base)],
                cwd=base, env=env, stdout=out, stderr=subprocess.STDOUT, **run_as,
            )  # fmt: skip
        deadline = time.monotonic() + 60
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"postgres exited with {process.returncode}: {log.read_text(errors='replace')}")
            try:
                psycopg.connect(f"postgresql://{USER}@127.0.0.1:{port}/postgres", connect_timeout=2).close()
                break
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"postgres did not answer in 60 s: {log.read_text(errors='replace')}") from None
                time.sleep(0.1)
        yield PostgresServer(port, process)
    finally:
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGINT)  # fast shutdown, by its own pid
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=30)
        shutil.rmtree(base, ignore_errors=True)
