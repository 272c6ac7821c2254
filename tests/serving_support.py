"""Helpers shared by the handler and serving tests: the tiny archives (built once, cached under build/), HTTP and
gRPC calls, and a tiny PNG."""

from __future__ import annotations

import base64
import io
import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PIL import Image

from supervise.watchdog import watch

REPO_ROOT = Path(__file__).resolve().parent.parent
ARCHIVE_CACHE = REPO_ROOT / "build" / "test-archives"


def tiny_archives() -> dict[str, Path]:
    """The tiny ``sentiment`` and ``digits`` archives (rebuilt only when their inputs change)."""
    from model_store.build import build_tiny_archives

    return build_tiny_archives(ARCHIVE_CACHE)


def owned_popen(args: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    """``subprocess.Popen(args, **kwargs)`` in its own session, with a watchdog that ends it (its whole process group)
    when this test process ends, even by SIGKILL. Stop it as usual (``terminate``/``wait``) in the test."""
    process = subprocess.Popen(args, start_new_session=True, **kwargs)
    watch(os.getpid(), groups=[process.pid])
    return process


def wait_for(condition: Callable[[], bool], timeout: float, interval: float = 0.2) -> bool:
    """Poll ``condition`` until it holds or ``timeout`` seconds pass; return whether it held."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return condition()


def png_bytes(size: tuple[int, int] = (32, 32), seed: int = 0) -> bytes:
    """A deterministic RGB PNG."""
    image = Image.new("RGB", size)
    image.putdata(
        [((x * 7 + seed) % 256, (y * 13) % 256, (x * y + seed) % 256) for y in range(size[1]) for x in range(size[0])]
    )
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return buffer.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def http_post(
    url: str, body: bytes, token: str | None, content_type: str = "application/json", timeout: float = 60.0
) -> tuple[int, Any]:
    """POST and return (status, parsed JSON or raw bytes)."""
    headers = {"Content-Type": content_type}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return http_call(urllib.request.Request(url, data=body, headers=headers, method="POST"), timeout)


def http_call(request: urllib.request.Request, timeout: float) -> tuple[int, Any]:
    """Send ``request``; return (status, parsed JSON or raw bytes), HTTP errors included."""
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, payload = response.status, response.read()
    except urllib.error.HTTPError as error:
        status, payload = error.code, error.read()
    try:
        return status, json.loads(payload)
    except ValueError:
        return status, payload
