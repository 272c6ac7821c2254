"""A local Ray cluster of two nodes for the tests: a head and a worker started with ``ray start`` on this machine
(127.0.0.1, free ports, one CPU each, a private temporary folder and a private authentication token), stopped by the
ids of its own processes (never ``ray stop``, which would stop every cluster of the machine)."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
RAY = str(Path(sys.executable).with_name("ray"))


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return []


def _is_raylet(process: psutil.Process) -> bool:
    command = _cmdline(process)
    return bool(command) and command[0].endswith("/raylet")


def _node_ports() -> list[str]:
    return [
        f"--node-manager-port={free_port()}",
        f"--object-manager-port={free_port()}",
        f"--metrics-export-port={free_port()}",
        f"--dashboard-agent-listen-port={free_port()}",
        f"--dashboard-agent-grpc-port={free_port()}",
        f"--runtime-env-agent-port={free_port()}",
    ]


@dataclass
class RayCluster:
    """A running two-node cluster.

    Attributes:
        address: ``127.0.0.1:PORT`` of its head.
        env: the environment a driver needs (the token, this checkout on ``PYTHONPATH``).
        folder: its temporary folder (sessions, sockets, logs).
    """

    address: str
    env: dict[str, str]
    folder: Path
    known: dict[int, psutil.Process] = field(default_factory=dict)

    def processes(self) -> list[psutil.Process]:
        """Every process of the cluster: those naming its folder, and their descendants."""
        found: dict[int, psutil.Process] = {}
        for process in psutil.process_iter():
            if process.pid == os.getpid():
                continue
            if any(str(self.folder) in part for part in _cmdline(process)):
                found[process.pid] = process
                with contextlib.suppress(psutil.NoSuchProcess):
                    found.update({child.pid: child for child in process.children(recursive=True)})
        self.known.update(found)
        return list(found.values())

    def kill_worker_node(self) -> int:
        """SIGKILL the worker node (its raylet and everything under it); return how many processes were killed."""
        raylets = [process for process in self.processes() if _is_raylet(process) and "--head" not in _cmdline(process)]
        assert len(raylets) == 1, "expected one worker raylet"
        victims = [raylets[0], *raylets[0].children(recursive=True)]
        for victim in victims:
            with contextlib.suppress(psutil.NoSuchProcess):
                victim.send_signal(signal.SIGKILL)
        return len(victims)

    def stop(self) -> None:
        """Kill every process of the cluster, found now or before (psutil refuses a process id since reused by
        another process), and remove its folder."""
        self.processes()
        processes = list(self.known.values())
        for process in processes:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.send_signal(signal.SIGKILL)
        psutil.wait_procs(processes, timeout=10)
        shutil.rmtree(self.folder, ignore_errors=True)


def start_cluster(timeout: float = 240) -> RayCluster:
    """Start the head and the worker node; the cluster is stopped again if either fails to start.

    Raises:
        RuntimeError: with ``ray start``'s output, if a node does not start.
    """
    folder = Path(tempfile.mkdtemp(prefix="rb-", dir="/tmp"))  # short: Unix socket paths are bounded
    token = folder / "token"
    token.write_text(secrets.token_hex(32))
    env = {
        **os.environ,
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(token),
        "PYTHONPATH": str(REPO),
        "OMP_NUM_THREADS": "1",
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    port = free_port()
    cluster = RayCluster(f"127.0.0.1:{port}", env, folder)
    common = ["--num-cpus=1", "--node-ip-address=127.0.0.1", "--disable-usage-stats"]
    head = [
        RAY,
        "start",
        "--head",
        f"--port={port}",
        f"--temp-dir={folder / 'ray'}",
        "--include-dashboard=false",
        f"--ray-client-server-port={free_port()}",
        *common,
        *_node_ports(),
    ]
    worker = [RAY, "start", f"--address={cluster.address}", *common, *_node_ports()]
    try:
        for command in (head, worker):
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
            cluster.processes()
            if done.returncode != 0:
                raise RuntimeError(f"{' '.join(command)} failed:\n{done.stdout}\n{done.stderr}")
        deadline = time.monotonic() + 60
        while len([process for process in cluster.processes() if _is_raylet(process)]) < 2:
            if time.monotonic() > deadline:
                raise RuntimeError("the two raylets did not start")
            time.sleep(0.5)
    except BaseException:
        cluster.stop()
        raise
    return cluster
