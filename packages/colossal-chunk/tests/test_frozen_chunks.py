"""[Note: frozen chunks] and [Note: host copies]: parameters registered as frozen live in chunks of
their own, with no parallel chunk; such a chunk leaves the compute tier by taking back the payload
it left on the host or on disk, so nothing is written into it, and a write in place is counted."""

import torch

from colossal_chunk import ChunkConfig, ChunkManager
from colossal_contracts import TierName

N = 1024  # elements per chunk: one fp32 shard is 4 KiB
SHARD = N * 4
ACC, HOST, DISK = TierName.ACCELERATOR, TierName.HOST, TierName.DISK


def _params() -> list[tuple[str, torch.nn.Parameter]]:
    torch.manual_seed(0)
    # alternate trainable and frozen tensors of half a chunk: packed together they would share
    return [
        (f"p{i}", torch.nn.Parameter(torch.randn(N // 2), requires_grad=i % 2 == 0))
        for i in range(8)
    ]


def _manager(tmp_path, *, host_shards: int | None = None) -> ChunkManager:
    cfg = ChunkConfig(
        N,
        accelerator_bytes=16 * SHARD,
        host_bytes=None if host_shards is None else host_shards * SHARD,
        read_ahead_bytes=0,
        disk_bytes=None if host_shards is not None else 0,
        disk_dir=tmp_path / "d",
        device="cpu",
    )
    mgr = ChunkManager(cfg)
    named = _params()
    mgr.register(named, frozen=[n for n, p in named if not p.requires_grad])
    return mgr


def test_frozen_parameters_get_chunks_of_their_own_and_no_twins(tmp_path):
    mgr = _manager(tmp_path)
    frozen = [c for c in mgr.registry.param_chunks() if c.frozen]
    trained = mgr.registry.trainable_chunks()
    assert len(frozen) == 2 and len(trained) == 2
    assert all(not mgr.registry.views.params[n].requires_grad for c in frozen for n in c.records)
    assert all(mgr.registry.views.params[n].requires_grad for c in trained for n in c.records)
    masters = mgr.add_parallel("master", torch.float32, copy_params=True)
    mgr.add_parallel("grad", torch.float32)
    assert {m.chunk_id for m in masters} == {
        mgr.registry.parallel_chunk("master", c).chunk_id for c in trained
    }
    assert mgr.books.payload_bytes() == {
        "frozen": 2 * SHARD,
        "param": 2 * SHARD,
        "master": 2 * SHARD,
        "grad": 2 * SHARD,
    }
    # a re-pack keeps them apart
    new = mgr.repack([f"p{i}" for i in reversed(range(8))])
    assert sum(c.frozen for c in new) == 2 and len(mgr.registry.trainable_chunks()) == 2
    for c in new:
        assert all(mgr.registry.views.params[n].requires_grad != c.frozen for n in c.records)


def test_a_frozen_chunk_leaves_the_compute_tier_without_a_copy(tmp_path):
    mgr = _manager(tmp_path)
    host = mgr.books.tiers[HOST]
    f = next(c for c in mgr.registry.param_chunks() if c.frozen)
    t = mgr.registry.trainable_chunks()[0]
    before = f.shard.clone()
    used = host.used_bytes
    mgr.move(f, ACC)
    mgr.move(t, ACC)
    assert host.used_bytes == used - SHARD  # the frozen chunk's host payload stays, counted
    mgr.access([next(iter(f.records))])
    mgr.release([next(iter(f.records))])
    mgr.move(f, HOST)
    mgr.move(t, HOST)
    stats = mgr.books.stats()
    assert stats.moved("accelerator", "host").num_bytes == SHARD  # only the trainable chunk
    assert stats.host_unwritten_bytes == SHARD and stats.frozen_written_bytes == 0
    assert f.tier is HOST and torch.equal(f.shard, before) and host.used_bytes == used
    p = mgr.registry.views.params[next(iter(f.records))]
    assert p.data.data_ptr() == f.shard.data_ptr()  # the views follow the payload
    mgr.shard_io.written([f])  # a write in place (a checkpoint loaded) is counted
    assert mgr.books.stats().frozen_written_bytes == SHARD


def test_frozen_chunks_on_disk_are_read_and_never_written(tmp_path):
    mgr = _manager(tmp_path, host_shards=1)  # one payload on the host, the rest on disk
    store = mgr.books.tiers[DISK].store
    store.drain()
    base = mgr.books.stats().disk_io.bytes_written
    frozen = [c for c in mgr.registry.param_chunks() if c.frozen and c.tier is DISK]
    assert frozen
    values = [c.shard.clone() for c in frozen]
    for _ in range(3):  # computed on, evicted, again: the disk payload is taken back each time
        for c in frozen:
            name = next(iter(c.records))
            mgr.access([name])
            mgr.release([name])
            mgr._placement.offload(c)
            assert c.tier is DISK
    mgr.shard_io.keep_disk_copies()  # the owner's window ends: frozen chunks' copies stay
    mgr.move(frozen[0], ACC)
    mgr._placement.offload(frozen[0])
    store.drain()
    stats = mgr.books.stats()
    assert stats.disk_io.bytes_written == base and stats.frozen_written_bytes == 0
    assert stats.disk_unwritten_bytes == (3 * len(frozen) + 1) * SHARD  # each trip back
    for c, v in zip(frozen, values, strict=True):
        assert torch.equal(c.shard, v)
