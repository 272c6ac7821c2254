"""The verdict of the records soak (:func:`tests.soak_records_support.check_records`) on hand-made calls and a real
SQLite store: a served answer is found by the id its answer carried, the id sent, or its input (full and hash
payloads); a served answer without its record, with another model's or method's record, or with an error's, is a
problem; so are records no request explains in a fresh store, and a chain changed behind the store's back. Records of
requests that got no answer are counted, not failed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from records import build_record, open_store
from records.sql import SqlStore
from tests.records_support import answer, execute
from tests.soak_records_support import Call, check_records, wall_clock


def _call(request_id: str, *, served: bool = True, answered: bool = True, reply_id: str | None = None,
          text: str | None = None, method: str = "attnlrp", model: str = "sentiment") -> Call:  # fmt: skip
    content = {"text": text, "explain": {"method": method}} if text is not None else None
    return Call(request_id, "rest", model, method, True, served, answered, "200" if served else "connection",
                reply_id, content, 0.0, 1.0)  # fmt: skip


def _write(url: str, payload: str, rows: list[tuple[str, str, dict[str, Any]]]) -> None:
    records = [
        build_record(model="sentiment", version="v1", task="classification", door="torchserve", request_id=request,
                     index=None, answer=reply, input={"text": text, "explain": {"method": "attnlrp"}})
        for request, text, reply in rows
    ]  # fmt: skip
    with open_store(url, payload=payload) as store:
        store.write(records)


@pytest.mark.parametrize("payload", ["full", "hash"])
def test_served_answers_are_found_by_reply_id_sent_id_or_input(tmp_path: Path, payload: str) -> None:
    url = f"sqlite:///{tmp_path / 'records.sqlite3'}"
    since = wall_clock()
    _write(url, payload, [("echoed", "a", answer()), ("sent", "b", answer()), ("server-made", "c", answer()),
                          ("lost", "d", answer())])  # fmt: skip
    calls = [
        _call("mine-1", reply_id="echoed"),
        _call("sent"),
        _call("mine-3", text="c"),  # the answer carried no id: its input names it
        _call("mine-4", served=False, answered=False, text="d"),  # committed, then the answer was lost
    ]
    figures, problems = check_records(url, calls, since, fresh=True)
    assert problems == []
    assert figures["matched_by"] == {"reply id": 1, "sent id": 1, "input": 1}
    assert figures["unanswered_recorded"] == 1 and figures["records_unexplained"] == 0
    assert figures["verify_exit"] == 0 and figures["verify"].startswith("ok: 4 record(s)")


def test_missing_wrong_and_unexplained_records_and_a_changed_chain_are_problems(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'records.sqlite3'}"
    since = wall_clock()
    error = {"error": {"code": "records_unavailable", "http_status": 503, "message": "no"}}
    _write(url, "full", [("other-method", "a", answer(method="rollout")), ("failed", "b", error),
                         ("nobody", "c", answer())])  # fmt: skip
    calls = [_call("never-recorded"), _call("other-method"), _call("failed")]
    figures, problems = check_records(url, calls, since, fresh=True)
    assert figures["served_missing"] == 1 and figures["served_mismatched"] == 2
    assert figures["records_unexplained"] == 1
    assert len(problems) == 3
    _, problems = check_records(url, calls, since, fresh=False)  # a store in use: others' records are no problem
    assert len(problems) == 2
    with open_store(url) as store:
        assert isinstance(store, SqlStore)
        execute(store, "UPDATE explain_records SET body = replace(body, 'rollout', 'attnlrp') WHERE id = ?",
                ("other-method",))  # fmt: skip
    figures, problems = check_records(url, [_call("other-method")], since, fresh=False)
    assert figures["verify_exit"] == 1 and any("explain-records verify" in problem for problem in problems)
