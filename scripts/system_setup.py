#!/usr/bin/env python3
"""Install (or name) the system packages the service and its tests need, before any virtualenv exists.

``make serve`` / ``make start`` run ``system_setup.py --for serve`` and ``make test`` runs ``--for test``: each checks
the programs its purpose needs and, when some are missing, installs their Debian packages with ``apt-get`` if it can
(running as root, or ``sudo`` without a password). Otherwise it stops with one message that lists exactly what is
missing and the command that installs it. ``--no-install`` only checks (and says the same).

The packages are the ones *this* release has: it reads ``/etc/os-release`` and asks ``apt-cache policy`` which
candidates are installable (Java 17, else 21; the ``python3.X-venv`` of the Python the virtualenv is made with, or a
``python3.X`` of 3.13, 3.12, 3.11 where the system's ``python3`` is outside 3.11-3.13). Where apt has no package
lists yet and cannot be updated, the table of the supported releases (:data:`RELEASES`: Debian 12 and 13, Ubuntu
22.04 and 24.04) answers instead. A package the release lacks is never named: a test tool it does not package is
reported in one line (the tests that need it fail until it is installed by other means), and a missing Java or Python
stops with what to do instead.

``--which-python`` prints the interpreter the virtualenv is made with (``$PYTHON`` when set, else the system's
``python3`` when it is 3.11-3.13, else the newest ``python3.13``/``python3.12``/``python3.11`` on ``PATH``), or says
what to install on this system.

For ``--for test`` it also starts the container engine for the container-stack test, but only where ``$ENGINE_SH``
names a script that installs and starts one (``.ci/run`` sets it on the project's build machines; such a script is
idempotent, about a second when the engine is already up). Elsewhere nothing is needed: a running Docker engine (or
Podman's Docker socket) is used if there is one, and the container test skips itself with one line saying what to
install if there is none.

Standard library only, any Python 3.9+: it runs with the system's ``python3`` before ``.venv`` is made.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: The Python versions the project supports (pyproject.toml's requires-python), newest first.
PYTHON_MINORS = (13, 12, 11)
SUPPORTED_PYTHONS = "3.11-3.13"
#: The Java versions TorchServe 0.12 runs on here, in order of preference (17 is TorchServe's documented one).
JAVA_MAJORS = (17, 21)
#: Debian ships venv's ensurepip in ``python3.X-venv``: without it ``python3 -m venv`` fails.
VENV_PROBE = ("-c", "import ensurepip, venv")

Which = Callable[[str], "str | None"]


@dataclass(frozen=True)
class OsRelease:
    """The fields of ``/etc/os-release`` this script uses."""

    id: str
    version_id: str
    pretty_name: str
    id_like: tuple[str, ...] = ()

    @property
    def key(self) -> tuple[str, str]:
        """``(ID, VERSION_ID)``, the key of :data:`RELEASES`."""
        return (self.id, self.version_id)


def read_os_release(paths: Sequence[Path] = (Path("/etc/os-release"), Path("/usr/lib/os-release"))) -> OsRelease | None:
    """The running system's release (the first of ``paths`` that exists), or None where there is no os-release."""
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except OSError:
            continue
        fields: dict[str, str] = {}
        for line in text.splitlines():
            key, sep, value = line.partition("=")
            if sep and key.strip() and not key.startswith("#"):
                words = shlex.split(value, comments=False, posix=True)
                fields[key.strip()] = words[0] if words else ""
        return OsRelease(
            id=fields.get("ID", "linux").lower(),
            version_id=fields.get("VERSION_ID", ""),
            pretty_name=fields.get("PRETTY_NAME") or fields.get("NAME", "this system"),
            id_like=tuple(fields.get("ID_LIKE", "").split()),
        )
    return None


@dataclass(frozen=True)
class Release:
    """What one supported release packages of the packages this script may install: the answer where apt cannot tell
    (no package lists), and the record of what was checked on each release."""

    name: str
    python3: str
    packages: frozenset[str]


_TEST_TOOLS = frozenset({"prometheus", "prometheus-process-exporter", "fonts-dejavu-core", "postgresql"})
#: The supported releases. Debian's rows were read with ``apt-cache policy`` in fresh Debian 12 and 13 images.
#: Ubuntu's follow Ubuntu's published archive (jammy: python3.11 and openjdk-21 in universe; Chromium only as a
#: snap) and were not run here: the project's machines reach Debian's archive only.
RELEASES: dict[tuple[str, str], Release] = {
    ("debian", "12"): Release(
        "Debian 12 (bookworm)",
        "3.11",
        _TEST_TOOLS | {"python3.11", "python3.11-venv", "openjdk-17-jre-headless", "chromium"},
    ),
    ("debian", "13"): Release(
        "Debian 13 (trixie)",
        "3.13",
        _TEST_TOOLS | {"python3.13", "python3.13-venv", "openjdk-21-jre-headless", "chromium"},
    ),
    ("ubuntu", "22.04"): Release(
        "Ubuntu 22.04 (jammy)",
        "3.10",
        _TEST_TOOLS
        | {"python3.10", "python3.10-venv", "python3.11", "python3.11-venv"}
        | {"openjdk-17-jre-headless", "openjdk-21-jre-headless"},
    ),
    ("ubuntu", "24.04"): Release(
        "Ubuntu 24.04 (noble)",
        "3.12",
        _TEST_TOOLS | {"python3.12", "python3.12-venv", "openjdk-17-jre-headless", "openjdk-21-jre-headless"},
    ),
}


def _always(_: str) -> bool:
    return True


@dataclass(frozen=True)
class Requirement:
    """One thing the machine must have, how to tell whether it is there, and the Debian packages that provide it.

    ``choices`` are alternative package sets in order of preference: the first one whose packages this release can
    install is installed. ``elsewhere`` says what to do where none can be (shown instead of a package name).
    ``pattern`` is a glob one of whose files must exist (a program off ``PATH``, in a versioned folder).
    """

    name: str
    choices: tuple[tuple[str, ...], ...]
    purposes: frozenset[str]
    command: str | None = None
    path: str | None = None
    probe: tuple[str, ...] = ()
    why: str = ""
    accept: Callable[[str], bool] = field(default=_always, compare=False)
    elsewhere: str = ""
    pattern: str | None = None

    def present(self, which: Which = shutil.which) -> bool:
        """True when the command is on ``PATH`` and acceptable, the file exists and the probe command (if any)
        succeeds."""
        found = which(self.command) if self.command is not None else None
        if self.command is not None and (found is None or not self.accept(found)):
            return False
        if self.path is not None and not Path(self.path).exists():
            return False
        if self.pattern is not None and not glob.glob(self.pattern):
            return False
        if self.probe and found is not None:
            return subprocess.run([found, *self.probe], capture_output=True, check=False).returncode == 0
        return True


SERVE = frozenset({"serve", "test"})
TEST = frozenset({"test"})


def java_major(java: str) -> int | None:
    """The major version ``java -version`` reports (``1.8`` is 8), or None when it does not run."""
    try:
        result = subprocess.run([java, "-version"], capture_output=True, text=True, check=False, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r'version "(\d+)(?:\.(\d+))?', result.stderr + result.stdout)
    if found is None:
        return None
    major = int(found.group(1))
    return int(found.group(2) or 0) if major == 1 else major


def java_is_recent(java: str) -> bool:
    """Whether ``java`` is Java 17 or newer (what TorchServe 0.12's frontend needs)."""
    major = java_major(java)
    return major is not None and major >= min(JAVA_MAJORS)


JAVA = Requirement(
    "java",
    tuple((f"openjdk-{major}-jre-headless",) for major in JAVA_MAJORS),
    SERVE,
    command="java",
    why="TorchServe's frontend (Java 17 or 21)",
    accept=java_is_recent,
    elsewhere="install a Java 17 or 21 runtime (for example Eclipse Temurin) and put its `java` on PATH",
)

# What the integration tests run for real (Prometheus, promtool, the process exporter, headless Chromium and its
# fonts, PostgreSQL's server for the records store); `serve` needs only Java and the virtualenv's Python.
TEST_REQUIREMENTS: tuple[Requirement, ...] = (
    Requirement("prometheus", (("prometheus",),), TEST, command="prometheus", why="scrapes the metrics in tests"),
    Requirement("promtool", (("prometheus",),), TEST, command="promtool", why="checks the alert rules"),
    Requirement(
        "prometheus-process-exporter",
        (("prometheus-process-exporter",),),
        TEST,
        command="prometheus-process-exporter",
        why="the worker-memory exporter of the stack",
    ),
    Requirement(
        "chromium",
        (("chromium",),),
        TEST,
        command="chromium",
        why="renders the HTML heatmap page",
        elsewhere="Ubuntu ships Chromium only as a snap: sudo snap install chromium",
    ),
    Requirement(
        "DejaVu fonts",
        (("fonts-dejavu-core",),),
        TEST,
        path="/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
        why="a deterministic page layout",
    ),
    Requirement(
        "postgresql",
        (("postgresql",),),
        TEST,
        pattern="/usr/lib/postgresql/*/bin/initdb",
        why="the PostgreSQL records store's tests start a server of their own",
    ),
)


def python_version(python: str) -> tuple[int, int] | None:
    """``(major, minor)`` of an interpreter, or None when it does not run."""
    try:
        result = subprocess.run(
            [python, "-c", "import sys; print('%d %d' % sys.version_info[:2])"],
            capture_output=True, text=True, check=False, timeout=60,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    parts = result.stdout.split()
    return (int(parts[0]), int(parts[1])) if result.returncode == 0 and len(parts) == 2 else None


def _supported(version: tuple[int, int] | None) -> bool:
    return version is not None and version[0] == 3 and version[1] in PYTHON_MINORS


@dataclass(frozen=True)
class Interpreter:
    """The Python the virtualenv is made with."""

    path: str
    version: tuple[int, int]


def choose_python(
    override: str | None,
    which: Which = shutil.which,
    version_of: Callable[[str], tuple[int, int] | None] = python_version,
) -> Interpreter | None:
    """``$PYTHON`` when set (None unless it runs a supported version), else the system's ``python3`` when it is
    3.11-3.13, else the newest ``python3.1x`` of those on ``PATH``; None when there is none."""
    names = [override] if override else ["python3", *(f"python3.{minor}" for minor in PYTHON_MINORS)]
    for name in names:
        path = which(name)
        if path is None:
            continue
        version = version_of(path)
        if _supported(version):
            assert version is not None
            return Interpreter(path, version)
    return None


def python_requirement(
    environ: Mapping[str, str] | None = None,
    which: Which = shutil.which,
    version_of: Callable[[str], tuple[int, int] | None] = python_version,
) -> Requirement:
    """The virtualenv's Python as a requirement: the chosen interpreter with its ``python3.X-venv``; where none is
    chosen, a ``python3.X`` of 3.13, 3.12, 3.11 (the first this release packages), or, for an unusable ``$PYTHON``,
    no package at all."""
    override = (os.environ if environ is None else environ).get("PYTHON") or None
    why = f"the virtualenv's Python ({SUPPORTED_PYTHONS}, with venv)"
    chosen = choose_python(override, which, version_of)
    if chosen is not None:
        minor = chosen.version[1]
        return Requirement(
            f"python3.{minor}", ((f"python3.{minor}", f"python3.{minor}-venv"),), SERVE,
            command=chosen.path, probe=VENV_PROBE, why=why,
            elsewhere=f"make `{chosen.path} -m venv` work (install its venv module), or set PYTHON= to another Python",
        )  # fmt: skip

    def supported(path: str) -> bool:
        return _supported(version_of(path))

    if override:
        named = re.fullmatch(r"python3\.(\d+)", override)
        wanted = int(named.group(1)) if named else None
        choices = ((f"python3.{wanted}", f"python3.{wanted}-venv"),) if wanted in PYTHON_MINORS else ()
        return Requirement(
            f"PYTHON={override}", choices, SERVE, command=override, probe=VENV_PROBE, why=why, accept=supported,
            elsewhere=f"not a Python {SUPPORTED_PYTHONS} with venv that runs here: set PYTHON to one, or unset it "
            "to use the system's python3",
        )  # fmt: skip
    return Requirement(
        f"Python {SUPPORTED_PYTHONS}",
        tuple((f"python3.{minor}", f"python3.{minor}-venv") for minor in PYTHON_MINORS),
        SERVE,
        command="python3",
        probe=VENV_PROBE,
        why=why,
        accept=supported,
        elsewhere=f"install a Python {SUPPORTED_PYTHONS} with its venv module and run again with PYTHON=/path/to/it",
    )


def requirements(environ: Mapping[str, str] | None = None, which: Which = shutil.which) -> tuple[Requirement, ...]:
    """Everything this script checks, in order: Java, the virtualenv's Python, then the test tools."""
    return (JAVA, python_requirement(environ, which), *TEST_REQUIREMENTS)


def missing(purpose: str, which: Which = shutil.which, environ: Mapping[str, str] | None = None) -> list[Requirement]:
    """The requirements of ``purpose`` (``serve`` or ``test``) that this machine lacks."""
    return [req for req in requirements(environ, which) if purpose in req.purposes and not req.present(which)]


#: A package every Debian and Ubuntu has: when apt gives it no candidate, apt has no package lists to answer from.
_APT_SENTINEL = "base-files"


def parse_policy(text: str) -> dict[str, bool]:
    """``apt-cache policy`` output (``LC_ALL=C``) → whether each package it knows has an installable candidate.
    Packages apt has never heard of are not in its output."""
    answers: dict[str, bool] = {}
    current: str | None = None
    for line in text.splitlines():
        if line and not line[0].isspace() and line.rstrip().endswith(":"):
            current = line.rstrip()[:-1]
        elif current is not None and line.strip().startswith("Candidate:"):
            answers[current] = line.split(":", 1)[1].strip() not in {"(none)", ""}
    return answers


def apt_answers(packages: Sequence[str]) -> dict[str, bool] | None:
    """Whether apt can install each of ``packages`` here (one ``apt-cache policy`` call), or None when apt cannot
    tell: no ``apt-cache``, or no package lists yet."""
    if shutil.which("apt-cache") is None:
        return None
    env = {**os.environ, "LC_ALL": "C"}
    result = subprocess.run(
        ["apt-cache", "policy", _APT_SENTINEL, *packages], capture_output=True, text=True, check=False, env=env
    )
    known = parse_policy(result.stdout)
    if not known.get(_APT_SENTINEL):
        return None
    return {name: known.get(name, False) for name in packages}


def installable(package: str, answers: Mapping[str, bool] | None, release: OsRelease | None) -> bool:
    """Whether this release can install ``package``: apt's answer, else the table of :data:`RELEASES`; True where
    neither can tell (an unknown release with no package lists: the install itself will say)."""
    if answers is not None and package in answers:
        return answers[package]
    known = RELEASES.get(release.key) if release is not None else None
    return package in known.packages if known is not None else True


@dataclass
class Plan:
    """What to install for the lacking requirements, and the ones this release packages nothing for."""

    packages: list[str]
    provided: list[Requirement]
    unavailable: list[Requirement]


def make_plan(lacking: Sequence[Requirement], answers: Mapping[str, bool] | None, release: OsRelease | None) -> Plan:
    """For each lacking requirement, its first choice whose packages this release can all install."""
    plan = Plan([], [], [])
    for req in lacking:
        choice = next((c for c in req.choices if all(installable(p, answers, release) for p in c)), None)
        if choice is None:
            plan.unavailable.append(req)
            continue
        plan.provided.append(req)
        plan.packages.extend(p for p in choice if p not in plan.packages)
    return plan


def packages_of(requirements: Sequence[Requirement]) -> list[str]:
    """The preferred packages of ``requirements`` (each requirement's first choice), each once, in order."""
    return list(dict.fromkeys(pkg for req in requirements for pkg in (req.choices[0] if req.choices else ())))


def update_command(as_root: bool) -> list[str]:
    """``apt-get update`` (prefixed with ``sudo -n`` when not root)."""
    return [*([] if as_root else ["sudo", "-n"]), "apt-get", "update", "-qq"]


def install_command(packages: Sequence[str], as_root: bool) -> list[str]:
    """The ``apt-get install`` command for ``packages`` (prefixed with ``sudo -n`` when not root)."""
    prefix = [] if as_root else ["sudo", "-n"]
    return [*prefix, "env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "install", "-y", "-qq",
            "--no-install-recommends", *packages]  # fmt: skip


def system_name(release: OsRelease | None) -> str:
    """How messages name this system."""
    return release.pretty_name if release is not None else "this system"


def refusal(requirements: Sequence[Requirement], packages: Sequence[str], reason: str) -> str:
    """The one message printed when packages are missing and cannot be installed here."""
    lines = [f"system set-up: missing {', '.join(req.name for req in requirements)} ({reason}). Install them with:", ""]
    lines.append("    sudo apt-get update && sudo apt-get install -y --no-install-recommends " + " ".join(packages))
    lines.append("")
    lines.extend(f"  {req.name}: {req.why}" for req in requirements)
    lines.append("then run the make target again.")
    return "\n".join(lines)


def unavailable_message(req: Requirement, release: OsRelease | None) -> str:
    """One line for a requirement this release packages nothing for (or, with no choices at all, that no package
    can provide)."""
    if not req.choices:
        return f"system set-up: {req.name}: {req.elsewhere}"
    tail = "" if "serve" in req.purposes else "; the tests that need it fail until it is there"
    where = system_name(release)
    return f"system set-up: {req.name} ({req.why}) is not packaged for apt on {where}: {req.elsewhere}{tail}"


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


def ensure_packages(purpose: str, allow_install: bool, release: OsRelease | None = None) -> int:
    """Install what ``purpose`` lacks (the packages this release has), or print what to install. Returns the exit
    status: 1 when Java or Python cannot be had, or packages are missing and cannot be installed here."""
    lacking = missing(purpose)
    if not lacking:
        return 0
    release = release or read_os_release()
    possible, as_root, why_not = can_install()
    if not allow_install:
        possible, why_not = False, "--no-install"
    if possible:  # apt's lists say what this release has: bring them up to date first
        updated = subprocess.run(update_command(as_root), check=False)
        if updated.returncode != 0:
            print("system set-up: `apt-get update` failed; deciding from the package lists there are", file=sys.stderr)
    candidates = list(dict.fromkeys(p for req in lacking for choice in req.choices for p in choice))
    plan = make_plan(lacking, apt_answers(candidates), release)
    for req in plan.unavailable:
        print(unavailable_message(req, release), file=sys.stderr)
    fatal = any("serve" in req.purposes for req in plan.unavailable)
    if not plan.packages:
        return 1 if fatal else 0
    if not possible:
        print(refusal(plan.provided, plan.packages, why_not), file=sys.stderr)
        return 1
    print(
        f"system set-up: installing {' '.join(plan.packages)} on {system_name(release)} "
        f"(for {', '.join(r.name for r in plan.provided)})",
        flush=True,
    )
    started = time.monotonic()
    command = install_command(plan.packages, as_root)
    result = subprocess.run(command, check=False)
    if result.returncode != 0:
        print(f"system set-up: `{shlex.join(command)}` failed (exit {result.returncode})", file=sys.stderr)
        return 1
    unavailable = {req.name for req in plan.unavailable}
    still = [req for req in missing(purpose) if req.name not in unavailable]
    if still:
        print(refusal(still, packages_of(still), "still missing after apt-get install"), file=sys.stderr)
        return 1
    print(f"system set-up: installed in {time.monotonic() - started:.0f} s", flush=True)
    return 1 if fatal else 0


def which_python(environ: Mapping[str, str] | None = None, release: OsRelease | None = None) -> int:
    """Print the interpreter the virtualenv is made with; or, when there is none that can make one, say what to
    install on this system (stderr) and return 1."""
    req = python_requirement(environ)
    if req.present():
        print(req.command)
        return 0
    release = release or read_os_release()
    plan = make_plan([req], apt_answers([p for choice in req.choices for p in choice]), release)
    if plan.packages:
        print(
            f"no Python {SUPPORTED_PYTHONS} with venv for the virtualenv: on {system_name(release)} run\n"
            f"    sudo apt-get install -y {' '.join(plan.packages)}\n"
            "(`make setup`, `make serve` and `make test` install it where they can) or set PYTHON= to one",
            file=sys.stderr,
        )
    else:
        print(unavailable_message(req, release), file=sys.stderr)
    return 1


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
    """Command line: ``system_setup.py --for serve|test [--no-install] [--no-engine]``, or ``--which-python``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--for", dest="purpose", choices=("serve", "test"), default="test")
    parser.add_argument("--no-install", action="store_true", help="only check; print what to install")
    parser.add_argument("--no-engine", action="store_true", help="do not start the container engine")
    parser.add_argument(
        "--which-python", action="store_true", help="print the Python the virtualenv is made with ($PYTHON overrides)"
    )
    args = parser.parse_args(argv)
    if args.which_python:
        return which_python()
    status = ensure_packages(args.purpose, allow_install=not args.no_install)
    if status == 0 and args.purpose == "test" and not args.no_engine:
        status = ensure_engine(allow_install=not args.no_install)
    return status


if __name__ == "__main__":
    sys.exit(main())
