"""Run only by tests/test_cleanup.py, in a pytest subprocess that it then kills with SIGKILL: start every kind of
server the tests start — the session's TorchServe (the ``server`` fixture: the launcher in this process), a
TorchServe started by ``python -m doors start`` in a subprocess (as tests/integration/test_own_models.py
does), and a plain child through :func:`tests.serving_support.owned_popen` (as the Prometheus tests do) — write their
process groups to ``$CLEANUP_PROBE_MARK`` and wait to be killed. Not collected by ``pytest tests`` (its name does not
start with ``test_``); skipped when run without the mark file's path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from doors.torchserve.config import Ports
from doors.torchserve.process import EXPORTER_PID, TS_PID, Server
from supervise.supervisor import SUPERVISOR_PID
from tests import checkpoints
from tests.serving_support import REPO_ROOT, owned_popen

MARK = os.environ.get("CLEANUP_PROBE_MARK")


@pytest.mark.skipif(not MARK, reason="run by tests/test_cleanup.py only")
def test_start_servers_and_wait_to_be_killed(server: Server, tmp_path: Path) -> None:
    run_dir, store = tmp_path / "run", tmp_path / "store"
    env = {
        **os.environ,
        "MODELS": f"pairs={checkpoints.pair_encoder(tmp_path / 'pairs')}",
        "MODEL_STORE": str(store),
        "RUN_DIR": str(run_dir),
        **{f"{name.upper()}_PORT": str(value) for name, value in Ports.free().__dict__.items()},
    }
    started = subprocess.run(
        [sys.executable, "-m", "doors", "start"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=400, check=False,
    )  # fmt: skip
    assert started.returncode == 0, started.stdout + started.stderr
    child = owned_popen([sys.executable, "-c", "import time; time.sleep(900)"])
    groups = {
        "fixture torchserve": server.torchserve_pid,
        "fixture exporter": server.exporter_pid,
        "fixture router": server.router_pid or 0,  # the session's sentiment has an explanation pool
        "launcher torchserve": int((run_dir / TS_PID).read_text()),
        "launcher exporter": int((run_dir / EXPORTER_PID).read_text()),
        "launcher supervisor": int((run_dir / SUPERVISOR_PID).read_text()),  # `start` leaves it supervising
        "owned child": child.pid,
    }
    assert server.router_pid is not None, "the session's server is expected to route to an explanation pool"
    assert MARK is not None
    Path(MARK).write_text(json.dumps({"pytest": os.getpid(), "groups": groups}))
    time.sleep(900)  # killed long before
