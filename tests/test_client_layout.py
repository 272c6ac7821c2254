"""The layout of the ``explain_client`` package: no import cycle among its modules and no private name (``_x``)
imported from another of its modules.

The import graph is read with :mod:`ast` from the package's source files, so an import inside a function counts
like one at the top of a module (a function-level import can hide a cycle, it cannot remove it). Only imports of the
package's own modules are edges; third-party packages (the optional Pillow, NumPy and tqdm among them) never are.
The generated stubs (``_generated/``, loaded by name in :mod:`explain_client.protos`) and the build script
(``setup.py``, not part of the built package) are left out.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

import pytest

PACKAGE = "explain_client"
PACKAGE_DIR = Path(__file__).resolve().parents[1] / PACKAGE
#: Not modules of the installed package: generated stubs, the build script, build outputs.
LEFT_OUT = ("_generated", "build", "setup.py")


@dataclass
class Layout:
    """What the package's modules import of each other.

    Attributes:
        edges: per module (dotted name), the package modules it imports anywhere in its source.
        private: ``"module:line imports name from other"`` for each private name taken from another module.
    """

    edges: dict[str, set[str]] = field(default_factory=dict)
    private: list[str] = field(default_factory=list)


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _module_names(root: Path, package: str) -> dict[str, Path]:
    """Dotted module name → source file, for every module of the package under ``root``."""
    names: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root)
        if relative.parts[0] in LEFT_OUT or any(part.endswith(".egg-info") for part in relative.parts):
            continue
        parts = [package, *relative.with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def read_layout(root: Path, package: str = PACKAGE) -> Layout:
    """The import graph and the private imports of the package whose source folder is ``root``."""
    modules = _module_names(root, package)
    layout = Layout(edges={name: set() for name in modules})
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        here = name.split(".") if is_package else name.split(".")[:-1]
        module_aliases: set[str] = set()  # local names bound to a package module (`from . import render`)

        def add(dotted: str, line: int, name: str = name) -> None:
            """An import of ``dotted`` (a module, or a name in one) at ``line``: an edge to the package module
            holding it, and a private import if a part of it below the package is private."""
            target = max((m for m in modules if dotted == m or dotted.startswith(m + ".")), key=len)
            layout.edges[name].add(target)
            if target != name and any(_private(part) for part in dotted.split(".")[1:]):
                layout.private.append(f"{name}:{line} imports {dotted}")

        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == package:
                        add(alias.name, node.lineno)
                        if alias.asname is not None:
                            module_aliases.add(alias.asname)
            elif isinstance(node, ast.ImportFrom):
                parent = here[: len(here) - node.level + 1] if node.level else []
                base = ".".join([*parent, *([node.module] if node.module else [])])
                if base.split(".")[0] != package:
                    continue
                for alias in node.names:
                    add(f"{base}.{alias.name}", node.lineno)
                    if f"{base}.{alias.name}" in modules:  # `from . import render`: the module itself
                        module_aliases.add(alias.asname or alias.name)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in module_aliases
                and _private(node.attr)
            ):
                layout.private.append(f"{name}:{node.lineno} uses {node.value.id}.{node.attr}")
    return layout


def find_cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Each import cycle once, as the modules along it (first module repeated at the end); a module importing
    itself is a cycle of one."""
    cycles: list[list[str]] = []
    seen: set[frozenset[str]] = set()
    finished: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        for target in sorted(edges.get(module, ())):
            if target in path:
                cycle = [*path[path.index(target) :], target]
                if frozenset(cycle) not in seen:
                    seen.add(frozenset(cycle))
                    cycles.append(cycle)
            elif target not in finished:
                visit(target, [*path, target])
        finished.add(module)

    for module in sorted(edges):
        if module not in finished:
            visit(module, [module])
    return cycles


def test_the_client_package_has_no_import_cycle() -> None:
    layout = read_layout(PACKAGE_DIR)
    assert f"{PACKAGE}.render" in layout.edges and f"{PACKAGE}.client" in layout.edges  # the package was read
    assert find_cycles(layout.edges) == []


def test_no_private_name_is_imported_from_another_client_module() -> None:
    assert read_layout(PACKAGE_DIR).private == []


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text, encoding="utf-8")
    return root


def test_a_cycle_through_a_function_level_import_is_found(tmp_path: Path) -> None:
    root = _write(
        tmp_path / "pkg",
        {
            "__init__.py": "from .top import page\n",
            "top.py": "from .bottom import words\n\ndef page():\n    from .middle import block\n",
            "middle.py": "import numpy\nfrom pkg.top import page\n",
            "bottom.py": "import PIL\n\ndef words():\n    import tqdm\n",
            "setup.py": "from pkg.top import page\n",
        },
    )
    layout = read_layout(root, "pkg")
    assert layout.edges == {
        "pkg": {"pkg.top"},
        "pkg.top": {"pkg.bottom", "pkg.middle"},
        "pkg.middle": {"pkg.top"},
        "pkg.bottom": set(),
    }
    assert find_cycles(layout.edges) == [["pkg.top", "pkg.middle", "pkg.top"]]


@pytest.mark.parametrize(
    ("source", "found"),
    [
        ("from .render import _ansi\n", "pkg.entities:1 imports pkg.render._ansi"),
        ("def f():\n    from pkg.render import _html_words\n", "pkg.entities:2 imports pkg.render._html_words"),
        ("from . import render\n\nrender._ansi('x')\n", "pkg.entities:3 uses render._ansi"),
        ("import pkg.render as r\n\nr._ansi('x')\n", "pkg.entities:3 uses r._ansi"),
        ("from ._generated import stubs\n", "pkg.entities:1 imports pkg._generated.stubs"),
    ],
)
def test_a_private_name_from_another_module_is_found(tmp_path: Path, source: str, found: str) -> None:
    root = _write(
        tmp_path / "pkg",
        {"__init__.py": "", "render.py": "_ansi = 1\n\ndef _own():\n    return _ansi\n", "entities.py": source},
    )
    layout = read_layout(root, "pkg")
    assert layout.private == [found]
    assert find_cycles(layout.edges) == []
