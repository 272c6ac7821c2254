"""The user docs point at things that exist: every relative link resolves to a file of the repository (and its
``#anchor`` to a heading of that file), and every example input the docs' commands read is in the repository."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted(
    [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "docs").glob("api/*.md")]
)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
#: Example inputs the commands read: files under docs/ and model_store/*.yaml (built outputs are not examples).
EXAMPLE = re.compile(r"(?<![\w/.-])((?:docs/[\w/.-]+|model_store/[\w.-]+)\.(?:png|txt|json|yaml|jsonl))")


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors of a page's headings (code blocks skipped)."""
    found: set[str] = set()
    fenced = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            found.add(slug(line.lstrip("#")))
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target):
            continue
        path_part, _, anchor = target.partition("#")
        resolved = (page.parent / path_part).resolve() if path_part else page
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target}: no heading with that anchor")
    assert not broken, broken


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_example_files_exist(page: Path) -> None:
    missing = sorted({path for path in EXAMPLE.findall(page.read_text(encoding="utf-8")) if not (ROOT / path).exists()})
    assert not missing


def test_slug_follows_github() -> None:
    assert slug(" The founding papers' baselines") == "the-founding-papers-baselines"
    assert slug(" Other doors: KServe and Ray Serve") == "other-doors-kserve-and-ray-serve"
    assert slug(" Measured (this shared 2-core machine, the stand-in base images)") == (
        "measured-this-shared-2-core-machine-the-stand-in-base-images"
    )
