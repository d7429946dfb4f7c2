"""Payloads put on disk whole ([Note: payloads put]): written into their slot with pwrite, bit for
bit, over the slot's old blocks (a freed slot is punched out only for a payload that must read as
zeros: [Note: disk payload layout]); written out a piece at a time, nothing of it is left in the
page cache."""

import ctypes
import mmap
import os
import sys

import pytest
import torch

from colossal_chunk import ChunkConfig, ChunkManager
from colossal_chunk.disk._side import payload_key
from colossal_chunk.disk._store import DiskStore
from colossal_contracts import TierName

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux mincore")


def _cached_pages(store: DiskStore, path, nbytes: int) -> int:  # type: ignore[no-untyped-def]
    """Pages of the first ``nbytes`` of ``path`` in the page cache (``mincore`` over a fresh
    mapping, which maps nothing in by itself)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        mm = mmap.mmap(fd, nbytes, access=mmap.ACCESS_COPY)  # private: never written
        vec = ctypes.create_string_buffer(-(-nbytes // mmap.PAGESIZE))
        addr = ctypes.addressof(ctypes.c_char.from_buffer(mm))  # needs a writable mapping
        assert store._libc.held_mincore(addr, nbytes, vec) == 0
        mm.close()
        return sum(b & 1 for b in vec.raw)
    finally:
        os.close(fd)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_put_payload_holds_the_values_bit_for_bit(tmp_path, dtype):
    store = DiskStore(tmp_path)
    src = torch.randn(300_001).to(dtype)  # not a whole number of pages
    t = store.put("param-0@disk", src)
    assert t.dtype == dtype and torch.equal(t, src)
    store.write_behind("param-0@disk", t)
    store.drain()
    raw = (tmp_path / "param.bin").read_bytes()
    nbytes = src.numel() * src.element_size()
    on_disk = torch.frombuffer(bytearray(raw[:nbytes]), dtype=dtype)
    assert torch.equal(on_disk, src) and torch.equal(t, src)  # read back through the mapping
    assert len(raw) == -(-nbytes // mmap.PAGESIZE) * mmap.PAGESIZE
    assert not any(raw[nbytes:])  # the slot's tail is zeros
    assert store.io_stats().bytes_written == src.numel() * src.element_size()
    store.close()


@linux
def test_a_freed_slot_keeps_its_blocks_until_a_payload_needs_zeros(tmp_path):
    store = DiskStore(tmp_path)
    numel = 1 << 18  # 1 MiB of fp32
    path = tmp_path / "grad.bin"
    t = store.put("grad-0@disk", torch.full((numel,), 3.0))
    store.write_behind("grad-0@disk", t)
    store.drain()
    del t
    store.discard("grad-0@disk")
    blocks = os.stat(path).st_blocks
    assert blocks * 512 >= numel * 4  # not punched out when freed
    t = store.put("grad-0@disk", torch.full((numel,), 4.0))  # its slot back, overwritten
    assert os.stat(path).st_size == numel * 4 and torch.equal(t, torch.full((numel,), 4.0))
    store.write_behind("grad-0@disk", t)
    store.drain()
    del t
    store.discard("grad-0@disk")
    z = store.allocate("grad-1@disk", numel, torch.float32)  # the same slot, as zeros
    assert os.stat(path).st_size == numel * 4 and z.eq(0.0).all()
    store.close()


@linux
def test_payloads_put_then_written_out_leave_nothing_in_the_page_cache(tmp_path):
    store = DiskStore(tmp_path)
    numel = 1 << 20  # 4 MiB of fp32 per payload: four write pieces each
    srcs = [torch.randn(numel) for _ in range(3)]
    ts = [store.put(f"exp_avg-{i}@disk", s) for i, s in enumerate(srcs)]
    path = tmp_path / "exp_avg.bin"
    assert (
        _cached_pages(store, path, 3 * numel * 4) == 3 * numel * 4 // mmap.PAGESIZE
    )  # put: cached
    for i, t in enumerate(ts):
        store.write_behind(f"exp_avg-{i}@disk", t)
    store.drain()
    assert _cached_pages(store, path, 3 * numel * 4) == 0  # every piece written out, then dropped
    back = torch.from_file(str(path), size=3 * numel)
    assert torch.equal(back, torch.cat(srcs))
    store.close()


def test_a_chunk_moved_to_disk_is_put_and_reads_back(tmp_path, monkeypatch):
    puts: list[str] = []
    put = DiskStore.put
    monkeypatch.setattr(DiskStore, "put", lambda self, k, src: puts.append(k) or put(self, k, src))
    cfg = ChunkConfig(
        1024, accelerator_bytes=8 * 4096, host_bytes=4096, disk_dir=tmp_path / "d", device="cpu"
    )
    torch.manual_seed(0)
    params = [(f"p{i}", torch.nn.Parameter(torch.randn(1024))) for i in range(4)]
    with ChunkManager(cfg) as mgr:
        mgr.register(params)
        chunk = next(c for c in mgr.chunks.values() if c.tier is TierName.DISK)
        mgr.move(chunk, TierName.ACCELERATOR)
        chunk.shard.mul_(-2.0)  # written where it is computed on
        want = chunk.shard.clone()
        mgr.move(chunk, TierName.DISK)
        assert puts == [payload_key(chunk, TierName.DISK)]
        mgr.books.tiers[TierName.DISK].store.drain()  # type: ignore[union-attr]
        assert torch.equal(chunk.shard, want)  # read back from the file
