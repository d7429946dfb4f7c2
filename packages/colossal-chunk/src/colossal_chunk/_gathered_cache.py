"""Gathered buffers' memory, kept between uses for the next buffer of its size.

[Note: gathered buffer cache] Gathered buffers came from the C heap and went back to it at every
release. Alone in a process the heap hands the same blocks back; beside other allocations of
similar sizes (another trainer in the process, a benchmark's peers) it fragments, and a buffer
lands on pages touched for the first time every few steps: 4,105 page faults per 16.8 MB buffer,
and 4-rank steps of GPT mini 30-70% slower. So, when the compute tier has no budget, a gathered
buffer is a tensor over a mapping of its own ([Note: host payloads] in ``_host_memory.py``), and
once the chunk lets it go and nothing else views it, the mapping is kept (any number of each
size) and the next gather of that size gets a new tensor over it: its pages are mapped already.
This is the emulated device's caching allocator: a kept mapping is reserved memory, not a live
tensor (no tracer of live tensors sees it; colossal-memtrace's peaks stay what torch's
``memory_allocated`` would say on a GPU, where CUDA's allocator does the same), and what is kept
plus what is in use never exceeds the most ever in use at once. A released buffer's mapping is
taken again only once the buffer's storage is gone (a weak reference to it, as memtrace's
tracker keeps): something may still view it (a saved tensor, or gloo's worker thread, which
holds a finished collective's tensors a moment after ``wait()`` returns). A buffer dropped
without being given back takes its mapping with it. The receive buffers of reduce-scatters run
as all-to-alls ([Note: reduce-scatter on gloo] in ``_reduce_scatter.py``), the size of a
gathered buffer, come from a cache of their own the same way. Under a
budget the cache is off: the budget's accounting is the emulated device's memory, and memory it
does not count would hold bytes the budget gave to activations. CUDA buffers never pass here.
"""

from __future__ import annotations

import mmap
import weakref

import torch

from ._host_memory import host_mapping

__all__ = ["GatheredCache"]


class GatheredCache:
    """Mappings for gathered CPU buffers, kept between uses; see [Note: gathered buffer cache]."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._free: dict[int, list[mmap.mmap]] = {}  # by size in bytes
        self._lent: weakref.WeakValueDictionary[int, mmap.mmap] = weakref.WeakValueDictionary()
        # given back, free once the buffer's storage is gone
        self._given: list[tuple[weakref.ref[torch.UntypedStorage], mmap.mmap]] = []

    def allocate(self, numel: int, dtype: torch.dtype) -> torch.Tensor | None:
        """An uninitialized 1-D CPU buffer of ``numel`` ``dtype`` values over a kept mapping (a
        new one when none of its size is free); None when the cache is off."""
        nbytes = numel * dtype.itemsize
        if not self.enabled or nbytes == 0:
            return None
        self._collect()
        kept = self._free.get(nbytes)
        m = kept.pop() if kept else host_mapping(nbytes)
        buf = torch.frombuffer(m, dtype=dtype, count=numel)  # holds ``m`` while alive
        self._lent[buf.data_ptr()] = m
        return buf

    def give(self, buf: torch.Tensor) -> None:
        """Keep the mapping under ``buf`` (a buffer ``allocate`` made, just let go) for the next
        buffer of its size, free once ``buf``'s storage is gone (no view of it is left)."""
        m = self._lent.pop(buf.data_ptr(), None)
        if m is not None:
            self._given.append((weakref.ref(buf.untyped_storage()), m))

    def _collect(self) -> None:
        """Free the mappings of given-back buffers whose storage is gone."""
        alive = []
        for ref, m in self._given:
            if ref() is None:
                self._free.setdefault(len(m), []).append(m)
            else:
                alive.append((ref, m))
        self._given = alive

    def clear(self) -> None:
        """Unmap every kept mapping (buffers in use keep theirs until they are dropped)."""
        self._free.clear()
        self._given.clear()

    @property
    def nbytes(self) -> int:
        """Bytes of the free mappings (reserved, not in use)."""
        self._collect()
        return sum(len(m) for kept in self._free.values() for m in kept)
