"""Peak memory of one call, above what was resident before it: the CPU's resident set or the CUDA allocator's.

CPU: glibc keeps freed memory in its heap, so a call may reuse memory freed earlier (loading the model) without
the resident set growing, and raise its mmap threshold after large frees. :func:`prepare_cpu_allocator` (call it
once, before loading anything) fixes the mmap threshold, so every large tensor is its own mapping, returned to the
system when freed; :class:`PeakMemory` then trims the heap, resets the kernel's peak counter (``VmHWM``, through
``/proc/self/clear_refs``) and reads the resident set before the call and its peak after. CUDA: the allocator's
peak above its allocation before the call.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD = 128 * 1024


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name) if name else None
    except OSError:
        return None


def prepare_cpu_allocator() -> bool:
    """Make every allocation of at least 128 KiB its own mapping (no dynamic threshold); ``False`` off glibc."""
    libc = _libc()
    return bool(libc is not None and libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD))


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _reset_peak() -> None:
    gc.collect()
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS


@dataclass
class Peak:
    """The result of :func:`peak_memory`: bytes above the start, filled when the block exits."""

    bytes: int = 0

    @property
    def mib(self) -> float:
        """The peak in MiB."""
        return self.bytes / 2**20


@contextmanager
def peak_memory(device: str = "cpu") -> Iterator[Peak]:
    """Measure the peak memory of the block above the memory in use when it starts."""
    peak = Peak()
    if device == "cuda":
        torch.cuda.synchronize()
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        yield peak
        torch.cuda.synchronize()
        peak.bytes = torch.cuda.max_memory_allocated() - base
        return
    _reset_peak()
    base = _status_kib("VmRSS")
    yield peak
    peak.bytes = max(0, _status_kib("VmHWM") - base) * 1024
