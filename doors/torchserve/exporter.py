"""Serve the workers' explanation metrics (prometheus-client multiprocess mode) for Prometheus to scrape.

``python -m doors.torchserve.exporter --dir run/prometheus --port 8083`` binds 127.0.0.1 by default; the metrics carry
no request data but, like TorchServe's metrics port, should stay private.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from pathlib import Path

logger = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point: serve until SIGTERM/SIGINT."""
    parser = argparse.ArgumentParser(prog="python -m doors.torchserve.exporter", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, required=True, help="PROMETHEUS_MULTIPROC_DIR of the workers")
    parser.add_argument("--port", type=int, default=8083)
    parser.add_argument("--address", default="127.0.0.1")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    args.dir.mkdir(parents=True, exist_ok=True)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(args.dir)
    from prometheus_client import CollectorRegistry, multiprocess, start_http_server

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(args.dir))
    server, thread = start_http_server(args.port, addr=args.address, registry=registry)
    logger.info("explanation metrics on http://%s:%d/metrics (from %s)", args.address, args.port, args.dir)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    server.shutdown()
    thread.join(timeout=5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
