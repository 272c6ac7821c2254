"""Where a measurement ran: the one-line description of the machine that the evaluations' and the benchmarks'
reports carry with their numbers (``explain-eval --all``, ``bench/citations.py``)."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import torch
import transformers


def machine() -> str:
    """This machine in one line: the CPU model (from ``/proc/cpuinfo`` where there is one), the cores, torch's version
    and threads, the transformers and Python versions, and the operating system."""
    cpu = platform.processor() or platform.machine() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__} ({torch.get_num_threads()} threads), "
        f"transformers {transformers.__version__}, Python {platform.python_version()}, {platform.system()}"
    )
