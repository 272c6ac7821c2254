"""What every launcher reads the same way: from the environment, the run folder (in the working directory,
:mod:`supervise.workdir`), the addresses servers bind and the
ports of the public listeners; from its command line, ``NAME=VALUE`` pairs (``--archive``, ``--example``).

Everything binds 127.0.0.1 unless ``INFERENCE_ADDRESS`` / ``METRICS_ADDRESS`` say otherwise (containers and pods).
"""

from __future__ import annotations

import argparse
import ipaddress
import os
from pathlib import Path

from supervise.workdir import run_dir


def bind_address(variable: str) -> str:
    """The address to bind named by the environment variable ``variable`` (``INFERENCE_ADDRESS`` or
    ``METRICS_ADDRESS``), 127.0.0.1 when unset. Only for containers and pods, where the port must be reachable from
    outside the container's loopback (docs/OPERATIONS.md); management is never configurable.

    Raises:
        ValueError: if the value is not an IP address literal.
    """
    value = os.environ.get(variable) or "127.0.0.1"
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        raise ValueError(f"{variable}={value!r} is not an IP address (e.g. 127.0.0.1 or 0.0.0.0)") from None


def env_port(name: str, default: int) -> int:
    """The port ``<NAME>_PORT`` names (``INFERENCE_PORT``, ``GRPC_INFERENCE_PORT``, ...), else ``default``."""
    return int(os.environ.get(f"{name.upper()}_PORT") or default)


def run_dir_from_env() -> Path:
    """The run folder (pid files, logs, configs and tokens of the running service): ``RUN_DIR`` where set, else
    ``run/`` of the working directory (:func:`supervise.workdir.run_dir`)."""
    return Path(os.environ.get("RUN_DIR") or run_dir())


def name_value(text: str) -> tuple[str, str]:
    """A ``NAME=VALUE`` command-line argument as (name, value), split at the first ``=`` (an argparse ``type``).

    Raises:
        argparse.ArgumentTypeError: if either side is empty.
    """
    name, sep, value = text.partition("=")
    if not (name and sep and value):
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, value
