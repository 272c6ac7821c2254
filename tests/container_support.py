"""Helpers of the container test (tests/test_container.py): bring the compose stack up with the repository's own
``make container-up`` under a private project name and free host ports, talk to it through the published ports,
and tear it down by project name, also when a test fails.

The image is built with ``BUILD_MODELS=false`` and serves the tiny test archives (:func:`tests.serving_support.
tiny_archives`, seconds to build) mounted read-only through ``deploy/docker-compose.models.yml``, the documented way
to serve models built on the host; the default models (about ten minutes of training) are never built here.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deploy import engine
from deploy.engine import INSTALL_HINT
from doors.torchserve.config import Ports
from supervise.processes import pid_alive
from supervise.watchdog import watch
from tests.serving_support import ARCHIVE_CACHE, REPO_ROOT, tiny_archives

logger = logging.getLogger(__name__)

#: Image tag of the test (never the user's ``explain-service:latest``); kept after the test as a build cache.
TEST_IMAGE = "explain-service:test"
#: Bounds of each step, in seconds: a cold build (no layer cache: torch and the dependencies are installed) takes a
#: few minutes on a shared 2-core machine; with the cache, seconds.
COLD_UP_TIMEOUT = 900
WARM_UP_TIMEOUT = 300
HEALTH_TIMEOUT = 300
DOWN_TIMEOUT = 120


def engine_problem() -> str | None:
    """Why no container test can run here (no ``docker``, or ``docker info`` fails), or None when an engine answers."""
    return engine.engine_problem()


def skip_line(problem: str) -> str:
    """The one line the container test skips with: what is missing and what to install."""
    return f"container test: no container engine ({problem}); to run it, {INSTALL_HINT}, then make test"


@dataclass
class Stack:
    """One compose project of the test: its name, host ports and the environment ``make container-*`` runs with."""

    project: str
    ports: dict[str, int]
    models_dir: Path
    image: str = TEST_IMAGE
    outputs: list[str] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        """Environment of ``make container-up`` / ``container-down`` / ``container-token`` for this stack."""
        return {
            **engine.docker_env(),  # with DOCKER_HOST at Podman's socket where that is the engine
            "COMPOSE_PROJECT_NAME": self.project,
            "EXPLAIN_IMAGE": self.image,
            "MODEL_STORE_DIR": str(self.models_dir),
            "EXPLAIN_REST_PORT": str(self.ports["rest"]),
            "EXPLAIN_GRPC_PORT": str(self.ports["grpc"]),
            "PROMETHEUS_PORT": str(self.ports["prometheus"]),
            "GRAFANA_PORT": str(self.ports["grafana"]),
            "CONTAINER_TIMEOUT": str(HEALTH_TIMEOUT),
        }

    def make(self, target: str, timeout: float, *args: str) -> str:
        """Run ``make <target>`` in the repository root; returns its output.

        Raises:
            AssertionError: on a non-zero exit status or timeout, with the output.
        """
        try:
            result = subprocess.run(
                ["make", "--no-print-directory", target, *args],
                cwd=REPO_ROOT,
                env=self.env,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired as error:
            output = (error.stdout or b"").decode(errors="replace") if isinstance(error.stdout, bytes) else ""
            raise AssertionError(f"make {target} ran past {timeout:.0f} s:\n{output[-4000:]}") from None
        output = result.stdout + result.stderr
        self.outputs.append(output)
        assert result.returncode == 0, f"make {target} exited with {result.returncode}:\n{output[-6000:]}"
        return output

    def compose_command(self, *args: str) -> list[str]:
        """``docker compose -p <project> -f docker-compose.yml <args>``."""
        return ["docker", "compose", "-p", self.project, "-f", str(REPO_ROOT / "docker-compose.yml"), *args]

    @property
    def compose_env(self) -> dict[str, str]:
        """The environment of :meth:`compose`."""
        return {**self.env, "GRAFANA_ADMIN_PASSWORD": "unused-by-the-test"}

    def compose(self, *args: str, timeout: float = DOWN_TIMEOUT) -> subprocess.CompletedProcess[str]:
        """``docker compose -p <project> -f docker-compose.yml <args>`` (not checked)."""
        return subprocess.run(
            self.compose_command(*args), cwd=REPO_ROOT, env=self.compose_env, capture_output=True, text=True,
            timeout=timeout,
        )  # fmt: skip

    def containers(self, *, running_only: bool = False) -> list[str]:
        """Ids of the project's containers (by compose's project label)."""
        command = ["docker", "ps", "-q", "--filter", f"label=com.docker.compose.project={self.project}"]
        if not running_only:
            command.insert(2, "-a")
        result = subprocess.run(command, capture_output=True, text=True, timeout=30, check=True)
        return result.stdout.split()

    def container(self, service: str) -> str:
        """Id of the service's container."""
        command = ["docker", "ps", "-q", "--filter", f"label=com.docker.compose.project={self.project}"]
        command += ["--filter", f"label=com.docker.compose.service={service}"]
        ids = subprocess.run(command, capture_output=True, text=True, timeout=30, check=True).stdout.split()
        assert len(ids) == 1, f"expected one running {service} container in {self.project}, found {ids}"
        return ids[0]

    def inspect(self, service: str) -> dict[str, Any]:
        """``docker inspect`` of the service's container."""
        result = subprocess.run(
            ["docker", "inspect", self.container(service)], capture_output=True, text=True, timeout=30, check=True
        )
        return dict(json.loads(result.stdout)[0])

    def exec(self, service: str, *command: str) -> str:
        """Run a command in the service's container; returns its stdout."""
        result = subprocess.run(
            ["docker", "exec", self.container(service), *command], capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 0, result.stdout + result.stderr
        return result.stdout

    def token(self) -> str:
        """The inference key, read inside the container (``make container-token``)."""
        return self.make("container-token", 60).strip().splitlines()[-1]

    def teardown(self) -> None:
        """Remove everything of the project (containers, network, volumes), whatever state it is in."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.compose("down", "--volumes", "--remove-orphans", "--timeout", "10")
        leftovers = self.containers()
        if leftovers:
            subprocess.run(["docker", "rm", "-f", *leftovers], capture_output=True, timeout=60, check=False)
        label = f"label=com.docker.compose.project={self.project}"
        for kind in ("volume", "network"):
            listed = subprocess.run(
                ["docker", kind, "ls", "-q", "--filter", label], capture_output=True, text=True, timeout=30
            ).stdout.split()
            if listed:
                subprocess.run(["docker", kind, "rm", *listed], capture_output=True, timeout=60, check=False)

    def logs(self) -> str:
        """The last log lines of every service (for failure messages)."""
        result = self.compose("logs", "--no-color", "--tail", "30", timeout=60)
        return result.stdout + result.stderr


#: Project names of the test: ``explain-test-<pid of the pytest process>-<suffix>``.
PROJECT_PREFIX = "explain-test-"


def remove_stale_stacks() -> list[str]:
    """Tear down the stacks of earlier test runs whose pytest process is gone (killed before its teardown ran);
    returns their project names. Only projects named by this module are touched."""
    result = subprocess.run(
        ["docker", "ps", "-a", "--format", '{{.Label "com.docker.compose.project"}}'],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    stale = []
    for project in sorted(set(result.stdout.split())):
        found = re.fullmatch(re.escape(PROJECT_PREFIX) + r"(\d+)-\d+", project)
        if found and not pid_alive(int(found.group(1))):
            ports = dict.fromkeys(("rest", "grpc", "prometheus", "grafana"), 0)  # unused by `down`
            Stack(project=project, ports=ports, models_dir=ARCHIVE_CACHE).teardown()
            stale.append(project)
    return stale


def new_stack() -> Stack:
    """A stack with a unique project name, free host ports and the tiny archives as its model folder (stacks left
    by killed earlier runs are removed first)."""
    stale = remove_stale_stacks()
    if stale:
        logger.warning("removed the stacks of earlier, killed test runs: %s", stale)
    tiny_archives()
    free = Ports.free()
    ports = {"rest": free.inference, "grpc": free.grpc_inference, "prometheus": free.metrics, "grafana": free.exporter}
    return Stack(
        project=f"explain-test-{os.getpid()}-{int(time.time()) % 100000}", ports=ports, models_dir=ARCHIVE_CACHE
    )


@contextlib.contextmanager
def running_stack() -> Iterator[Stack]:
    """``make container-up`` a new stack; tear it down when the block ends, however it ends (a watchdog runs
    ``docker compose down`` if the test process is killed before its clean-up runs)."""
    stack = new_stack()
    down = stack.compose_command("down", "--volumes", "--remove-orphans", "--timeout", "10")
    guard = watch(os.getpid(), command=down, env=stack.compose_env)
    try:
        stack.make("container-up", COLD_UP_TIMEOUT)
        yield stack
    except BaseException:
        logger.error("container stack %s failed; service logs:\n%s", stack.project, stack.logs())
        raise
    finally:
        stack.teardown()
        guard.terminate()
        guard.wait(timeout=30)


def image_id(image: str) -> str:
    """The id of a local image."""
    result = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{.Id}}", image], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def container_ip(inspected: dict[str, Any]) -> str:
    """The container's address on its compose network."""
    networks = inspected["NetworkSettings"]["Networks"]
    return str(next(iter(networks.values()))["IPAddress"])


def connects(host: str, port: int, timeout: float = 3.0) -> bool:
    """Whether a TCP connection to ``host:port`` is accepted."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def prometheus_query(port: int, expression: str) -> dict[str, Any]:
    """An instant query of the stack's Prometheus (HTTP API); returns the decoded answer."""
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expression})
    try:
        with urllib.request.urlopen(url, timeout=15) as response:
            return dict(json.loads(response.read()))
    except urllib.error.HTTPError as error:  # 400/422: a bad expression, the body says why
        return dict(json.loads(error.read()))


def prometheus_get(port: int, path: str) -> dict[str, Any]:
    """GET a Prometheus API path (``/api/v1/rules``, ``/api/v1/targets``)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=15) as response:
        return dict(json.loads(response.read()))


def wait_until(condition: Callable[[], Any], timeout: float, interval: float = 2.0) -> Any:
    """Call ``condition`` until it returns something truthy (returned) or ``timeout`` passes (its last value)."""
    deadline = time.monotonic() + timeout
    value = condition()
    while not value and time.monotonic() < deadline:
        time.sleep(interval)
        value = condition()
    return value
