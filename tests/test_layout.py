"""The house's boundaries, read from the code (every import, function-level ones included): the serving core imports
no server, no door imports another door's glue, and every registered task has its TorchServe entry file and its OIP
codec."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from serving_core.registry import TASKS
from serving_core.task import get_task

ROOT = Path(__file__).resolve().parent.parent
#: Top-level packages that are servers (or a server's SDK): the serving core must import none of them.
SERVERS = ("ts", "kserve", "ray", "fastapi", "uvicorn", "starlette")


def imported(package: str) -> dict[str, set[str]]:
    """Each module file of ``package`` → the top-level-qualified modules it imports (relative imports resolved)."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        if "_generated" in path.parts or "build" in path.parts:
            continue
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        package_parts = module.split(".")[:-1] if path.name != "__init__.py" else module.split(".")
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package_parts[: len(package_parts) - node.level + 1]
                    names.add(".".join([*base, node.module] if node.module else base))
                elif node.module:
                    names.add(node.module)
        found[str(path.relative_to(ROOT))] = names
    return found


def offenders(package: str, forbidden: tuple[str, ...]) -> list[str]:
    return sorted(
        f"{file}: {name}"
        for file, names in imported(package).items()
        for name in names
        if name.split(".")[0] in forbidden
    )


#: The deprecated aliases kept for one release (CHANGELOG): old module paths that archives, manifests and scripts name.
ALIASES = ("handlers", "servers", "model_store/serving")


def test_the_core_imports_no_server_and_no_door() -> None:
    assert offenders("serving_core", (*SERVERS, "doors", "handlers", "servers", "model_store")) == []


def test_every_door_lives_under_doors_and_imports_no_other_door() -> None:
    """Each door is a folder of ``doors/``; none imports another's modules (the launcher and the table may import
    every door's launch module, by name, through :data:`doors.DOORS`)."""
    from doors import DOORS

    folders = sorted({door.module.split(".")[1] for door in DOORS.values()})
    assert folders == sorted(path.name for path in (ROOT / "doors").iterdir() if (path / "__init__.py").is_file())
    for folder in folders:
        others = tuple(f"doors.{other}" for other in folders if other != folder)
        found = [
            f"{file}: {name}"
            for file, names in imported(f"doors/{folder}").items()
            for name in names
            if name.startswith(others)
        ]
        assert found == [], f"doors/{folder} imports another door"
    assert offenders("doors/kserve", ("ts",)) == [] and offenders("bench", ("ts",)) == []


def test_the_launcher_has_one_home() -> None:
    """No module re-executes another launcher (``os.execve``/``os.execv``); the folders that are not doors import no
    door, except the deprecated aliases that point at them."""
    for package in ("doors", "model_store", "supervise", "forwarding", "serving_core", "explainers"):
        for path in (ROOT / package).rglob("*.py"):
            assert "os.exec" not in path.read_text(encoding="utf-8"), f"{path.relative_to(ROOT)} re-executes"
    for package in ("model_store", "supervise", "forwarding", "explainers", "explain_client", "monitoring"):
        found = [
            item for item in offenders(package, ("doors", "handlers", "servers")) if "model_store/serving" not in item
        ]
        assert found == [], f"{package} imports a door"
    for alias in ALIASES:
        for path in (ROOT / alias).glob("*.py"):
            assert len(path.read_text(encoding="utf-8").splitlines()) <= 12, f"{path.relative_to(ROOT)} is an alias"


def test_the_served_tasks_import_the_library_through_its_public_surface() -> None:
    """The task services call ``explainers`` by the names of ``explainers/__init__.py`` only (its planner among them),
    never a module behind it."""
    deep = sorted(
        f"{file}: {name}"
        for file, names in imported("serving_core").items()
        if file.startswith("serving_core/tasks/")
        for name in names
        if name.startswith("explainers.")
    )
    assert deep == []


def test_the_scan_sees_function_level_and_relative_imports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("def f():\n    import ts.torch_handler\n    from .b import x\n")
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    assert imported("pkg")["pkg/a.py"] == {"ts.torch_handler", "pkg.b"}
    assert offenders("pkg", ("ts",)) == ["pkg/a.py: ts.torch_handler"]


@pytest.mark.parametrize("name", list(TASKS))
def test_every_task_has_its_entry_file_and_its_codec(name: str) -> None:
    from doors.kserve.oip import CODECS

    task = get_task(name)
    assert task.name == name and name in CODECS
    entries = [
        path for path in (ROOT / "doors" / "torchserve").glob("*_handler.py") if f'task = "{name}"' in path.read_text()
    ]
    assert len(entries) == 1, f"one TorchServe entry file in doors/torchserve/ names task {name!r}"
