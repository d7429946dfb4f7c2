"""[Note: bounded host heap]: after ``map_large_host_blocks`` the C library maps large blocks
instead of serving them from its heap, so the pages of a freed block go back to the system at
once; without it glibc's mmap threshold rises past every large block freed (a gradient of a few
MiB), larger blocks then come from the heap, which keeps their pages when they are freed, and
only ``trim_host_heap`` hands those back.

``map_large_host_blocks`` changes the C library's settings for the whole process, so the check
runs in a two-rank world of its own, closed after it (never in the pytest process, nor in the
session's shared worlds)."""

import ctypes
import mmap
import sys

import pytest
from _checks_host_heap import SIZES, freed_and_trimmed

from colossal_testing import World

pytestmark = pytest.mark.skipif(
    not (sys.platform.startswith("linux") and hasattr(ctypes.CDLL(None), "mallopt")),
    reason="glibc's mallopt and malloc_trim (Linux with glibc only)",
)

TOTAL = 64 << 20  # bytes freed per block size (large against RSS noise of the rank's other threads)


def test_large_blocks_are_mapped_and_leave_when_freed():
    with World(2) as w:
        mapped, plain = w.run(freed_and_trimmed, TOTAL)
    assert mapped["mapped"] is True and plain["mapped"] is None
    for size in map(str, SIZES):
        # without it: blocks under the risen threshold come from the heap, which keeps them ...
        freed, trimmed = plain[size]
        # ... until a trim hands back the whole pages in each hole (a hole's ends share a page
        # with the blocks kept beside it)
        whole = TOTAL - TOTAL // int(size) * 2 * mmap.PAGESIZE
        assert freed <= 0.1 * TOTAL and trimmed >= 0.95 * whole, (size, plain)
        # with it: each block is its own mapping, unmapped when freed; the threshold is fixed
        # (the freed 4 MiB tensor did not raise it) at 32 KiB
        # (0.7: the rank's other threads allocate meanwhile; 0.897 and 0.79 were seen under a
        # loaded CI; the plain heap gives back at most 0.1)
        freed, _ = mapped[size]
        assert freed >= 0.7 * TOTAL, (size, mapped)
