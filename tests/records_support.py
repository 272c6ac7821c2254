"""Records for the records tests, and raw access to a store's database (to tamper with it as an intruder would)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from records import Record, build_record
from records.sql import SqlStore


def answer(label: str = "positive", method: str | None = "attnlrp") -> dict[str, Any]:
    """A classification answer document, with an explanation when ``method`` is given."""
    document: dict[str, Any] = {"label": label, "label_id": 2, "probabilities": {"negative": 0.1, "positive": 0.9}}
    if method is not None:
        document["explanation"] = {"method": method, "options": {}, "tokens": ["a", "b"], "scores": [0.25, -0.5]}
    return document


def record(
    request: str = "req",
    index: int | None = None,
    *,
    model: str = "sentiment",
    text: str = "what a lovely day",
    time: datetime | None = None,
    **fields: Any,
) -> Record:
    """One row's record, as a door would build it."""
    return build_record(
        model=model,
        version="sha256:feedface",
        task="classification",
        door="torchserve",
        request_id=request,
        index=index,
        answer=fields.pop("answer", answer()),
        input=fields.pop("input", {"text": text, "explain": {"method": "attnlrp"}}),
        timings={"model": 0.012},
        time=time,
        **fields,
    )


def execute(store: SqlStore, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Run ``query`` (``?`` parameters) on the store's database behind its back; the rows it returns."""
    if store.kind == "sqlite":
        import sqlite3

        with sqlite3.connect(store.path, isolation_level=None) as conn:  # type: ignore[attr-defined]
            return list(conn.execute(query, params).fetchall())
    import psycopg

    with psycopg.connect(store._url, autocommit=True) as conn:  # type: ignore[attr-defined]
        cur = conn.execute(query.replace("?", "%s"), params)
        return list(cur.fetchall()) if cur.description else []
