"""The library's API reference (docs/api/*.md) is generated from the docstrings: the committed pages must be what
scripts/api_reference.py writes today, and every public function, parameter and result field must be documented."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("api_reference", ROOT / "scripts" / "api_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["api_reference"] = module
    spec.loader.exec_module(module)
    return module


GENERATOR = _generator()


@pytest.mark.parametrize("page", GENERATOR.PAGES, ids=lambda page: page[1])
def test_reference_is_complete_and_current(page: tuple[str, str, str, str]) -> None:
    module_name, name, title, intro = page
    text, problems = GENERATOR.render(module_name, title, intro)
    assert not problems, "undocumented (write the docstring, then run python scripts/api_reference.py):\n" + "\n".join(
        problems
    )
    committed = (GENERATOR.API_DIR / name).read_text(encoding="utf-8")
    assert committed == text, f"docs/api/{name} is stale: run python scripts/api_reference.py"


@pytest.mark.parametrize("page", GENERATOR.PAGES, ids=lambda page: page[1])
def test_every_exported_name_has_an_entry(page: tuple[str, str, str, str]) -> None:
    module_name, name, _, _ = page
    committed = (GENERATOR.API_DIR / name).read_text(encoding="utf-8")
    module = importlib.import_module(module_name)
    missing = [export for export in module.__all__ if f"### `{export}`" not in committed]
    assert not missing


def test_the_check_fails_on_an_undocumented_parameter() -> None:
    def sample(first: int, second: str) -> None:  # noqa: D417 (the gap under test)
        """Do something.

        Args:
            first: documented.
        """

    lines: list[str] = []
    problems: list[str] = []
    GENERATOR.document_function(lines, problems, "sample", sample, bound=False, level="###")
    assert problems == ["sample: parameter 'second' undocumented"]


def test_the_check_fails_on_an_undocumented_result_field() -> None:
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class Result:
        """A result.

        Attributes:
            scores: documented.
        """

        scores: list[float]
        target: int

    lines: list[str] = []
    problems: list[str] = []
    GENERATOR.document_class(lines, problems, "Result", Result)
    assert problems == ["Result.target: result field undocumented"]


def test_docstring_sections_are_parsed() -> None:
    doc = GENERATOR.parse_docstring(
        """Summary with :func:`explainers.explain` and ``code``.

        Args:
            model: a model,
                over two lines.
            **options: the options.

        Returns:
            The result.

        Raises:
            ValueError: when wrong.
        """
    )
    assert doc.entries["Args"] == {"model": "a model, over two lines.", "options": "the options."}
    assert doc.returns == "The result."
    assert doc.entries["Raises"] == {"ValueError": "when wrong."}
    assert GENERATOR.markdown(doc.text) == "Summary with `explain` and `code`."


def test_concepts_methods_table_is_the_registry() -> None:
    from explainers import available_methods

    current = GENERATOR.CONCEPTS.read_text(encoding="utf-8")
    assert current == GENERATOR.concepts_page(current), "docs/concepts.md is stale: run python scripts/api_reference.py"
    table = current[current.index(GENERATOR.TABLE_START) : current.index(GENERATOR.TABLE_END)]
    assert [line.split("`")[1] for line in table.splitlines() if line.startswith("| `")] == available_methods()
