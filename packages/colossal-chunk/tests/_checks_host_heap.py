"""Run by test_host_heap.py in a world of its own (the settings it changes stay with a process):
rank 0 calls ``map_large_host_blocks``, rank 1 does not."""

import mmap

import torch
import torch.distributed as dist

from colossal_chunk import map_large_host_blocks, trim_host_heap

SIZES = (32 << 10, 256 << 10)  # block bytes (32 KiB: one activation of 16 tokens x 512 fp32);
# smaller first: the holes it leaves in the heap cannot serve the larger blocks


def _rss() -> int:
    """This process's resident bytes (Linux: /proc/self/statm counts pages)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * mmap.PAGESIZE


def freed_and_trimmed(total: int) -> dict[str, object]:
    """Per block size, the resident bytes that left when ``total`` bytes of blocks were freed,
    and after a heap trim. A 4 MiB tensor is freed first (glibc's threshold then rises to 4 MiB,
    as after a gradient); then 2 x ``total`` bytes of tensors (every page written), and every
    other one is freed: the ones kept between them stop the heap from shrinking at its top, so
    the freed ones are holes."""
    out: dict[str, object] = {"mapped": map_large_host_blocks() if dist.get_rank() == 0 else None}
    gradient = torch.ones(4 << 20, dtype=torch.uint8)
    del gradient
    for size in SIZES:
        blocks = [torch.ones(size, dtype=torch.uint8) for _ in range(2 * total // size)]
        held = _rss()
        del blocks[::2]
        freed = held - _rss()
        trim_host_heap()
        out[str(size)] = (freed, held - _rss())
        del blocks
    return out
