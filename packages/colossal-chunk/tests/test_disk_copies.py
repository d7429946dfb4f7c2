"""[Note: disk copies]: while the owner says chunks of a kind are not written, one copied off disk
keeps its disk payload (still counted on the disk tier) and goes back to disk by mapping it
again: nothing is written, the values are the chunk's. The copy is dropped when the window
ends, when the chunk is written in place, and when the disk tier needs the room."""

import torch

from colossal_chunk import ChunkConfig, ChunkManager
from colossal_contracts import TierName

N = 1024  # elements per chunk: one fp32 shard is 4 KiB
SHARD = N * 4
ACC, HOST, DISK = TierName.ACCELERATOR, TierName.HOST, TierName.DISK


def PARAMS(n: int) -> list[tuple[str, torch.nn.Parameter]]:
    torch.manual_seed(0)
    return [(f"p{i}", torch.nn.Parameter(torch.randn(N))) for i in range(n)]


def _manager(tmp_path, disk_shards: int | None = None) -> ChunkManager:
    cfg = ChunkConfig(
        N,
        accelerator_bytes=16 * SHARD,
        host_bytes=2 * SHARD,  # two payloads on the host, the rest on disk
        read_ahead_bytes=0,
        disk_bytes=None if disk_shards is None else disk_shards * SHARD,
        disk_dir=tmp_path / "d",
        device="cpu",
    )
    mgr = ChunkManager(cfg)
    mgr.register(PARAMS(6))
    return mgr


def _written(mgr: ChunkManager) -> int:
    mgr.books.tiers[DISK].store.drain()  # type: ignore[union-attr]
    return mgr.books.stats().disk_io.bytes_written  # type: ignore[union-attr]


def _round_trip(mgr: ChunkManager, chunk) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """Move ``chunk`` off disk to the compute tier and back; its values as they were."""
    mgr.move(chunk, ACC)
    values = chunk.shard.clone()
    mgr.move(chunk, DISK)
    return values


def test_a_kept_payload_goes_back_to_disk_without_a_write(tmp_path):
    mgr = _manager(tmp_path)
    disk = mgr.books.tiers[DISK]
    c = next(c for c in mgr.chunks.values() if c.tier is DISK)
    before = c.shard.clone()
    base = _written(mgr)
    used = disk.used_bytes
    mgr.shard_io.keep_disk_copies(["param"])
    mgr.move(c, ACC)
    assert disk.used_bytes == used  # the payload stays, counted
    mgr.move(c, DISK)
    assert _written(mgr) == base  # nothing written
    assert mgr.books.stats().disk_unwritten_bytes == SHARD
    assert c.tier is DISK and torch.equal(c.shard, before)
    p = mgr.registry.views.params[next(iter(c.records))]
    assert p.data.data_ptr() == c.shard.data_ptr()  # the views follow the mapping
    # the window over: nothing kept; a chunk copied off disk now frees its payload there
    mgr.shard_io.keep_disk_copies()
    mgr.move(c, ACC)
    assert disk.used_bytes == used - SHARD
    mgr.move(c, DISK)
    assert _written(mgr) == base + SHARD and torch.equal(c.shard, before)


def test_other_kinds_and_written_chunks_are_written_again(tmp_path):
    mgr = _manager(tmp_path)
    on_disk = [c for c in mgr.chunks.values() if c.tier is DISK]
    base = _written(mgr)
    mgr.shard_io.keep_disk_copies(["grad"])  # not the kind of these chunks
    _round_trip(mgr, on_disk[0])
    assert _written(mgr) == base + SHARD
    mgr.shard_io.keep_disk_copies(["param"])
    c = on_disk[1]
    mgr.move(c, ACC)
    c.shard.add_(1.0)  # an update in place, said so: the disk copy is stale
    mgr.shard_io.written([c])
    after = c.shard.clone()
    mgr.move(c, DISK)
    assert _written(mgr) == base + 2 * SHARD and torch.equal(c.shard, after)
    assert mgr.books.stats().disk_unwritten_bytes == 0


def test_kept_payloads_make_way_when_the_disk_is_full(tmp_path):
    mgr = _manager(tmp_path, disk_shards=4)  # exactly the four chunks off the host
    disk = mgr.books.tiers[DISK]
    on_disk = [c for c in mgr.chunks.values() if c.tier is DISK]
    host = [c for c in mgr.chunks.values() if c.tier is HOST]
    assert len(on_disk) == 4 and disk.free_bytes == 0
    mgr.shard_io.keep_disk_copies(["param"])
    mgr.move(on_disk[0], ACC)  # its payload stays: the disk is still full
    assert disk.free_bytes == 0
    values = host[0].shard.clone()
    mgr.move(host[0], DISK)  # needs the room: the kept payload is dropped for it
    assert torch.equal(host[0].shard, values) and disk.free_bytes == 0
    moved = on_disk[0].shard.clone()
    base = _written(mgr)
    mgr.move(on_disk[0], HOST)  # its disk copy is gone: the move frees nothing there
    assert disk.free_bytes == 0 and torch.equal(on_disk[0].shard, moved)
    mgr.shard_io.keep_disk_copies()
    assert disk.used_bytes == 4 * SHARD and mgr.books.stats().disk_unwritten_bytes == 0
    assert _written(mgr) == base
