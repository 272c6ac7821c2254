"""The launchers' packages stay apart: ``model_store`` (TorchServe's launcher) and ``servers`` (the other doors) import
nothing of each other, in either direction, and what they share (``supervise``: process mechanics; ``forwarding``:
the REST/gRPC forwarder) imports neither. Every import statement counts, those inside functions included (an ``ast``
scan of the source, so nothing has to be imported to be checked)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
#: Package → the top-level packages its modules must not import.
FORBIDDEN = {
    "model_store": {"servers"},
    "servers": {"model_store"},
    "supervise": {"model_store", "servers"},
    "forwarding": {"model_store", "servers"},
}
#: Generated or built files under a package folder, not its source.
SKIPPED = ("model_store/build/",)


def imported_modules(source: str, module: str) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in ``source``, the source of ``module`` (dotted; relative
    imports are resolved against it)."""
    package = module.rsplit(".", 1)[0] if "." in module else module
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                name = ".".join([*base, *([node.module] if node.module else [])])
            else:
                name = node.module or ""
            found.append((node.lineno, name))
    return found


def _modules(package: str) -> list[tuple[Path, str]]:
    """(path, dotted module name) of each source file of ``package``."""
    files = []
    for path in sorted((REPO_ROOT / package).rglob("*.py")):
        relative = path.relative_to(REPO_ROOT).as_posix()
        if relative.startswith(SKIPPED):
            continue
        # a package's __init__ keeps its name, so that its relative imports resolve against the package itself
        files.append((path, ".".join(path.relative_to(REPO_ROOT).with_suffix("").parts)))
    return files


def test_the_scan_sees_every_kind_of_import() -> None:
    source = (
        "import servers.launcher\n"
        "from servers import process\n"
        "def later():\n"
        "    from model_store.serving import archives\n"
        "    import servers as s\n"
        "from . import sibling\n"
        "from ..other import thing\n"
    )
    found = sorted(imported_modules(source, "pkg.sub.module"))
    assert found == [
        (1, "servers.launcher"), (2, "servers"), (4, "model_store.serving"), (5, "servers"), (6, "pkg.sub"),
        (7, "pkg.other"),
    ]  # fmt: skip
    assert imported_modules("from . import x\n", "pkg.__init__") == [(1, "pkg")]


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_a_package_imports_nothing_it_must_not(package: str) -> None:
    modules = _modules(package)
    assert modules, f"no source found for {package}"
    crossings = []
    for path, module in modules:
        for line, name in imported_modules(path.read_text(encoding="utf-8"), module):
            if name.split(".")[0] in FORBIDDEN[package]:
                crossings.append(f"{path.relative_to(REPO_ROOT)}:{line} imports {name}")
    assert not crossings, "\n".join(crossings)
