"""Peak-memory windows and giving freed heap memory back (agentrft/memory.py)."""

from __future__ import annotations

import ctypes.util
import mmap
from pathlib import Path

import numpy as np
import pytest

from agentrft.memory import peak_rss_mb, release_free_memory, reset_peak_rss


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


linux_glibc = pytest.mark.skipif(
    not Path("/proc/self/status").exists() or ctypes.util.find_library("c") is None,
    reason="Linux with glibc only",
)


@linux_glibc
def test_peak_window_restarts_on_reset():
    if not reset_peak_rss():
        pytest.skip("this kernel did not reset the peak (VmHWM) on request")
    # an anonymous mapping of its own: a numpy array could reuse free heap pages that are
    # already resident (after earlier tests), and then neither the peak nor RSS would move
    block = mmap.mmap(-1, 300 * 2**20)
    view = np.frombuffer(block, dtype=np.uint8)
    view[:] = 1  # touch every page: 300 MiB resident
    high = peak_rss_mb()
    assert high >= rss_mb() - 1
    del view
    block.close()  # munmap: the pages go back at once
    if not reset_peak_rss():
        pytest.skip("this kernel did not reset the peak (VmHWM) on request")
    assert peak_rss_mb() < high - 200


@linux_glibc
def test_freed_heap_memory_goes_back_to_the_os():
    # 100 KiB blocks sit below malloc's mmap threshold, so they live on the heap; keeping one
    # in ten alive fragments it, and free() alone then gives almost nothing back
    blocks = [np.ones(100 * 1024 // 8) for _ in range(3000)]
    blocks = blocks[::10]
    before = rss_mb()
    assert release_free_memory()
    assert rss_mb() < before - 100
    del blocks
