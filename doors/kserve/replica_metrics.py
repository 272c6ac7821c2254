"""The Ray Serve replicas' metrics on the door's ``/metrics``: each replica runs its model's monitor
(:mod:`monitoring.serving`), whose metrics (:mod:`monitoring.metrics`) live in the replica's process. A door that
starts its own local Ray gives its replicas a folder for ``prometheus_client``'s multiprocess mode
(``PROMETHEUS_MULTIPROC_DIR``, :func:`replica_folder`), and its own registry reads that folder
(:class:`ReplicaMetrics`), summed over the replicas as the exporter in front of TorchServe's workers sums its
workers' (each gauge by its ``multiprocess_mode``; a replica that is gone is dropped). So ``/metrics`` on the REST
port and on ``EXPORTER_PORT`` shows the replicas' monitors as it shows the in-process door's.

Replicas on other machines (``RAY_ADDRESS``, a KubeRay RayService) keep their monitors' metrics in their own
processes: scrape them there, or serve the model with the in-process KServe door.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client import multiprocess as prometheus_multiprocess

logger = logging.getLogger(__name__)

#: The folder of the replicas' metrics, in the door's run folder.
FOLDER = "replica-metrics"
_PID = re.compile(r"_(\d+)\.db$")


def replica_folder(run_dir: Path) -> Path:
    """An empty folder for the replicas' metric files, in ``run_dir`` (a previous run's files removed)."""
    folder = run_dir / FOLDER
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class ReplicaMetrics:
    """A collector of the replicas' metric files in ``folder`` (``prometheus_client``'s multiprocess mode); the files
    of a replica whose process has ended are dropped first (its live gauges no longer count)."""

    def __init__(self, folder: Path, names: Iterable[str]) -> None:
        """Read the families ``names`` (their names without ``_total``) from ``folder``."""
        self.folder = folder
        self.names = frozenset(names)
        self._collector = prometheus_multiprocess.MultiProcessCollector(None, path=str(folder))

    def collect(self) -> Iterable[Any]:
        """The replicas' metric families, summed as their modes say."""
        pids = {int(match.group(1)) for path in self.folder.glob("*.db") if (match := _PID.search(path.name))}
        for pid in pids:
            if not _alive(pid):
                prometheus_multiprocess.mark_process_dead(pid, str(self.folder))
        return [family for family in self._collector.collect() if family.name in self.names]


def export_replica_metrics(folder: Path, registry: CollectorRegistry = REGISTRY) -> ReplicaMetrics:
    """Add the replicas' metrics in ``folder`` to ``registry`` (the door's ``/metrics``), in place of the door's own
    monitor metrics (no monitor runs in the door's process then; each family is exported once)."""
    from monitoring import metrics as monitor_metrics

    metrics = monitor_metrics.METRICS
    for metric in metrics:
        with contextlib.suppress(KeyError):
            registry.unregister(metric)
    collector = ReplicaMetrics(folder, [metric._name for metric in metrics])
    registry.register(collector)
    logger.info("the replicas' monitor metrics are read from %s", folder)
    return collector


__all__ = ["FOLDER", "ReplicaMetrics", "export_replica_metrics", "replica_folder"]
