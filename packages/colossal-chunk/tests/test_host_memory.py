"""[Note: host payloads]: a host (or emulated-accelerator) payload is its own anonymous mapping,
zero-filled, unmapped as soon as its last view is dropped (not kept by the C heap)."""

import gc
import mmap
import sys

import pytest
import torch

from colossal_chunk import host_empty, trim_host_heap
from colossal_chunk._tier import Tier
from colossal_contracts import TierName

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")


def _mapped(addr: int) -> bool:
    """True if ``addr`` lies in a mapping of this process (the kernel may merge neighbours)."""
    with open("/proc/self/maps") as f:
        for line in f:
            lo, hi = (int(x, 16) for x in line.split(None, 1)[0].split("-"))
            if lo <= addr < hi:
                return True
    return False


@linux
def test_a_host_payload_is_a_mapping_that_leaves_with_its_last_view():
    t = host_empty(1 << 20, torch.float32)
    assert t.shape == (1 << 20,) and t.dtype == torch.float32
    assert torch.count_nonzero(t) == 0
    addr = t.data_ptr()
    assert addr % mmap.PAGESIZE == 0 and _mapped(addr)
    view = t[10:20]
    del t
    gc.collect()
    assert _mapped(addr)  # a view keeps the payload
    del view
    assert not _mapped(addr)  # unmapped: heap memory would have stayed mapped


@linux
def test_host_and_emulated_tiers_allocate_mappings():
    for name in (TierName.HOST, TierName.ACCELERATOR):
        t = Tier(name, torch.device("cpu")).allocate("k", 4096, torch.bfloat16)
        assert t.numel() == 4096 and t.dtype == torch.bfloat16
        addr = t.data_ptr()
        assert addr % mmap.PAGESIZE == 0
        del t
        assert not _mapped(addr)
    assert host_empty(0, torch.float32).numel() == 0
    trim_host_heap()  # a no-op where the C library has no malloc_trim; never raises
