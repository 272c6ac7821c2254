"""The layers of ``explain_eval``, read from the code: no module imports, through any chain, one that imports it back
(every import counts: module-level, function-level and ``TYPE_CHECKING`` ones), the shared bottom layer
(:mod:`explain_eval.results`) imports nothing of the project, and ``explain_eval`` imports nothing of ``bench``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def package_imports(root: Path, package: str) -> dict[str, set[str]]:
    """Each module of ``package`` (under ``root``) → the modules it imports, top-level-qualified: relative imports
    resolved, and ``from P import name`` read as the module ``P.name`` where that is a module of ``package``."""
    modules = {
        ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__"): path
        for path in sorted((root / package).rglob("*.py"))
    }
    found: dict[str, set[str]] = {}
    for module, path in modules.items():
        parts = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = ".".join([*parts[: len(parts) - node.level + 1], *([node.module] if node.module else [])])
                else:
                    base = node.module or ""
                names.add(base)
                names.update(f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in modules)
        found[module] = names
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles among ``graph``'s modules, each as the chain of modules that closes it (a module importing
    its own package's ``__init__`` is not counted: a package's modules may read what it exports)."""
    found: list[list[str]] = []
    done: set[str] = set()

    def visit(module: str, chain: list[str]) -> None:
        if module in chain:
            found.append([*chain[chain.index(module) :], module])
            return
        if module in done:
            return
        for target in sorted(graph[module]):
            if target in graph and not module.startswith(f"{target}."):
                visit(target, [*chain, module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])
    return found


def test_explain_eval_has_no_import_cycle() -> None:
    assert cycles(package_imports(ROOT, "explain_eval")) == []


def test_explain_eval_imports_nothing_of_the_benchmarks() -> None:
    """``bench`` builds on ``explain_eval`` (its machine line, its statistics, the document view's measure)."""
    imports = package_imports(ROOT, "explain_eval")
    assert (
        sorted(
            f"{module}: {name}" for module, names in imports.items() for name in names if name.split(".")[0] == "bench"
        )
        == []
    )


def test_the_shared_results_import_nothing_of_the_project() -> None:
    project = {path.parent.name for path in ROOT.glob("*/__init__.py")}
    imported = package_imports(ROOT, "explain_eval")["explain_eval.results"]
    assert sorted(name for name in imported if name.split(".")[0] in project) == []


def test_the_scan_sees_hidden_imports_and_closes_cycles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import x\n")
    (package / "b.py").write_text("def f():\n    from . import c\n")
    (package / "c.py").write_text("import pkg.a\nfrom pkg import b\n")
    graph = package_imports(tmp_path, "pkg")
    assert graph["pkg.a"] >= {"pkg.b"} and graph["pkg.b"] >= {"pkg.c"} and graph["pkg.c"] >= {"pkg.a", "pkg.b"}
    assert sorted(map(tuple, cycles(graph))) == [("pkg.a", "pkg.b", "pkg.c", "pkg.a"), ("pkg.b", "pkg.c", "pkg.b")]
    (package / "c.py").write_text("import typing\n")
    assert cycles(package_imports(tmp_path, "pkg")) == []
