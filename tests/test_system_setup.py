"""The system set-up step (scripts/system_setup.py) that `make test` and `make serve` run before anything else: what it
installs on each supported release (never a package the release lacks), which Python the virtualenv is made with, and
its messages where nothing can be installed."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "system_setup.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("system_setup", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["system_setup"] = module
    spec.loader.exec_module(module)
    return module


setup = _load()

DEBIAN_12 = setup.OsRelease("debian", "12", "Debian GNU/Linux 12 (bookworm)")
DEBIAN_13 = setup.OsRelease("debian", "13", "Debian GNU/Linux 13 (trixie)")
UBUNTU_22 = setup.OsRelease("ubuntu", "22.04", "Ubuntu 22.04.5 LTS", ("debian",))
UBUNTU_24 = setup.OsRelease("ubuntu", "24.04", "Ubuntu 24.04.3 LTS", ("debian",))


def _bare_path(tmp_path: Path) -> dict[str, str]:
    """An environment whose PATH holds only a python3 (no java, prometheus, chromium, apt-get or sudo)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    env = {key: value for key, value in os.environ.items() if key not in {"PYTHON", "ENGINE_SH"}}
    env["PATH"] = str(bin_dir)
    env["ENGINE_SH"] = str(tmp_path / "no-engine.sh")
    return env


class FakeSystem:
    """A folder of stand-in programs for a fresh machine: Pythons that report a version and whether ``venv`` works
    (a marker file), a ``java`` that reports a version, and (optionally) apt: ``apt-cache policy`` answering from a
    fixed set of installable packages, ``apt-get`` recording its calls and "installing" what the stand-ins can be."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.bin = root / "bin"
        self.bin.mkdir(parents=True)
        self.calls = root / "apt-get.calls"
        for tool in ("env", "true", "cp", "touch"):
            (self.bin / tool).symlink_to(next(p for p in ("/usr/bin/" + tool, "/bin/" + tool) if Path(p).exists()))

    def which(self, name: str) -> str | None:
        path = self.bin / name
        return str(path) if path.exists() else None

    def _script(self, name: str, text: str) -> None:
        path = self.bin / name
        path.write_text("#!/bin/sh\n" + text)
        path.chmod(0o755)

    def python(self, name: str, version: str, venv: bool) -> None:
        marker = self.root / f"venv-{version}"
        if venv:
            marker.touch()
        major, minor = version.split(".")
        self._script(name, f'case "$*" in\n  *version_info*) echo "{major} {minor}" ;;\n'
                           f'  *ensurepip*) [ -e "{marker}" ] ;;\n  *) exit 2 ;;\nesac\n')  # fmt: skip

    def java(self, version: str) -> None:
        self._script("java", f"echo 'openjdk version \"{version}\" 2025-01-21' >&2\n")

    def apt(self, installable: set[str]) -> None:
        """apt-cache and apt-get: ``installable`` have a candidate; installing ``openjdk-N-jre-headless`` brings a
        Java N and ``python3.X-venv`` makes that Python's venv work."""
        answers = "".join(
            f'  {p}) printf "%s:\\n  Candidate: {"1.0" if p in installable else "(none)"}\\n" "$p" ;;\n'
            for p in sorted(installable | {"openjdk-17-jre-headless"})
        )
        self._script(
            "apt-cache",
            'shift\nfor p in "$@"; do\n  case "$p" in\n  base-files) printf "base-files:\\n  Candidate: 12.4\\n" ;;\n'
            f"{answers}  esac\ndone\n",
        )
        for major in (17, 21):
            java = self.root / f"java-{major}"
            java.write_text(f"#!/bin/sh\necho 'openjdk version \"{major}.0.1\" 2025-01-21' >&2\n")
            java.chmod(0o755)
        self._script(
            "apt-get",
            f'echo "$*" >> "{self.calls}"\nfor p in "$@"; do\n  case "$p" in\n'
            f"  openjdk-*-jre-headless) v=${{p#openjdk-}}; v=${{v%-jre-headless}};"
            f' cp "{self.root}/java-$v" "{self.bin}/java" ;;\n'
            f'  python3.*-venv) v=${{p#python}}; touch "{self.root}/venv-${{v%-venv}}" ;;\n'
            "  esac\ndone\n",
        )
        self._script("sudo", '[ "$1" = "-n" ] && shift\nexec "$@"\n')

    def environ(self, **extra: str) -> dict[str, str]:
        env = {key: value for key, value in os.environ.items() if key not in {"PYTHON", "ENGINE_SH"}}
        return {**env, "PATH": str(self.bin), **extra}


def _plan(system: FakeSystem, release: Any, purpose: str = "serve") -> Any:
    lacking = setup.missing(purpose, which=system.which, environ={})
    return setup.make_plan(lacking, None, release)


# --------------------------------------------------------------------------------------- the supported releases


@pytest.mark.parametrize(
    ("release", "python3", "expected"),
    [
        (DEBIAN_12, "3.11", ["openjdk-17-jre-headless", "python3.11", "python3.11-venv"]),
        (DEBIAN_13, "3.13", ["openjdk-21-jre-headless", "python3.13", "python3.13-venv"]),
        (UBUNTU_22, "3.10", ["openjdk-17-jre-headless", "python3.11", "python3.11-venv"]),
        (UBUNTU_24, "3.12", ["openjdk-17-jre-headless", "python3.12", "python3.12-venv"]),
    ],
)
def test_a_fresh_release_gets_its_own_java_and_python(
    tmp_path: Path, release: Any, python3: str, expected: list[str]
) -> None:
    """A fresh machine of each release (its python3 without venv, no Java), decided from the release table: the
    packages it has, never one it lacks (no Java 17 on Debian 13, no python3.11 on Ubuntu 24.04)."""
    system = FakeSystem(tmp_path)
    system.python("python3", python3, venv=python3 == "3.10")  # Ubuntu 22.04's own 3.10 is too old either way
    plan = _plan(system, release)
    assert plan.packages == expected
    assert plan.unavailable == []
    assert set(plan.packages) <= setup.RELEASES[release.key].packages


@pytest.mark.parametrize("release", [DEBIAN_12, DEBIAN_13, UBUNTU_22, UBUNTU_24])
def test_the_test_tools_are_named_only_where_the_release_packages_them(tmp_path: Path, release: Any) -> None:
    system = FakeSystem(tmp_path)
    system.python("python3", setup.RELEASES[release.key].python3, venv=True)
    system.python("python3.11", "3.11", venv=True)
    system.java("17.0.15")
    plan = _plan(system, release, purpose="test")
    assert set(plan.packages) <= setup.RELEASES[release.key].packages
    assert {"prometheus", "prometheus-process-exporter"} <= set(plan.packages)
    unavailable = [req.name for req in plan.unavailable]
    if release.id == "ubuntu":
        assert unavailable == ["chromium"] and "chromium" not in plan.packages
        message = setup.unavailable_message(plan.unavailable[0], release)
        assert "snap install chromium" in message and release.pretty_name in message
    else:
        assert unavailable == [] and "chromium" in plan.packages


def test_apt_answers_before_the_table(tmp_path: Path) -> None:
    """What apt-cache says is installable wins over the table (a backport, a derivative)."""
    system = FakeSystem(tmp_path)
    system.python("python3", "3.13", venv=False)
    lacking = setup.missing("serve", which=system.which, environ={})
    answers = {"openjdk-17-jre-headless": True, "python3.13": True, "python3.13-venv": True}
    assert setup.make_plan(lacking, answers, DEBIAN_13).packages[0] == "openjdk-17-jre-headless"
    unknown = setup.OsRelease("linuxmint", "22", "Linux Mint 22", ("ubuntu", "debian"))
    answers = {"openjdk-17-jre-headless": False, "openjdk-21-jre-headless": True}
    assert setup.make_plan(lacking, answers, unknown).packages == ["openjdk-21-jre-headless", "python3.13",
                                                                   "python3.13-venv"]  # fmt: skip


def test_no_java_or_python_packaged_stops_with_what_to_do(tmp_path: Path) -> None:
    system = FakeSystem(tmp_path)
    system.python("python3", "3.10", venv=True)
    lacking = setup.missing("serve", which=system.which, environ={})
    nothing = {package: False for req in lacking for choice in req.choices for package in choice}
    plan = setup.make_plan(lacking, nothing, setup.OsRelease("debian", "11", "Debian GNU/Linux 11 (bullseye)"))
    assert plan.packages == [] and [req.name for req in plan.unavailable] == ["java", "Python 3.11-3.13"]
    message = setup.unavailable_message(plan.unavailable[1], DEBIAN_12)
    assert "PYTHON=" in message and "not packaged for apt" in message


def test_an_old_java_is_not_enough(tmp_path: Path) -> None:
    system = FakeSystem(tmp_path)
    system.java("1.8.0_392")
    assert setup.java_major(str(system.bin / "java")) == 8
    assert not setup.JAVA.present(system.which)
    system.java("21.0.5")
    assert setup.java_major(str(system.bin / "java")) == 21 and setup.JAVA.present(system.which)


# ----------------------------------------------------------------------------------------- the virtualenv's Python


def test_the_system_python3_is_chosen_when_supported_else_the_newest_python3x(tmp_path: Path) -> None:
    system = FakeSystem(tmp_path)
    system.python("python3", "3.12", venv=True)
    system.python("python3.13", "3.13", venv=True)
    assert setup.choose_python(None, system.which) == setup.Interpreter(str(system.bin / "python3"), (3, 12))
    system.python("python3", "3.10", venv=True)
    system.python("python3.11", "3.11", venv=True)
    assert setup.choose_python(None, system.which).path == str(system.bin / "python3.13")
    assert setup.choose_python("python3.11", system.which).path == str(system.bin / "python3.11")
    assert setup.choose_python("python3.10", system.which) is None, "an override outside 3.11-3.13 is refused"
    assert setup.choose_python("python3.12", system.which) is None, "an override that is not there"


def _which_python(system: FakeSystem, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--which-python"], env=system.environ(**extra), capture_output=True, text=True
    )


def test_which_python_prints_the_interpreter_or_what_to_install(tmp_path: Path) -> None:
    system = FakeSystem(tmp_path)
    system.python("python3", "3.10", venv=True)
    system.python("python3.11", "3.11", venv=True)
    found = _which_python(system)
    assert found.returncode == 0 and found.stdout.strip() == str(system.bin / "python3.11")
    refused = _which_python(system, PYTHON="python3.10")
    assert refused.returncode == 1 and refused.stdout == ""
    assert "PYTHON=python3.10" in refused.stderr and "3.11-3.13" in refused.stderr
    system.python("python3", "3.12", venv=False)
    (system.bin / "python3.11").unlink()
    system.apt({"python3.12", "python3.12-venv"})
    named = _which_python(system)
    assert named.returncode == 1
    assert "sudo apt-get install -y python3.12 python3.12-venv" in named.stderr


# ----------------------------------------------------------------------------------------------- the whole script


def test_installs_what_apt_says_the_release_has_then_checks_again(tmp_path: Path) -> None:
    """A Debian 13-like machine (apt offers Java 21, not 17; python3 is 3.13 without venv): apt-get update, then one
    install of exactly the release's packages, and the check passes."""
    system = FakeSystem(tmp_path)
    system.python("python3", "3.13", venv=False)
    system.apt({"openjdk-21-jre-headless", "python3.13", "python3.13-venv"})
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--for", "serve"], env=system.environ(), capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    calls = system.calls.read_text().splitlines()
    assert calls[0] == "update -qq"
    assert calls[1].endswith("--no-install-recommends openjdk-21-jre-headless python3.13 python3.13-venv"), calls
    assert len(calls) == 2 and "openjdk-17" not in result.stdout + result.stderr
    assert "installing openjdk-21-jre-headless python3.13 python3.13-venv" in result.stdout


def test_missing_packages_and_no_way_to_install_give_one_message_with_the_command(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--for", "test"], env=_bare_path(tmp_path), capture_output=True, text=True
    )
    assert result.returncode == 1
    message = result.stderr
    assert "no apt-get on this machine" in message
    head = message.split("Install them with:")[0]
    for name in ("java", "prometheus", "promtool", "prometheus-process-exporter"):
        assert name in head
    assert "python" not in head, "the python3 on PATH is a supported one with venv"
    command = next(line for line in message.splitlines() if "apt-get install" in line)
    packages = command.split("--no-install-recommends")[1].split()
    release = setup.read_os_release()
    known = setup.RELEASES.get(release.key) if release is not None else None
    if known is None:
        pytest.skip(f"{setup.system_name(release)} is not one of the releases of the table")
    java = next(p for p in ("openjdk-17-jre-headless", "openjdk-21-jre-headless") if p in known.packages)
    assert packages[:3] == [java, "prometheus", "prometheus-process-exporter"]
    assert set(packages) <= known.packages, "only packages this release has"
    assert result.stdout == ""


def test_serve_needs_only_java_and_python(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--for", "serve", "--no-install"],
        env=_bare_path(tmp_path),
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1
    head = result.stderr.split("Install them with:")[0]
    assert "java" in head
    assert "prometheus" not in head and "chromium" not in head


def test_no_install_on_this_machine_only_checks() -> None:
    """On the machine the suite runs on, `make test` has already installed everything: the check passes."""
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--for", "test", "--no-install", "--no-engine"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


def test_the_os_release_file_and_apt_policy_are_read(tmp_path: Path) -> None:
    os_release = tmp_path / "os-release"
    os_release.write_text('PRETTY_NAME="Debian GNU/Linux 13 (trixie)"\nNAME="Debian GNU/Linux"\nVERSION_ID="13"\n'
                          "ID=debian\n# a comment\nID_LIKE='ubuntu debian'\n")  # fmt: skip
    release = setup.read_os_release([tmp_path / "absent", os_release])
    assert release == setup.OsRelease("debian", "13", "Debian GNU/Linux 13 (trixie)", ("ubuntu", "debian"))
    assert setup.read_os_release([tmp_path / "absent"]) is None
    policy = (
        "openjdk-17-jre-headless:\n  Installed: (none)\n  Candidate: (none)\n  Version table:\n"
        "openjdk-21-jre-headless:\n  Installed: (none)\n  Candidate: 21.0.13+9-1~deb13u2\n  Version table:\n"
        "     21.0.13+9-1~deb13u2 500\n        500 http://deb.debian.org/debian trixie/main amd64 Packages\n"
    )
    assert setup.parse_policy(policy) == {"openjdk-17-jre-headless": False, "openjdk-21-jre-headless": True}


def test_packages_are_listed_once_and_sudo_is_non_interactive() -> None:
    prometheus = [req for req in setup.TEST_REQUIREMENTS if req.name in {"prometheus", "promtool"}]
    assert setup.packages_of(prometheus) == ["prometheus"]
    update, install = setup.update_command(as_root=False), setup.install_command(["prometheus"], as_root=False)
    assert update[:2] == ["sudo", "-n"] and install[:2] == ["sudo", "-n"]
    assert install[-1] == "prometheus" and "-y" in install
    update, install = setup.update_command(as_root=True), setup.install_command(["prometheus"], as_root=True)
    assert update[0] == "apt-get" and "sudo" not in install


def test_absent_engine_script_is_not_an_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ENGINE_SH", str(tmp_path / "absent.sh"))
    assert setup.ensure_engine(allow_install=True) == 0


def test_ci_installs_nothing_that_make_test_does_not() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert "apt-get" not in ci
    assert ci.rstrip().splitlines()[-1] == "make test"
    readme = (ROOT / "README.md").read_text()
    assert "make test" in readme.split("## Two commands")[1].split("##")[0]


def test_postgresql_is_among_the_test_packages() -> None:
    """The records store's tests start a PostgreSQL server from the distribution's package (its programs are off
    ``PATH``, in ``/usr/lib/postgresql/<version>/bin``)."""
    (postgres,) = [req for req in setup.TEST_REQUIREMENTS if req.name == "postgresql"]
    assert postgres.choices == (("postgresql",),) and postgres.pattern == "/usr/lib/postgresql/*/bin/initdb"
    assert all("postgresql" in release.packages for release in setup.RELEASES.values())
