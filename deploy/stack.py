"""Build the image and bring the compose stack up or down: ``make container-up`` / ``make container-down``.

``up`` builds the image from the ``Dockerfile`` (``docker build``; the layer cache makes a rebuild without changes
take seconds), starts ``explain``, ``prometheus`` and ``process-exporter`` from ``docker-compose.yml`` (and
``grafana`` when its image is present locally), waits until the ``explain`` container's healthcheck reports
healthy, and prints the published addresses and how to read the token. ``down`` stops and removes the project's
containers and network (``--volumes``: its volumes too: tokens, Prometheus data, Grafana state).

The engine: a running Docker engine, or Podman through its Docker socket (:mod:`deploy.engine`), with the
Dockerfile's default torch index (``TORCH_INDEX_URL`` overrides it). Only where ``$ENGINE_SH`` names a script that
installs and starts an engine (``.ci/run`` sets it on the project's build machines, which reach no image registry),
``up`` runs its ``start`` and builds with ``--network host`` against the CPU torch wheel index its ``torch-index``
serves.

Settings (environment variables, all optional; the Makefile passes its command-line variables through):

========================  ==========================================================================================
``COMPOSE_PROJECT_NAME``  compose project (default ``explain-service``); containers, network and volumes are its own
``EXPLAIN_IMAGE``         image tag to build and run (default ``explain-service:latest``)
``MODEL_STORE_DIR``       a host folder of built archives (``make models`` leaves them in ``model_store/build``),
                          mounted read-only with ``deploy/docker-compose.models.yml``; the image is then built with
                          ``BUILD_MODELS=false``. Unset: the image builds the default models itself (once, ~10 min)
``BUILD_MODELS``          ``true``/``false``: override the choice above
``EXPLAIN_REST_PORT``,    host loopback ports (defaults 8080, 7070, 9090, 3000)
``EXPLAIN_GRPC_PORT``,
``PROMETHEUS_PORT``,
``GRAFANA_PORT``
``CONTAINER_TIMEOUT``     seconds to wait for healthy (default 600)
========================  ==========================================================================================
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import secrets
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from deploy.engine import INSTALL_HINT, docker_env, engine_problem

logger = logging.getLogger("deploy.stack")

REPO_ROOT = Path(__file__).resolve().parent.parent
COMPOSE_FILE = REPO_ROOT / "docker-compose.yml"
MODELS_OVERRIDE = REPO_ROOT / "deploy" / "docker-compose.models.yml"
DEFAULT_PROJECT = "explain-service"
DEFAULT_IMAGE = "explain-service:latest"
#: The services ``up`` always starts; ``grafana`` joins them when its image is present.
CORE_SERVICES = ("explain", "prometheus", "process-exporter")
#: Container ports published on the host (compose ``ports`` of ``explain``) and the variables that move them.
PUBLISHED = {8080: "EXPLAIN_REST_PORT", 7070: "EXPLAIN_GRPC_PORT", 9090: "PROMETHEUS_PORT"}
#: Run inside the ``explain`` container: prints the inference key TorchServe wrote at its start.
TOKEN_SCRIPT = "import json; print(json.load(open('run/key_file.json'))['inference']['key'])"


class StackError(RuntimeError):
    """The stack could not be built, started or stopped; the message says what to do."""


@dataclass(frozen=True)
class Engine:
    """How to reach Docker: the helper script (if any) and the torch wheel index for the build."""

    script: Path | None
    torch_index: str | None

    @property
    def build_network(self) -> list[str]:
        """``--network host`` when the torch index is served on this machine's loopback."""
        return ["--network", "host"] if self.script is not None else []


def _run(command: Sequence[str], *, capture: bool = False, timeout: float | None = None) -> str:
    """Run ``command`` in the repository root; its output goes to ours unless ``capture`` (then it is returned).

    Raises:
        StackError: on a non-zero exit status, with the command and (captured) output.
    """
    logger.debug("$ %s", " ".join(command))
    result = subprocess.run(
        list(command), cwd=REPO_ROOT, text=True, capture_output=capture, timeout=timeout, check=False
    )
    if result.returncode != 0:
        detail = (result.stdout or "") + (result.stderr or "") if capture else ""
        raise StackError(f"`{' '.join(command)}` exited with {result.returncode}\n{detail}".rstrip())
    return result.stdout if capture else ""


def engine() -> Engine:
    """Start the engine through ``$ENGINE_SH`` when it is set (and take its torch index), else check that Docker (or
    Podman's Docker socket) answers.

    Raises:
        StackError: if ``$ENGINE_SH`` is not a file, or no engine answers.
    """
    value = os.environ.get("ENGINE_SH", "")
    script = (REPO_ROOT / value).resolve() if value else None
    if script is not None and not script.is_file():
        raise StackError(f"ENGINE_SH={value} is not a file: unset it to use the running Docker engine")
    if script is not None:
        # run through bash: a copy of the script may have lost its executable bit
        logger.info("engine: %s start", script)
        _run(["bash", str(script), "start"])
        index = os.environ.get("TORCH_INDEX_URL") or _run(["bash", str(script), "torch-index"], capture=True).strip()
        return Engine(script, index)
    os.environ.update(docker_env())  # Podman's Docker socket, when that is the engine here
    problem = engine_problem()
    if problem is not None:
        raise StackError(f"no container engine ({problem}): {INSTALL_HINT}")
    return Engine(None, os.environ.get("TORCH_INDEX_URL") or None)


def models_dir() -> Path | None:
    """The host folder of archives to mount (``$MODEL_STORE_DIR``, relative to the repository root), or None.

    Raises:
        StackError: if it is set but has no archive of a default model.
    """
    value = os.environ.get("MODEL_STORE_DIR", "")
    if not value:
        return None
    folder = (REPO_ROOT / value).resolve()
    missing = [name for name in ("sentiment", "digits") if not (folder / name / "archive" / "MAR-INF").is_dir()]
    if missing:
        raise StackError(
            f"MODEL_STORE_DIR={value} has no archive of {missing} (<name>/archive/MAR-INF): run `make models` "
            "(it builds them into model_store/build) or leave MODEL_STORE_DIR unset to build them into the image"
        )
    return folder


def compose_command(folder: Path | None) -> list[str]:
    """``docker compose -f ... [-f deploy/docker-compose.models.yml]`` for this project."""
    command = ["docker", "compose", "-p", os.environ["COMPOSE_PROJECT_NAME"], "-f", str(COMPOSE_FILE)]
    if folder is not None:
        command += ["-f", str(MODELS_OVERRIDE)]
    return command


def build(image: str, build_models: bool, found: Engine) -> float:
    """``docker build`` the image (layer cache on); returns the seconds it took."""
    command = ["docker", "build", *found.build_network, "-t", image]
    command += ["--build-arg", f"BUILD_MODELS={'true' if build_models else 'false'}"]
    if found.torch_index:
        command += ["--build-arg", f"TORCH_INDEX_URL={found.torch_index}"]
    started = time.monotonic()
    logger.info("building %s (BUILD_MODELS=%s)", image, str(build_models).lower())
    _run([*command, str(REPO_ROOT)])
    return time.monotonic() - started


def grafana_image() -> str:
    """The Grafana image ``docker-compose.yml`` names."""
    match = re.search(r"^\s+image:\s*(grafana/\S+)", COMPOSE_FILE.read_text(encoding="utf-8"), flags=re.MULTILINE)
    if match is None:
        raise StackError(f"no grafana image in {COMPOSE_FILE}")
    return match.group(1)


def _image_present(image: str) -> bool:
    result = subprocess.run(["docker", "image", "inspect", image], capture_output=True, check=False)
    return result.returncode == 0


def container_id(compose: list[str], service: str) -> str:
    """The id of the service's container (empty if there is none)."""
    return _run([*compose, "ps", "-q", service], capture=True).strip()


def wait_healthy(compose: list[str], timeout: float) -> float:
    """Wait until ``explain``'s healthcheck reports healthy; returns the seconds waited.

    Raises:
        StackError: if the container exits, turns unhealthy or is not healthy within ``timeout`` (with its last log
            lines).
    """
    started = time.monotonic()
    ident = container_id(compose, "explain")
    if not ident:
        raise StackError("compose started no explain container")
    status = health = None
    while time.monotonic() - started < timeout:
        state = json.loads(_run(["docker", "inspect", "--format", "{{json .State}}", ident], capture=True))
        status, health = state.get("Status"), (state.get("Health") or {}).get("Status")
        if health == "healthy":
            return time.monotonic() - started
        if status in {"exited", "dead"} or health == "unhealthy":
            break
        time.sleep(1.0)
    logs = subprocess.run(
        [*compose, "logs", "--no-color", "--tail", "40", "explain"], capture_output=True, text=True, check=False
    )
    raise StackError(
        f"explain did not become healthy within {time.monotonic() - started:.0f} s (container {status}, "
        f"health {health}); last log lines:\n{logs.stdout}{logs.stderr}"
    )


def service_container(project: str, service: str) -> str:
    """The id of a running container of ``service`` in ``project`` (found by compose's labels, so without parsing
    the compose file, which needs its variables), or an empty string."""
    labels = [f"label=com.docker.compose.project={project}", f"label=com.docker.compose.service={service}"]
    command = ["docker", "ps", "-q", *(item for label in labels for item in ("--filter", label))]
    return _run(command, capture=True).strip().split("\n")[0]


def token(project: str, key: str = "inference") -> str:
    """A key of the running stack's ``key_file.json`` (``inference``, ``management`` or ``API``), read inside the
    ``explain`` container.

    Raises:
        StackError: if the stack is not running.
    """
    ident = service_container(project, "explain")
    if not ident:
        raise StackError(f"no running explain container in project {project}: run `make container-up` first")
    script = TOKEN_SCRIPT.replace("'inference'", repr(key))
    return _run(["docker", "exec", ident, "python", "-c", script], capture=True).strip()


def published_ports(compose: list[str]) -> dict[int, str]:
    """Container port → the host address it is published on (``docker compose port``)."""
    return {port: _run([*compose, "port", "explain", str(port)], capture=True).strip() for port in PUBLISHED}


def usage(compose: list[str], addresses: dict[int, str], grafana: bool) -> str:
    """What to tell the user once the stack is healthy."""
    project = compose[3]
    rest, grpc, prometheus = addresses[8080], addresses[7070], addresses[9090]
    lines = [
        f"The explanation stack is up (project {project}).",
        f"  REST inference  http://{rest}   gRPC inference {grpc}   Prometheus http://{prometheus}",
    ]
    if grafana:
        lines.append(f"  Grafana         http://127.0.0.1:{os.environ.get('GRAFANA_PORT', '3000')} (user admin)")
    lines += [
        "  Management (8081/7071) and metrics (8082/8083) stay on the container's loopback.",
        "Token (TorchServe writes new keys at every start; read from inside the container):",
        "  TOKEN=$(make -s container-token)      # or, with plain Docker:",
        f"  TOKEN=$(docker exec $(docker ps -q --filter label=com.docker.compose.project={project} "
        f'--filter label=com.docker.compose.service=explain) python -c "{TOKEN_SCRIPT}")',
        "  curl -s -H \"Authorization: Bearer $TOKEN\" -H 'Content-Type: application/json' \\",
        f"       http://{rest}/explanations/sentiment \\",
        '       -d \'{"text": "what a lovely day", "explain": {"method": "relevance"}}\'',
        "Stop: make container-down (VOLUMES=1 also removes the tokens and Prometheus data).",
    ]
    return "\n".join(lines)


def _defaults() -> bool:
    """Fill in the defaults of the settings; returns whether a Grafana password was generated."""
    os.environ.setdefault("COMPOSE_PROJECT_NAME", DEFAULT_PROJECT)
    os.environ.setdefault("EXPLAIN_IMAGE", DEFAULT_IMAGE)
    # The compose file refuses to parse without a Grafana admin password (no default password, ever); when none is
    # set, a random one is generated for this call (and printed if Grafana starts; Grafana keeps its first one).
    if os.environ.get("GRAFANA_ADMIN_PASSWORD"):
        return False
    os.environ["GRAFANA_ADMIN_PASSWORD"] = secrets.token_urlsafe(18)
    return True


def up() -> str:
    """Build, start, wait until healthy; returns the usage text.

    Raises:
        StackError: if any step fails.
    """
    generated_password = _defaults()
    found = engine()
    folder = models_dir()
    build_models = os.environ.get("BUILD_MODELS", "false" if folder else "true").lower() == "true"
    if folder is not None:
        os.environ["MODEL_STORE_DIR"] = str(folder)
        logger.info("serving the archives of %s (mounted read-only)", folder)
    elif not build_models:
        logger.warning("BUILD_MODELS=false and no MODEL_STORE_DIR: the container will build the models at start")
    image = os.environ["EXPLAIN_IMAGE"]
    build_seconds = build(image, build_models, found)
    compose = compose_command(folder)
    services = list(CORE_SERVICES)
    grafana = _image_present(grafana_image())
    if grafana:
        services.append("grafana")
    else:
        logger.info("no %s image here: starting %s without Grafana", grafana_image(), ", ".join(services))
    started = time.monotonic()
    _run([*compose, "up", "-d", "--no-build", *services])
    healthy = wait_healthy(compose, float(os.environ.get("CONTAINER_TIMEOUT", "600")))
    logger.info(
        "image built in %.1f s; up to healthy in %.1f s (waited %.1f s for the healthcheck)",
        build_seconds,
        time.monotonic() - started,
        healthy,
    )
    text = usage(compose, published_ports(compose), grafana)
    if grafana and generated_password:
        password = os.environ["GRAFANA_ADMIN_PASSWORD"]
        text += (
            f"\nGrafana admin password (generated; set GRAFANA_ADMIN_PASSWORD to choose one): {password}"
            " (Grafana takes it only on its first start, with an empty grafana-data volume)"
        )
    return text


def down(volumes: bool) -> None:
    """Stop and remove the project's containers and network (and volumes if ``volumes``).

    Raises:
        StackError: if compose fails.
    """
    _defaults()
    command = [*compose_command(None), "down", "--remove-orphans"]  # by project: the override adds no service
    if volumes:
        command.append("--volumes")
    _run(command)


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m deploy.stack", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("up", "down", "token"))
    parser.add_argument("--volumes", action="store_true", help="down: remove the volumes too")
    parser.add_argument("--key", default="inference", choices=("inference", "management", "API"), help="token: which")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="stack: %(message)s")
    try:
        if args.command == "up":
            print(up(), flush=True)
        elif args.command == "token":
            print(token(os.environ.get("COMPOSE_PROJECT_NAME") or DEFAULT_PROJECT, args.key))
        else:
            down(args.volumes)
    except StackError as error:
        logger.error("%s", error)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
