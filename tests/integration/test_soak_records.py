"""The soak with records on (tests/soak_records_support.py): a door serving the tiny text and image models with
``EXPLAIN_RECORDS`` (payload ``full`` unless ``EXPLAIN_RECORDS_PAYLOAD`` says otherwise; ``on_store_error: refuse``)
under the mixed REST/gRPC load of tests/test_reliability.py (every method and prediction, text and image, 5 % bad
requests), its processes killed under that load. Passes when:

- the load passes the soak's criteria (:func:`tests.soak_support.judge`: no good request failed outside a kill's
  window, the failures in it retryable, every bad request got its error, the door answered again in time);
- every answer the client received as served (REST 200, gRPC OK, the correct answer) has its record in the store, of
  that model and method and without an error (found by the answer's id, else the id sent, else the input);
- on a store that was empty before, every record is one of the soak's requests';
- ``explain-records verify`` passes on the store after the service was stopped.

Records of requests the client got no answer to (in flight at a kill: the record was committed, the answer lost) are
counted, not failed: an answer leaves only after its record is durable, so such records are expected.

The default run is CI's: about 12 s of load at concurrency 6, one kill each: TorchServe on SQLite (one of the text
model's two workers killed), TorchServe on PostgreSQL (the whole service killed, then started again on the same
store; skipped with one line where PostgreSQL is not installed) and the KServe door on SQLite (its process, which
holds the models, killed and started again). ``SOAK=1`` (``make soak RECORDS=STORE``, ``SERVER=kserve`` for that door)
runs 60 s at concurrency 32 on the store ``SOAK_RECORDS`` names (``sqlite``: a new file; ``sqlite:///path`` or
``postgresql://...``: that store, records already there kept), TorchServe taking both kills. Figures are logged and
appended to ``build/ops-figures.jsonl``; each service is stopped by its pids at the end of its test.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from records import open_store
from tests.doors_support import EXTRAS
from tests.ops_support import LoadTarget, log_figures, run_load
from tests.postgres_server import PostgresServer, postgres_server
from tests.soak_records_support import (
    CallLog,
    check_records,
    oip_records_target,
    records_env,
    torchserve_records_soak,
    wall_clock,
)
from tests.soak_support import (
    BACKOFF_S,
    FIGURES,
    GRACE_S,
    REQUEST_TIMEOUT_S,
    SOAK,
    DoorSoak,
    judge,
    kserve_soak,
    soak_models,
)

pytestmark = pytest.mark.slow

#: The store of ``make soak RECORDS=...`` (empty: CI's stores, a new SQLite file and the tests' PostgreSQL).
STORE = os.environ.get("SOAK_RECORDS", "").strip()
PAYLOAD = os.environ.get("EXPLAIN_RECORDS_PAYLOAD", "").strip() or "full"
SECONDS = 60.0 if SOAK else 12.0
CONCURRENCY = 32 if SOAK else 6

if STORE:  # the test ids name the store's kind, not its URL (which may hold a password)
    _KIND = STORE.split(":", 1)[0]
    CASES = [pytest.param("torchserve", STORE, id=f"torchserve-{_KIND}"),
             pytest.param("kserve", STORE, marks=EXTRAS, id=f"kserve-{_KIND}")]  # fmt: skip
else:
    CASES = [pytest.param("torchserve", "sqlite"), pytest.param("torchserve", "postgresql"),
             pytest.param("kserve", "sqlite", marks=EXTRAS)]  # fmt: skip


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    with postgres_server() as server:
        yield server


def _store(store: str, run_dir: Path, request: pytest.FixtureRequest) -> tuple[str, bool]:
    """The store's URL, and whether it is empty before the soak."""
    if store == "sqlite":
        url = f"sqlite:///{run_dir / 'records.sqlite3'}"
    elif store == "postgresql":
        server: PostgresServer = request.getfixturevalue("postgres")
        url = server.new_database()
    else:
        url = store
    with open_store(url, payload=PAYLOAD) as opened:
        fresh = not opened.list(limit=1).records
    return url, fresh


def _kills(door: str, store: str) -> tuple[float | None, float | None]:
    """When TorchServe's text worker and the whole service are killed (seconds into the load)."""
    if SOAK:
        return SECONDS / 4, SECONDS * 0.6
    return (None, SECONDS / 3) if store == "postgresql" else (SECONDS / 3, None)


@pytest.mark.timeout(2400 if SOAK else 900)
@pytest.mark.parametrize(("door", "store"), CASES)
def test_every_served_answer_has_its_record(door: str, store: str, tmp_path: Path,
                                            request: pytest.FixtureRequest) -> None:  # fmt: skip
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    store_url, fresh = _store(store, tmp_path, request)
    env = records_env(store_url, PAYLOAD)
    models = soak_models()
    log = CallLog()
    began = time.monotonic()
    soak: DoorSoak
    target: LoadTarget
    if door == "kserve":
        # The door's one process killed is the whole service killed; its window is the door soak's (until the door is
        # started again and the clients' gRPC channels, which back off while it is down, connect again).
        soak = kserve_soak(run_dir, models, kill_at=SECONDS / 3, env=env)
        target = oip_records_target(soak, log)
    else:
        worker_at, service_at = _kills(door, store)
        soak = torchserve_records_soak(run_dir, models, env, log, worker_kill_at=worker_at,
                                       service_kill_at=service_at)  # fmt: skip
        target = soak.target
    started_s = time.monotonic() - began
    since = wall_clock()
    try:
        report = run_load(target, concurrency=CONCURRENCY, seconds=SECONDS + GRACE_S, max_requests=200_000, seed=5,
                          request_timeout=REQUEST_TIMEOUT_S, on_progress=soak.on_progress, until=soak.done(SECONDS),
                          backoff=BACKOFF_S)  # fmt: skip
    finally:
        soak.stop()
    # A TorchServe worker's death may leave the batch it was gathering unanswered (docs/OPERATIONS.md): one batch.
    figures, problems = judge(report, soak.kills, unanswered_limit=soak.setup.get("batch_size", 0))
    recorded, missing = check_records(store_url, log.calls, since, fresh=fresh)
    shown = store_url if store_url.startswith("sqlite") else store_url.split("@")[-1]
    figures = {"door": door, "store": shown, "payload": PAYLOAD, "fresh_store": fresh, "concurrency": CONCURRENCY,
               "start_s": round(started_s, 1), **soak.setup, **figures, "records": recorded,
               "load_average": [round(value, 2) for value in os.getloadavg()]}  # fmt: skip
    log_figures(f"records_soak_{door}_{store.split(':')[0]}_{int(SECONDS)}s_c{CONCURRENCY}", figures, FIGURES)
    assert figures["requests"] >= CONCURRENCY, f"too few requests to mean anything: {figures}"
    assert figures["rest"] > 0 and figures["grpc"] > 0 and figures["bad"] > 0, figures
    assert recorded["served"] > 0, figures
    assert not problems, (problems, figures)
    assert not missing, (missing, figures)
