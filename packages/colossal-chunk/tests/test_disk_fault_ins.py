"""[Note: disk fault-ins]: a disk payload used without a read-ahead since it was last written
(copied off the disk, or used in place) is counted in ``ManagerStats.disk_faulted_bytes``; one
read ahead is counted once, by its read, in ``disk_io.bytes_read``."""

import torch

from colossal_chunk import ChunkConfig, ChunkManager
from colossal_contracts import TierName

N = 1024  # elements per chunk: one fp32 shard is 4 KiB
SHARD = N * 4
DISK = TierName.DISK


def _manager(tmp_path, read_ahead_bytes: int) -> ChunkManager:
    cfg = ChunkConfig(
        N,
        accelerator_bytes=16 * SHARD,
        host_bytes=2 * SHARD + read_ahead_bytes,  # two payloads on the host, the rest on disk
        read_ahead_bytes=read_ahead_bytes,
        disk_dir=tmp_path / "d",
        device="cpu",
    )
    mgr = ChunkManager(cfg)
    mgr.register([(f"p{i}", torch.nn.Parameter(torch.randn(N))) for i in range(6)])
    return mgr


def _faulted_and_read(mgr: ChunkManager) -> tuple[int, int]:
    mgr.books.tiers[DISK].store.drain()  # type: ignore[union-attr]
    stats = mgr.books.stats()
    return stats.disk_faulted_bytes, stats.disk_io.bytes_read  # type: ignore[return-value,union-attr]


def test_without_a_read_ahead_window_every_use_is_a_fault_in(tmp_path):
    mgr = _manager(tmp_path, read_ahead_bytes=0)
    on_disk = [c for c in mgr.chunks.values() if c.tier is DISK]
    assert len(on_disk) == 4 and _faulted_and_read(mgr) == (0, 0)  # filling them read nothing
    assert not mgr.shard_io.read_ahead(on_disk)  # no window: nothing is read ahead
    mgr.shard_io.written(on_disk[:2])  # updated in place (an optimizer step): both read on use
    assert _faulted_and_read(mgr) == (2 * SHARD, 0)
    mgr.shard_io.written(on_disk[:1])  # written behind since: its pages are faulted in again
    assert _faulted_and_read(mgr) == (3 * SHARD, 0)
    first = next(iter(on_disk[2].records))
    mgr.access([first])  # copied to the compute tier
    mgr.release([first])
    assert _faulted_and_read(mgr) == (4 * SHARD, 0)
    mgr.move(on_disk[2], DISK)  # back to disk: written, nothing read from it
    assert _faulted_and_read(mgr) == (4 * SHARD, 0)
    pl = mgr._placement  # a prefetch copies off the disk on the prefetcher's thread
    assert pl.prefetch(on_disk[3], moment=0, target_use=0.0, chunks=mgr.chunks.values())
    pl.settle(on_disk[3])
    assert on_disk[3].tier is TierName.ACCELERATOR
    assert _faulted_and_read(mgr) == (5 * SHARD, 0)
    mgr.close()


def test_a_use_after_a_read_ahead_is_no_fault_in(tmp_path):
    mgr = _manager(tmp_path, read_ahead_bytes=4 * SHARD)
    on_disk = [c for c in mgr.chunks.values() if c.tier is DISK]
    assert len(on_disk) == 4
    assert mgr.shard_io.read_ahead(on_disk[:3])
    # the reads are done before the uses (a use that beats its read-ahead faults the pages in)
    assert _faulted_and_read(mgr) == (0, 3 * SHARD)
    mgr.shard_io.written(on_disk[:1])  # in place, read ahead
    first = next(iter(on_disk[1].records))
    mgr.access([first])  # copied, read ahead
    mgr.release([first])
    assert _faulted_and_read(mgr) == (0, 3 * SHARD)
    mgr.shard_io.written(on_disk[:1])  # written behind since its read-ahead: faulted in again
    mgr.shard_io.written(on_disk[3:])  # never read ahead
    assert _faulted_and_read(mgr) == (2 * SHARD, 3 * SHARD)
    assert mgr.shard_io.read_ahead(on_disk[:1])  # read ahead again: its next use is no fault-in
    assert _faulted_and_read(mgr) == (2 * SHARD, 4 * SHARD)
    mgr.shard_io.written(on_disk[:1])
    assert _faulted_and_read(mgr) == (2 * SHARD, 4 * SHARD)
    mgr.close()


def test_no_disk_tier_no_figure(tmp_path):
    mgr = ChunkManager(ChunkConfig(N, disk_bytes=0, device="cpu"))
    mgr.register([("p", torch.nn.Parameter(torch.randn(N)))])
    assert mgr.books.stats().disk_faulted_bytes is None and mgr.books.stats().disk_io is None
    mgr.close()
