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


def test_the_core_imports_no_server_and_no_door() -> None:
    assert offenders("serving_core", (*SERVERS, "handlers", "servers", "model_store")) == []


def test_the_doors_and_tools_import_the_core_not_torchserves_glue() -> None:
    assert offenders("servers", ("handlers", "ts")) == []
    assert offenders("bench", ("handlers",)) == []
    assert offenders("handlers", ("servers",)) == []


def test_the_launchers_import_nothing_of_each_other() -> None:
    """TorchServe's launcher (``model_store``) and the other doors' (``servers``) share their process mechanics
    (``supervise``) and import nothing of each other, in either direction; what they share imports neither."""
    assert offenders("model_store", ("servers",)) == []
    assert offenders("servers", ("model_store",)) == []
    assert offenders("supervise", ("model_store", "servers", "handlers", "serving_core")) == []
    assert offenders("forwarding", ("model_store", "servers", "handlers", "serving_core")) == []


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
    from servers.oip import CODECS

    task = get_task(name)
    assert task.name == name and name in CODECS
    entries = [path for path in (ROOT / "handlers").glob("*_handler.py") if f'task = "{name}"' in path.read_text()]
    assert len(entries) == 1, f"one TorchServe entry file in handlers/ names task {name!r}"
