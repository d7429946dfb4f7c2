"""The disk tier's read-ahead window ([Note: read-ahead window]): read-aheads stop where the
window is full and resume as chunks are used, the disk reads prove it, host payloads and pages
read ahead never add up to more than the host budget, and a window larger than the host budget
is a one-line ConfigError."""

import pytest
import torch

from colossal_chunk import UNLIMITED, ChunkConfig, ChunkManager
from colossal_contracts import ConfigError, TierName

N = 1024  # elements per chunk: one fp32 shard is 4 KiB
SHARD = N * 4


def _manager(tmp_path, **kw) -> tuple[ChunkManager, dict[str, torch.Tensor]]:
    cfg = ChunkConfig(N, accelerator_bytes=16 * SHARD, disk_dir=tmp_path / "d", device="cpu", **kw)
    params = [(f"p{i}", torch.nn.Parameter(torch.randn(N))) for i in range(8)]
    mgr = ChunkManager(cfg)
    mgr.register(params)
    return mgr, {n: p.detach().clone() for n, p in params}


def _host_payloads(mgr: ChunkManager) -> int:
    return sum(c.shard_bytes for c in mgr.chunks.values() if c.tier is TierName.HOST)


def test_read_ahead_stops_at_the_window_and_slides_as_chunks_are_used(tmp_path):
    mgr, values = _manager(tmp_path, host_bytes=4 * SHARD, read_ahead_bytes=2 * SHARD)
    host, window = mgr.books.tiers[TierName.HOST], mgr.shard_io.read_ahead_window
    assert _host_payloads(mgr) == 2 * SHARD  # the window's two shards are not for payloads
    assert host.used_bytes == 4 * SHARD
    on_disk = [c for c in mgr.chunks.values() if c.tier is TierName.DISK]
    assert len(on_disk) == 6
    store = mgr.books.tiers[TierName.DISK].store
    assert not mgr.shard_io.read_ahead(on_disk)  # room for two of six
    assert window.ahead_bytes == 2 * SHARD
    store.drain()
    assert store.io_stats().bytes_read == 2 * SHARD  # the refused four were not read
    first = next(iter(on_disk[0].records))
    mgr.access([first])  # moved to the compute tier: its disk pages leave the window
    assert torch.equal(mgr.chunk_of(first).view(first), values[first])
    mgr.release([first])
    assert window.ahead_bytes == SHARD
    assert not mgr.shard_io.read_ahead(on_disk[1:])  # the one already read, and one more
    mgr.shard_io.written([on_disk[1]])  # written behind: unmapped, out of the window
    assert window.ahead_bytes == SHARD
    assert mgr.shard_io.read_ahead(on_disk[3:4])
    store.drain()
    assert store.io_stats().bytes_read == 4 * SHARD
    assert window.peak_bytes == 2 * SHARD
    for c in on_disk[1:]:  # every value reads back, read ahead or not
        for n in c.records:
            mgr.access([n])
            assert torch.equal(c.view(n), values[n])
            mgr.release([n])
            assert _host_payloads(mgr) + window.ahead_bytes <= host.capacity_bytes
    mgr.close()


def test_default_window_is_taken_from_the_host_budget(tmp_path):
    mgr, _ = _manager(tmp_path, host_bytes=16 * SHARD)  # four shards, a quarter of the budget
    assert mgr.shard_io.read_ahead_window.window_bytes == 4 * SHARD
    assert mgr.books.tiers[TierName.HOST].used_bytes == 12 * SHARD  # all eight payloads, the window
    # the window holds no payload: a tracer's model data (live - model = non-model) leaves it out
    assert mgr.books.model_data_bytes(TierName.HOST) == _host_payloads(mgr) == 8 * SHARD
    mgr.close()
    mgr, _ = _manager(tmp_path, host_bytes=3 * SHARD)  # a quarter holds no shard: no window
    assert mgr.shard_io.read_ahead_window.window_bytes == 0
    assert not mgr.shard_io.read_ahead([c for c in mgr.chunks.values() if c.tier is TierName.DISK])
    mgr.close()
    mgr, _ = _manager(tmp_path, host_bytes=None)  # no host budget: nothing is bounded
    assert mgr.shard_io.read_ahead_window.window_bytes == UNLIMITED
    mgr.close()


def test_window_larger_than_the_host_budget_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"read_ahead_bytes=.* is larger than the host budget"):
        _manager(tmp_path, host_bytes=2 * SHARD, read_ahead_bytes=3 * SHARD)
    with pytest.raises(ConfigError, match="read_ahead_bytes must be >= 0"):
        ChunkConfig(N, read_ahead_bytes=-1)
