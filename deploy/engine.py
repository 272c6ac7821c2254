"""Which container engine the stack (``make container-up``) and the container tests talk to. Standard library only.

A running Docker engine needs nothing: the ``docker`` command reaches it through ``$DOCKER_HOST`` or the default
socket. Podman works through its Docker-compatible socket: when ``$DOCKER_HOST`` is unset and there is no Docker
socket, :func:`docker_env` points ``DOCKER_HOST`` at Podman's (``$XDG_RUNTIME_DIR/podman/podman.sock`` for a user,
``/run/podman/podman.sock`` for root). A script that installs and starts an engine is used only where
``$ENGINE_SH`` names one (``.ci/run`` sets it on the project's build machines, which have no image registry).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

DOCKER_SOCKET = Path("/var/run/docker.sock")
#: What to install where no engine answers (the skip line of the container test and the stack's error say it).
INSTALL_HINT = (
    "install and start Docker Engine with Compose (Debian/Ubuntu: apt-get install docker.io docker-compose; "
    "https://docs.docker.com/engine/install/) or Podman with its Docker socket (apt-get install podman podman-docker "
    "docker-compose; systemctl --user start podman.socket)"
)


def podman_sockets(environ: Mapping[str, str]) -> list[Path]:
    """Where Podman's Docker-compatible socket lives: the user's, then root's."""
    runtime = environ.get("XDG_RUNTIME_DIR") or f"/run/user/{os.getuid()}"
    return [Path(runtime) / "podman" / "podman.sock", Path("/run/podman/podman.sock")]


def docker_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``environ`` (default: this process's) with ``DOCKER_HOST`` pointing at Podman's socket when neither
    ``DOCKER_HOST`` nor Docker's own socket is there and Podman's is."""
    env = dict(os.environ if environ is None else environ)
    if env.get("DOCKER_HOST") or DOCKER_SOCKET.exists():
        return env
    for socket in podman_sockets(env):
        if socket.exists():
            env["DOCKER_HOST"] = f"unix://{socket}"
            break
    return env


def engine_problem(environ: Mapping[str, str] | None = None, timeout: float = 30.0) -> str | None:
    """Why no container engine can be used here, in a few words (one line), or None when ``docker info`` answers."""
    env = docker_env(environ)
    if shutil.which("docker", path=env.get("PATH")) is None:
        return "no `docker` command"
    try:
        result = subprocess.run(
            ["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True, timeout=timeout,
            env=env, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"`docker info` failed ({error})"
    if result.returncode != 0:
        first = ((result.stderr or result.stdout).strip().splitlines() or ["no answer"])[0]
        return f"`docker info` failed: {first[:200]}"
    return None
