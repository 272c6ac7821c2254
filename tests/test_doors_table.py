"""docs/SERVING.md's "Doors" table is a copy of :data:`doors.DOORS`: one row per door, with the door's summary, its
launch module and what it needs, in the table's order."""

from __future__ import annotations

from pathlib import Path

from doors import DEFAULT_DOOR, DOORS

SERVING = Path(__file__).resolve().parent.parent / "docs" / "SERVING.md"
HEADER = "| door | what it serves | launch module | what it needs |"


def doors_table(text: str) -> list[list[str]]:
    """The cells of the rows of the table under ``## Doors`` (the header and its rule left out, backticks removed)."""
    section = text.split("\n## Doors\n", 1)[1].split("\n## ", 1)[0]
    lines = section.splitlines()
    start = lines.index(HEADER) + 2
    rows: list[list[str]] = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip().strip("`") for cell in line.strip("|").split("|")])
    return rows


def test_the_doors_table_lists_every_door_of_the_code() -> None:
    rows = doors_table(SERVING.read_text(encoding="utf-8"))
    assert [row[0] for row in rows] == list(DOORS)
    assert rows[0][0] == DEFAULT_DOOR
    for name, summary, module, needs in rows:
        door = DOORS[name]
        assert summary == door.summary, f"the summary of {name!r} differs from doors/__init__.py's"
        assert module == door.module
        assert ("make extras" in needs) == door.extras, f"{name!r}: the extras it needs"


def test_the_table_reading_sees_a_missing_door() -> None:
    text = f"intro\n\n## Doors\n\nprose\n\n{HEADER}\n|---|---|---|---|\n| `a` | A | `m.a` | `make setup` |\n\n## Next\n"
    assert doors_table(text) == [["a", "A", "m.a", "make setup"]]
    assert doors_table(text.replace("| `a` | A | `m.a` | `make setup` |\n", "")) == []
