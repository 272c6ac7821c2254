#!/usr/bin/env python3
"""Install (or name) the system packages the service and its tests need, before any virtualenv exists.

``make serve`` / ``make start`` run ``system_setup.py --for serve`` and ``make test`` runs ``--for test``: each checks
the programs its purpose needs and, when some are missing, installs their Debian packages with ``apt-get`` if it can
(running as root, or ``sudo`` without a password). Otherwise it stops with one message that lists exactly what is
missing and the command that installs it. ``--no-install`` only checks (and says the same).

For ``--for test`` it also starts the container engine for the container-stack test, but only where ``$ENGINE_SH``
names a script that installs and starts one (``.ci/run`` sets it on the project's build machines; such a script is
idempotent, about a second when the engine is already up). Elsewhere nothing is needed: a running Docker engine (or
Podman's Docker socket) is used if there is one, and the container test skips itself with one line saying what to
install if there is none.

Standard library only, any Python 3.8+: it runs with the system's ``python3`` before ``.venv`` is made.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Requirement:
    """One thing the machine must have, how to tell whether it is there, and the Debian packages that provide it."""

    name: str
    packages: tuple[str, ...]
    purposes: frozenset[str]
    command: str | None = None
    path: str | None = None
    probe: tuple[str, ...] = ()
    why: str = ""

    def present(self, which: Callable[[str], str | None] = shutil.which) -> bool:
        """True when the command is on ``PATH``, the file exists and the probe command (if any) succeeds."""
        found = which(self.command) if self.command is not None else None
        if self.command is not None and found is None:
            return False
        if self.path is not None and not Path(self.path).exists():
            return False
        if self.probe and found is not None:
            return subprocess.run([found, *self.probe], capture_output=True, check=False).returncode == 0
        return True


SERVE = frozenset({"serve", "test"})
TEST = frozenset({"test"})

# The one list of system packages. `serve` needs what TorchServe and the virtualenv need; `test` adds what the
# integration tests run for real (Prometheus, promtool, the process exporter, headless Chromium and its fonts).
REQUIREMENTS: tuple[Requirement, ...] = (
    Requirement("java", ("openjdk-17-jre-headless",), SERVE, command="java", why="TorchServe's frontend (Java 17)"),
    Requirement(
        "python3.11",
        ("python3.11", "python3.11-venv"),
        SERVE,
        command=os.environ.get("PYTHON", "python3.11"),
        probe=("-c", "import ensurepip, venv"),  # Debian ships venv's ensurepip in python3.11-venv
        why="the virtualenv",
    ),
    Requirement("prometheus", ("prometheus",), TEST, command="prometheus", why="scrapes the metrics in tests"),
    Requirement("promtool", ("prometheus",), TEST, command="promtool", why="checks the alert rules"),
    Requirement(
        "prometheus-process-exporter",
        ("prometheus-process-exporter",),
        TEST,
        command="prometheus-process-exporter",
        why="the worker-memory exporter of the stack",
    ),
    Requirement("chromium", ("chromium",), TEST, command="chromium", why="renders the HTML heatmap page"),
    Requirement(
        "DejaVu fonts",
        ("fonts-dejavu-core",),
        TEST,
        path="/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
        why="a deterministic page layout",
    ),
)


def missing(purpose: str, which: Callable[[str], str | None] = shutil.which) -> list[Requirement]:
    """The requirements of ``purpose`` (``serve`` or ``test``) that this machine lacks."""
    return [req for req in REQUIREMENTS if purpose in req.purposes and not req.present(which)]


def packages_of(requirements: Sequence[Requirement]) -> list[str]:
    """The Debian packages that provide ``requirements``, each once, in order."""
    return list(dict.fromkeys(pkg for req in requirements for pkg in req.packages))


def install_command(packages: Sequence[str], as_root: bool) -> list[list[str]]:
    """The apt-get commands that install ``packages`` (prefixed with ``sudo -n`` when not root)."""
    prefix = [] if as_root else ["sudo", "-n"]
    return [
        [*prefix, "apt-get", "update", "-qq"],
        [*prefix, "env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "install", "-y", "-qq", "--no-install-recommends",
         *packages],
    ]  # fmt: skip


def refusal(requirements: Sequence[Requirement], reason: str) -> str:
    """The one message printed when packages are missing and cannot be installed here."""
    lines = [f"system set-up: missing {', '.join(req.name for req in requirements)} ({reason}). Install them with:", ""]
    lines.append("    sudo apt-get update && sudo apt-get install -y --no-install-recommends " + " ".join(
        packages_of(requirements)))  # fmt: skip
    lines.append("")
    lines.extend(f"  {req.name}: {req.why}" for req in requirements)
    lines.append("then run the make target again.")
    return "\n".join(lines)


def can_install() -> tuple[bool, bool, str]:
    """Whether apt-get can be run here: ``(possible, as_root, why_not)``."""
    if shutil.which("apt-get") is None:
        return False, False, "no apt-get on this machine"
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        return True, True, ""
    if shutil.which("sudo") is not None:
        if subprocess.run(["sudo", "-n", "true"], capture_output=True, check=False).returncode == 0:
            return True, False, ""
        return False, False, "not root, and sudo asks for a password"
    return False, False, "not root, and no sudo"


def ensure_packages(purpose: str, allow_install: bool) -> int:
    """Install what ``purpose`` lacks, or print what to install. Returns the exit status."""
    lacking = missing(purpose)
    if not lacking:
        return 0
    possible, as_root, why_not = can_install()
    if not allow_install:
        possible, why_not = False, "--no-install"
    if not possible:
        print(refusal(lacking, why_not), file=sys.stderr)
        return 1
    packages = packages_of(lacking)
    print(f"system set-up: installing {' '.join(packages)} (for {', '.join(r.name for r in lacking)})", flush=True)
    started = time.monotonic()
    for command in install_command(packages, as_root):
        result = subprocess.run(command, check=False)
        if result.returncode != 0:
            print(f"system set-up: `{shlex.join(command)}` failed (exit {result.returncode})", file=sys.stderr)
            return 1
    still = missing(purpose)
    if still:
        print(refusal(still, "still missing after apt-get install"), file=sys.stderr)
        return 1
    print(f"system set-up: installed in {time.monotonic() - started:.0f} s", flush=True)
    return 0


def engine_script() -> Path | None:
    """The container-engine script ``$ENGINE_SH`` names (relative paths: to the repository root), or None when unset:
    a machine with a running Docker engine, or Podman's Docker socket, needs none."""
    configured = os.environ.get("ENGINE_SH")
    return ROOT / configured if configured else None


def engine_answers() -> bool:
    """True when a Docker engine answers ``docker info``."""
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "info"], capture_output=True, check=False).returncode == 0


def ensure_engine(allow_install: bool) -> int:
    """Start the container engine through ``$ENGINE_SH`` when it names a script (nothing to do otherwise: the container
    test uses a running engine, or says in one line what to install)."""
    script = engine_script()
    if script is None:
        return 0
    if not script.is_file():
        print(f"system set-up: ENGINE_SH={os.environ.get('ENGINE_SH')} is not a file: not starting an engine")
        return 0
    if not allow_install:
        if engine_answers():
            return 0
        print(f"system set-up: no container engine is running; start it with `{script} start`", file=sys.stderr)
        return 1
    # Always run it: it returns in about a second when the engine and its stand-in base images are already there.
    print(f"system set-up: container engine ({script} start; 1-2 min the first time)", flush=True)
    result = subprocess.run(["bash", str(script), "start"], check=False)
    if result.returncode != 0:
        print(f"system set-up: `{script} start` failed (exit {result.returncode})", file=sys.stderr)
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``system_setup.py --for serve|test [--no-install] [--no-engine]``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--for", dest="purpose", choices=("serve", "test"), default="test")
    parser.add_argument("--no-install", action="store_true", help="only check; print what to install")
    parser.add_argument("--no-engine", action="store_true", help="do not start the container engine")
    args = parser.parse_args(argv)
    status = ensure_packages(args.purpose, allow_install=not args.no_install)
    if status == 0 and args.purpose == "test" and not args.no_engine:
        status = ensure_engine(allow_install=not args.no_install)
    return status


if __name__ == "__main__":
    sys.exit(main())
