"""TorchServe's service under its supervisor (:mod:`supervise.supervisor`): TorchServe's frontend is essential (its
end ends the service, reported with its exit status and log), the explanation-pool router and the metrics exporter
are started again when they end, and each restart is counted in ``explain_process_restarts_total{process=...}``,
which the exporter serves with the workers' metrics (docs/OPERATIONS.md, "What the launcher supervises")."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path

from doors.torchserve.process import Server, stop
from supervise.supervisor import Child, Supervisor
from supervise.watchdog import owner_pid

#: The restart counter, labelled by ``process`` (``router``, ``exporter``).
RESTARTS_METRIC = "explain_process_restarts"
RESTARTS_HELP = "Times the launcher started a process of the service again after it ended by itself"
#: The processes started again when they end; the others (TorchServe) end the service.
RESTARTABLE = ("router", "exporter")


def restart_counter(metrics_dir: Path, processes: Iterable[str]) -> Callable[[Child], None]:
    """A counter of restarts per process in the Prometheus multiprocess folder ``metrics_dir`` (the exporter's
    ``PROMETHEUS_MULTIPROC_DIR``), written by this process whatever the rest of it uses prometheus-client for. Each
    process's count is 0 until its first restart, so that the series exists from the start.

    Returns:
        ``count(child)``: add one restart of ``child``.
    """
    from prometheus_client.values import MultiProcessValue

    previous = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)  # where the value's file goes (read when it is made)
    try:
        value_class = MultiProcessValue()
        values = {
            name: value_class(
                "counter", RESTARTS_METRIC, f"{RESTARTS_METRIC}_total", ("process",), (name,), RESTARTS_HELP
            )
            for name in processes
        }
    finally:
        if previous is None:
            del os.environ["PROMETHEUS_MULTIPROC_DIR"]
        else:
            os.environ["PROMETHEUS_MULTIPROC_DIR"] = previous

    def count(child: Child) -> None:
        values[child.key].inc(1)

    return count


def supervise(server: Server) -> int:
    """Supervise ``server`` (started by this process) until it is stopped (returns 0) or fails (returns 1): see the
    module docstring."""
    children = [
        Child(key, server.launches[key], process, restartable=key in RESTARTABLE)
        for key, process in server.processes.items()
    ]
    count = restart_counter(server.run_dir / "prometheus", [child.key for child in children if child.restartable])
    supervisor = Supervisor(server.run_dir, children, lambda: stop(server.run_dir), count, owner_pid())
    return supervisor.run()
