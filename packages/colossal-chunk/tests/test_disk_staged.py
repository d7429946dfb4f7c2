"""Shards on disk updated on host copies ([Note: staged updates]): inside ``staged`` a disk
chunk's shard is a host copy, not its payload's mapping; the result is written back into the
payload when the block ends (dropped if it raises); chunks elsewhere are left as they are."""

import pytest
import torch

from colossal_chunk import ChunkConfig, ChunkManager
from colossal_chunk.disk._side import payload_key
from colossal_chunk.disk._store import DiskStore
from colossal_contracts import TierName


def _manager(tmp_path) -> ChunkManager:  # type: ignore[no-untyped-def]
    cfg = ChunkConfig(
        1024, accelerator_bytes=8 * 4096, host_bytes=4096, disk_dir=tmp_path / "d", device="cpu"
    )
    torch.manual_seed(0)
    mgr = ChunkManager(cfg)
    mgr.register([(f"p{i}", torch.nn.Parameter(torch.randn(1024))) for i in range(4)])
    return mgr


def _on_file(mgr: ChunkManager, chunk) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """The chunk's payload as the file holds it (read with pread, not through a mapping)."""
    store = mgr.books.tiers[TierName.DISK].store
    assert isinstance(store, DiskStore)
    store.drain()
    p = store._files[payload_key(chunk, TierName.DISK)]
    import os

    raw = os.pread(p.fd, p.nbytes, p.offset)
    return torch.frombuffer(bytearray(raw), dtype=chunk.dtype)


def test_a_staged_update_is_computed_on_a_host_copy_and_written_back(tmp_path, monkeypatch):
    unstaged: list[str] = []
    unstage = DiskStore.unstage
    monkeypatch.setattr(
        DiskStore, "unstage", lambda self, k, src: unstaged.append(k) or unstage(self, k, src)
    )
    with _manager(tmp_path) as mgr:
        disk = [c for c in mgr.chunks.values() if c.tier is TierName.DISK]
        elsewhere = [c for c in mgr.chunks.values() if c.tier is not TierName.DISK]
        assert disk and elsewhere
        chunk, other = disk[0], elsewhere[0]
        mapping, other_shard = chunk.shard, other.shard
        want = chunk.shard.clone() * -2.0
        with mgr.shard_io.staged([chunk, other]):
            assert chunk.shard is not mapping  # a host copy: the mapping is not written through
            assert torch.equal(chunk.shard, want / -2.0)
            assert other.shard is other_shard  # not on disk: left as it is
            chunk.shard.mul_(-2.0)
            assert torch.equal(_on_file(mgr, chunk), want / -2.0)  # nothing written yet
        assert chunk.shard is mapping and unstaged == [payload_key(chunk, TierName.DISK)]
        mgr.shard_io.written([chunk])  # written out in the background, as after an update in place
        assert torch.equal(_on_file(mgr, chunk), want)  # in the file
        assert torch.equal(chunk.shard, want)  # and through the mapping


def test_a_staged_block_that_raises_leaves_the_payload_unchanged(tmp_path):
    with _manager(tmp_path) as mgr:
        chunk = next(c for c in mgr.chunks.values() if c.tier is TierName.DISK)
        mapping, before = chunk.shard, chunk.shard.clone()
        store = mgr.books.tiers[TierName.DISK].store
        assert isinstance(store, DiskStore)
        store.drain()
        written = store.io_stats().bytes_written  # by the moves that placed the chunks
        with pytest.raises(RuntimeError, match="update failed"), mgr.shard_io.staged([chunk]):
            chunk.shard.fill_(7.0)
            raise RuntimeError("update failed")
        assert chunk.shard is mapping and torch.equal(chunk.shard, before)
        assert torch.equal(_on_file(mgr, chunk), before)
        assert store.io_stats().bytes_written == written
        assert store._io.in_flight[1].open == 0  # nothing was put in flight


def test_unstage_refuses_a_copy_of_another_size(tmp_path):
    store = DiskStore(tmp_path)
    t = store.put("x-0@disk", torch.zeros(256))
    store.write_behind("x-0@disk", t)
    with pytest.raises(ValueError, match="a copy of 512 bytes for a payload of 1024"):
        store.unstage("x-0@disk", torch.zeros(128))
    store.close()
