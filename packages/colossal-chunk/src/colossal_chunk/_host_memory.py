"""Host memory that goes back to the operating system when it is dropped.

[Note: host payloads] A chunk payload on the host (or on an emulated accelerator, which is host
memory too) is its own anonymous private mapping, not a block of the C heap: glibc serves
blocks of a few MiB from its heap once the first one was freed (its mmap threshold grows to the
largest freed block) and keeps freed heap memory in the process, so payloads moved between tiers
left the process's resident memory at the highest total it had ever held, not at the tiers'
budgets. A mapping is unmapped when the last tensor viewing it is dropped, so host memory in use
by payloads is what the tier accounting says, to the page. Fresh mappings are zero-filled.
Payloads of 2 MiB and more are advised onto transparent huge pages: with 4 KiB pages, the page
faults and zeroing of each new mapping cost ~12x a heap block's reuse (CPU time, 4 MiB); with
huge pages about the same (where the kernel offers no huge pages the cost stays).
Short-lived tensors (a chunk being materialized, autograd's gradients) still come from the heap;
``trim_host_heap`` hands what the heap freed back after such a phase.

[Note: bounded host heap] Under a host budget, the C heap is what no budget counts, and it grew
with the model's depth (bench lazy_rss): autograd's gradients of a few MiB came from the heap
once glibc's mmap threshold had risen past them, and their freed blocks, split for smaller
allocations, were kept; the forward's activations, freed in backward, stayed as heap free space
through the optimizer step, and in backward, where they are freed, the accelerator budget's
room for non-model data (live tensors) no longer counted them. ``map_large_host_blocks`` fixes
the threshold: blocks of 32 KiB and more (one activation of 16 tokens x 512 fp32) get their own
mapping, unmapped when freed (with 256 KiB the excess over the budgets still grew by ~1 MiB a
layer: 16-token activations stayed in the heap); each costs a map and a few page faults, ~10 us,
beside steps of seconds under a host budget. A trim at the optimizer step's start hands back the
rest that backward freed. Both are process-wide settings of the C library, made only where a
host budget was asked for.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import sys

import torch

__all__ = ["host_empty", "host_mapping", "map_large_host_blocks", "trim_host_heap"]

_HUGE = 2 << 20  # a transparent huge page: payloads this large are advised to use them
_M_MMAP_THRESHOLD = -3  # mallopt parameter (glibc malloc.h)
_MAPPED_BLOCK = 32 << 10  # heap blocks this large are mapped ([Note: bounded host heap])


def host_empty(numel: int, dtype: torch.dtype, *, huge: bool = True) -> torch.Tensor:
    """A 1-D CPU tensor of ``numel`` zeros in its own anonymous mapping ([Note: host payloads]);
    with ``huge``, one of 2 MiB or more is advised to use transparent huge pages (resident 2 MiB
    at a time: without, a mapping filled piece by piece is resident only as far as it is)."""
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    if nbytes == 0:
        return torch.empty(0, dtype=dtype)
    buf = host_mapping(nbytes, huge=huge)
    return torch.frombuffer(buf, dtype=dtype, count=numel)  # keeps ``buf`` mapped while alive


def host_mapping(nbytes: int, *, huge: bool = True) -> mmap.mmap:
    """An anonymous private mapping of ``nbytes`` (> 0) zero bytes; with ``huge``, one of 2 MiB
    or more advised to use transparent huge pages ([Note: host payloads])."""
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if huge and nbytes >= _HUGE and hasattr(mmap, "MADV_HUGEPAGE"):
        with contextlib.suppress(OSError):  # a kernel without transparent huge pages
            buf.madvise(mmap.MADV_HUGEPAGE)
    return buf


def trim_host_heap() -> None:
    """Return the C heap's free memory to the operating system (glibc ``malloc_trim``; a no-op
    elsewhere). Costs a walk over the heap's free blocks: call it after a phase, not per op."""
    if not sys.platform.startswith("linux"):
        return
    try:
        fn = ctypes.CDLL(None).malloc_trim  # the C library already loaded (dlopen(NULL))
    except AttributeError:  # not glibc (musl has no malloc_trim)
        return
    fn.argtypes = [ctypes.c_size_t]
    fn(0)


def map_large_host_blocks() -> bool:
    """Give every C heap block of 32 KiB or more its own mapping, for the rest of the process
    (glibc ``mallopt(M_MMAP_THRESHOLD)``, which also stops the threshold from rising; [Note:
    bounded host heap]), unless free heap space can hold it: glibc serves a block from its free
    blocks, or from the slack (128 KiB) the heap's top keeps after it grows, before it maps one
    (with small allocations between 32 KiB blocks, about one in five came from that slack).
    False where it cannot be set (not glibc)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        fn = ctypes.CDLL(None).mallopt
    except AttributeError:  # not glibc
        return False
    fn.argtypes, fn.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return fn(_M_MMAP_THRESHOLD, _MAPPED_BLOCK) == 1
