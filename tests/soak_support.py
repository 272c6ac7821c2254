"""The soak and the kill test through every door other than TorchServe's own (tests/test_reliability.py has that one):
the KServe door, Ray Serve replicas behind it, and TorchServe with an explanation pool behind the router.

Each :class:`DoorSoak` starts its service on free loopback ports, says how it is loaded (the mixed REST/gRPC load of
:func:`tests.ops_support.run_load`, through :class:`~tests.ops_support.OipTarget` or
:class:`~tests.ops_support.TorchServeTarget`) and which faults it takes (:class:`Kill`), and is stopped by its pids at
the end, also on failure:

- ``kserve``: the door is one process (models, batcher, REST and gRPC in it); the fault is a SIGKILL of that process.
  Nothing inside the service restarts it (its supervisor reports the end and exits 1, docs/OPERATIONS.md): here the
  door is started again on the same ports as a container's restart policy would, and the recovery is that restart.
- ``ray``: the text model on two Ray Serve replicas (the image model on one); the fault is a SIGKILL of one text
  replica's actor process, and Ray Serve starts a replacement.
- ``pool``: TorchServe with an explanation pool for the text model (two pool workers, one prediction worker) behind
  the router, under the launcher's supervisor (:mod:`supervise.supervisor`, in a thread here); the faults are a
  SIGKILL of the router (the supervisor starts it again) and then of one pool worker (TorchServe replaces it).

:func:`judge` turns the outcomes into the figures of each kill and the list of what broke the criteria: no good
request fails except in a kill's window (from the kill until the door answers that kind of request again, bounded by
the door's limit), and each of those failures is retryable (503 / ``UNAVAILABLE``, TorchServe's "Worker died.", or no
connection: :attr:`~tests.ops_support.Outcome.retryable`).

The models are the tiny test archives, or with ``SOAK_STORE=model_store/build`` the default models built there
(``sentiment``, and ``digits`` where it is built: without it, or with ``text_only``, the load is text only).
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from doors.torchserve.config import POOL_KEY, Ports, load_profile
from doors.torchserve.process import Server
from doors.torchserve.process import start as start_torchserve
from doors.torchserve.process import stop as stop_torchserve
from doors.torchserve.supervision import RESTARTABLE, restart_counter
from supervise.processes import accepting, pid_alive, read_pid
from supervise.supervisor import Child, Supervisor
from supervise.watchdog import watch
from tests.ops_support import NO_ANSWER, LoadReport, LoadTarget, OipTarget, Outcome, TorchServeTarget, worker_pids
from tests.serving_support import REPO_ROOT, tiny_archives

#: ``make soak`` (``SOAK=1``): the long run; else the short one ``make test`` runs.
SOAK = os.environ.get("SOAK") == "1"
#: Client deadline of each request: a request a dying TorchServe worker dropped waits this long.
REQUEST_TIMEOUT_S = 60.0 if SOAK else 20.0
#: The most seconds the load may run past its length while a killed process or service starts again.
GRACE_S = 600.0
#: A load thread's pause after a retryable failure (a retrying client's back-off).
BACKOFF_S = 0.2
#: Where the soaks append their figures.
FIGURES = REPO_ROOT / "build" / "ops-figures.jsonl"

#: Workers of the explanation pool of the ``pool`` door: the twin answers while a killed one restarts.
POOL_WORKERS = 2
#: Replicas of the text model on the ``ray`` door.
RAY_REPLICAS = 2


def soak_models(text_only: bool = False) -> dict[str, Path]:
    """The archives the soaks serve: ``sentiment`` and ``digits`` (module docstring); ``text_only``: ``sentiment``
    alone (one process fewer to start per door).

    Raises:
        FileNotFoundError: if ``SOAK_STORE`` has no sentiment archive.
    """
    store = os.environ.get("SOAK_STORE")
    if not store:
        tiny = tiny_archives()
        return (
            {"sentiment": tiny["sentiment"]}
            if text_only
            else {"sentiment": tiny["sentiment"], "digits": tiny["digits"]}
        )
    found = {name: Path(store) / name / "archive" for name in ("sentiment", "digits")}
    models = {name: path for name, path in found.items() if (path / "model-config.yaml").is_file()}
    if text_only:
        models.pop("digits", None)
    if "sentiment" not in models:
        raise FileNotFoundError(f"SOAK_STORE={store} has no sentiment/archive: run `make models`")
    return models


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """``OMP_NUM_THREADS=1`` while servers are started (inherited by their workers: several share a few cores)."""
    previous = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = previous


@dataclass
class Kill:
    """One fault injected under load."""

    #: What is killed (``door process``, ``replica``, ``router``, ``pool worker``).
    name: str
    #: Seconds into the load when it is killed (once :attr:`ready` holds).
    at: float
    #: Kills it; returns the pid killed.
    act: Callable[[], int]
    #: The requests the kill can fail, and whose first answer after it is the recovery.
    affected: Callable[[Outcome], bool]
    #: Seconds after the kill within which the affected requests must be answered again and every failure happen.
    limit_s: float
    #: Whether the kill may happen now (e.g. the previous fault is repaired).
    ready: Callable[[], bool] = lambda: True
    #: Whether the service is whole again (the killed process replaced); the load runs until it is.
    repaired: Callable[[], bool] = lambda: True
    #: Whether the load goes on until :attr:`repaired` holds (the door cannot answer before: the KServe door's
    #: restart, the router's); else the replacement is timed only if it comes during the load.
    wait_repair: bool = False
    #: The kill's window ends this many seconds after :attr:`repaired` first held (else :attr:`limit_s` after the
    #: kill): a request sent later must be answered as usual.
    settle_s: float | None = None
    #: The most good requests the kill may leave without any answer (None: :func:`judge`'s ``unanswered_limit``): a
    #: whole service stopped hard leaves the callers of the requests it had queued to their deadlines.
    unanswered_limit: float | None = None
    #: Run in a thread after the kill (the KServe door's restart).
    after: Callable[[], None] | None = None
    #: When it was killed (``time.monotonic``), the pid, and when :attr:`repaired` first held.
    killed: float | None = None
    pid: int = 0
    repaired_at: float | None = None
    _thread: threading.Thread | None = field(default=None, repr=False)

    def inject(self) -> None:
        """Kill now (and start :attr:`after`)."""
        self.killed = time.monotonic()
        self.pid = self.act()
        if self.after is not None:
            self._thread = threading.Thread(target=self.after, name=f"after-{self.name}", daemon=True)
            self._thread.start()

    def settled(self) -> bool:
        """Whether the kill happened and the service was repaired (records when)."""
        if self.killed is None:
            return False
        if self.repaired_at is None and (self._thread is None or not self._thread.is_alive()) and self.repaired():
            self.repaired_at = time.monotonic()
        return self.repaired_at is not None

    @property
    def over(self) -> float | None:
        """When the load may end as far as this kill goes (``time.monotonic``; ``None``: not yet)."""
        if self.killed is None or (self.wait_repair and self.repaired_at is None):
            return None
        return self.repaired_at if self.wait_repair else self.killed

    def join(self, timeout: float) -> None:
        """Wait for :attr:`after` to finish."""
        if self._thread is not None:
            self._thread.join(timeout)


@dataclass
class DoorSoak:
    """A started door under test: how it is loaded, the faults it takes, and how it is stopped."""

    name: str
    target: LoadTarget
    kills: list[Kill]
    stop: Callable[[], None]
    #: Details for the figures (models, replicas, workers).
    setup: dict[str, Any] = field(default_factory=dict)

    _polled: float = 0.0

    def on_progress(self, elapsed: float) -> None:
        """Inject the kills when their time comes, one at a time and in order, and note when the killed processes are
        replaced (called between requests of one load thread; polls at most every 0.25 s)."""
        now = time.monotonic()
        if now - self._polled < 0.25:
            return
        self._polled = now
        for kill in self.kills:
            if kill.killed is None:
                if elapsed >= kill.at and kill.ready():
                    kill.inject()
                return
            kill.settled()

    def done(self, seconds: float) -> Callable[[float], bool]:
        """The load's stop condition: ``seconds`` passed, every kill happened, the processes the door cannot answer
        without are back (:attr:`Kill.wait_repair`), and 2 s more passed."""

        def until(elapsed: float) -> bool:
            if elapsed < seconds:
                return False
            moments = [kill.over for kill in self.kills]
            if any(moment is None for moment in moments):
                return False
            return time.monotonic() - max(moment or 0.0 for moment in moments) >= 2.0

        return until


# -- the doors ----------------------------------------------------------------------------------------------------


def _image_share(models: dict[str, Path]) -> float:
    return 0.25 if "digits" in models else 0.0


def kserve_soak(run_dir: Path, models: dict[str, Path], kill_at: float, ready_timeout: float = 600.0,
                env: dict[str, str] | None = None) -> DoorSoak:  # fmt: skip
    """The KServe door, killed at ``kill_at`` s and started again on the same ports (module docstring); ``env``: extra
    environment of the door's process (e.g. the records settings, kept across the restart)."""
    from doors.kserve import launch as launcher

    ports = Ports.free()

    def launch() -> Any:
        with one_thread():
            return launcher.start("kserve", models, run_dir, ports.inference, ports.grpc_inference,
                                  timeout=ready_timeout, env=env)  # fmt: skip

    door = [launch()]
    began: list[float] = []

    def kill() -> int:
        pid = int(door[0].pid)
        os.kill(pid, signal.SIGKILL)
        return pid

    def restart() -> None:
        process = door[0].process
        if process is not None:
            process.wait(timeout=60)  # reap it, as its supervisor would
        launcher.stop(run_dir)  # its pid file and watchdog
        began.append(time.monotonic())
        door[0] = launch()

    killing = Kill("door process", kill_at, kill, lambda outcome: True, limit_s=ready_timeout, after=restart,
                   repaired=lambda: pid_alive(door[0].pid) and bool(began), wait_repair=True)  # fmt: skip
    target = OipTarget("127.0.0.1", ports.inference, ports.grpc_inference, _image_share(models))
    return DoorSoak("kserve", target, [killing], lambda: _stop_door(launcher, run_dir, killing),
                    {"models": sorted(models), "processes": 1})  # fmt: skip


def _stop_door(launcher: Any, run_dir: Path, kill: Kill) -> None:
    kill.join(600)
    launcher.stop(run_dir)


def text_replicas(door_pid: int) -> list[int]:
    """Pids of the text model's Ray Serve replica actors (processes of the door's local Ray)."""
    pids = []
    with contextlib.suppress(psutil.Error):
        for process in psutil.Process(door_pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if any("ServeReplica:sentiment:" in part for part in process.cmdline()):
                    pids.append(process.pid)
    return sorted(pids)


def ray_soak(run_dir: Path, models: dict[str, Path], kill_at: float, limit_s: float = 10.0) -> DoorSoak:
    """Ray Serve behind the KServe door, the text model on :data:`RAY_REPLICAS` replicas; one is killed at
    ``kill_at`` s."""
    from doors.kserve import launch as launcher

    ports = Ports.free()
    replicas = {name: RAY_REPLICAS if name == "sentiment" else 1 for name in models}
    with one_thread():
        door = launcher.start("ray", models, run_dir, ports.inference, ports.grpc_inference, replicas=replicas,
                              timeout=900)  # fmt: skip
    before: list[int] = []

    def kill() -> int:
        before[:] = text_replicas(door.pid)
        if len(before) != RAY_REPLICAS:
            raise RuntimeError(f"expected {RAY_REPLICAS} text replicas, found pids {before}")
        os.kill(before[0], signal.SIGKILL)
        return before[0]

    def replaced() -> bool:
        now = text_replicas(door.pid)
        return len(now) == RAY_REPLICAS and before[0] not in now

    killing = Kill("replica", kill_at, kill, lambda outcome: outcome.model == "sentiment", limit_s=limit_s,
                   repaired=replaced)  # fmt: skip
    target = OipTarget("127.0.0.1", ports.inference, ports.grpc_inference, _image_share(models))
    return DoorSoak("ray", target, [killing], lambda: _stop_door(launcher, run_dir, killing),
                    {"models": sorted(models), "replicas": replicas})  # fmt: skip


def pool_soak(run_dir: Path, models: dict[str, Path], kill_at: tuple[float, float], limit_s: float = 30.0) -> DoorSoak:
    """TorchServe with an explanation pool behind the router, supervised; the router is killed at ``kill_at[0]`` s,
    then (once it answers again) one pool worker at ``kill_at[1]`` s."""
    pooled = load_profile("cpu-pooled")
    pool = {**pooled[POOL_KEY], "minWorkers": POOL_WORKERS, "maxWorkers": POOL_WORKERS}
    overrides = {name: {**pooled, POOL_KEY: pool} if name == "sentiment" else load_profile("cpu") for name in models}
    with one_thread():
        server = start_torchserve(run_dir, REPO_ROOT, {name: str(path.resolve()) for name, path in models.items()},
                                  Ports.free(), timeout=600, overrides=overrides)  # fmt: skip
    supervisor, thread = _supervise(server)

    def stop() -> None:
        supervisor.request_stop()
        thread.join(60)
        stop_torchserve(run_dir)

    try:
        deadline = time.monotonic() + 600
        while len(worker_pids(server, "sentiment.explain")) < POOL_WORKERS and time.monotonic() < deadline:
            time.sleep(0.5)
    except BaseException:
        stop()
        raise
    router_file = run_dir.resolve() / "router.pid"
    killed: dict[str, int] = {}

    def kill_router() -> int:
        killed["router"] = read_pid(router_file) or 0
        os.kill(killed["router"], signal.SIGKILL)
        return killed["router"]

    def router_back() -> bool:
        pid = read_pid(router_file)
        return pid not in (None, killed.get("router")) and accepting("127.0.0.1", server.ports.inference)

    def kill_worker() -> int:
        killed["worker"] = worker_pids(server, "sentiment.explain")[0]
        os.kill(killed["worker"], signal.SIGKILL)
        return killed["worker"]

    def worker_back() -> bool:
        pids = worker_pids(server, "sentiment.explain")
        return len(pids) == POOL_WORKERS and killed["worker"] not in pids

    def explained(outcome: Outcome) -> bool:
        return outcome.model == "sentiment" and outcome.method not in ("none", "bad")

    kills = [
        Kill("router", kill_at[0], kill_router, lambda outcome: True, limit_s=limit_s, repaired=router_back,
             wait_repair=True),
        Kill("pool worker", kill_at[1], kill_worker, explained, limit_s=limit_s,
             ready=lambda: router_back() and len(worker_pids(server, "sentiment.explain")) == POOL_WORKERS,
             repaired=worker_back),
    ]  # fmt: skip
    workers = {"sentiment": 1, "sentiment.explain": POOL_WORKERS, **{name: 1 for name in models if name != "sentiment"}}
    return DoorSoak("pool", TorchServeTarget(server, _image_share(models)), kills, stop,
                    {"models": sorted(models), "workers": workers})  # fmt: skip


def _supervise(server: Server) -> tuple[Supervisor, threading.Thread]:
    """The launcher's supervision of ``server`` (:func:`doors.torchserve.supervision.supervise`), in a thread;
    each restarted process also gets a watchdog, so that it ends with this process however this one ends."""
    children = [
        Child(key, server.launches[key], process, restartable=key in RESTARTABLE)
        for key, process in server.processes.items()
    ]
    count = restart_counter(server.run_dir / "prometheus", [child.key for child in children if child.restartable])

    def restarted(child: Child) -> None:
        count(child)
        watch(os.getpid(), groups=[child.process.pid])

    supervisor = Supervisor(server.run_dir, children, lambda: None, restarted)
    thread = threading.Thread(target=supervisor.run, name="supervisor", daemon=True)
    thread.start()
    return supervisor, thread


# -- the verdict ------------------------------------------------------------------------------------------------


def judge(report: LoadReport, kills: list[Kill], unanswered_limit: int = 0) -> tuple[dict[str, Any], list[str]]:
    """The load's figures, each kill's, and what broke the criteria (module docstring); ``unanswered_limit``: how
    many requests may get no answer at all at a TorchServe worker's death (its 0.12 defect, docs/OPERATIONS.md)."""
    figures: dict[str, Any] = report.summary()
    answered = sorted((o.finished - o.started) * 1000 for o in report.outcomes if o.ok)  # bad ones: their 4xx
    figures["answered"] = len(answered)
    figures["answered_per_second"] = round(len(answered) / report.seconds, 1) if report.seconds else 0.0
    for name, q in (("answered_p50_ms", 0.5), ("answered_p99_ms", 0.99)):
        figures[name] = round(answered[min(len(answered) - 1, int(q * len(answered)))], 1) if answered else 0.0
    problems: list[str] = []
    windows: list[tuple[float, float]] = []
    kill_figures = []

    def last_kill(outcome: Outcome) -> Kill | None:
        """The kill a failure belongs to: the last one before it ended."""
        before = [kill for kill in kills if kill.killed is not None and kill.killed < outcome.finished]
        return max(before, key=lambda kill: kill.killed or 0.0, default=None)

    for index, kill in enumerate(kills):
        if kill.killed is None:
            problems.append(f"the {kill.name} was never killed (load too short?)")
            continue
        killed = kill.killed
        following = [later.killed for later in kills[index + 1 :] if later.killed is not None]
        end = min([killed + kill.limit_s, *following])  # a kill's window ends where the next one's begins
        if kill.settle_s is not None and kill.repaired_at is not None:
            end = min(end, kill.repaired_at + kill.settle_s)
        affected = [outcome for outcome in report.outcomes if kill.affected(outcome) and outcome.started <= end]
        answered = [outcome.finished for outcome in affected if outcome.ok and outcome.started > killed]
        recovery = min(answered) - killed if answered else math.inf
        windows.append((killed, end))
        hit = [o for o in report.outcomes if last_kill(o) is kill and o.started <= end
               and not o.ok and (o.retryable or o.status in NO_ANSWER)]  # fmt: skip
        good = [outcome for outcome in hit if outcome.good]
        unanswered = sum(outcome.status in NO_ANSWER for outcome in good)
        kill_figures.append({
            "killed": kill.name,
            "pid": kill.pid,
            "in_flight": sum(outcome.started <= killed < outcome.finished for outcome in affected),
            "failed": len(good),
            "failed_in_flight": sum(outcome.started <= killed for outcome in good),
            "failed_sent_after": sum(outcome.started > killed for outcome in good),
            "unanswered": unanswered,
            "statuses": sorted({outcome.status for outcome in hit}),
            "details": sorted({outcome.detail[:100] for outcome in hit})[:4],
            "last_failure_s": round(max((o.started for o in good), default=killed) - killed, 2),
            "recovery_s": round(recovery, 2),
            "repaired_s": round(kill.repaired_at - killed, 2) if kill.repaired_at is not None else None,
        })  # fmt: skip
        if recovery > end - killed:
            problems.append(f"{kill.name}: no request it affects was answered within {end - killed:.1f} s of the kill")
        if unanswered > (unanswered_limit if kill.unanswered_limit is None else kill.unanswered_limit):
            problems.append(f"{kill.name}: {unanswered} requests got no answer")

    def in_window(outcome: Outcome) -> bool:
        return any(outcome.finished > start and outcome.started <= end for start, end in windows)

    def excused(outcome: Outcome) -> bool:
        return in_window(outcome) and (outcome.retryable or outcome.status in NO_ANSWER)

    outside = [outcome for outcome in report.good_failures if not excused(outcome)]
    wrong_bad = [outcome for outcome in report.bad_misanswered if not excused(outcome)]
    figures["failed_good"] = len(outside)
    figures["kills"] = kill_figures
    if outside:
        problems.append(f"{len(outside)} good requests failed outside a kill or not retryably: "
                        f"{[outcome.__dict__ for outcome in outside[:3]]}")  # fmt: skip
    if wrong_bad:
        problems.append(f"{len(wrong_bad)} bad requests did not get their error: "
                        f"{[outcome.__dict__ for outcome in wrong_bad[:3]]}")  # fmt: skip
    return figures, problems
