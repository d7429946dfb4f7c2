"""[Note: dead shards]: a chunk whose values its owner consumed moves without a copy and goes
to disk without a write or a read-ahead, until a tensor of it is used again or it is said to be
written; then it moves and is written as any chunk."""

import torch
from test_disk_copies import ACC, DISK, SHARD, _manager, _written

from colossal_contracts import TensorState


def test_a_dead_chunk_goes_to_disk_unwritten_and_comes_back_uncopied(tmp_path):
    mgr = _manager(tmp_path)
    c = next(c for c in mgr.chunks.values() if c.tier is DISK)
    mgr.move(c, ACC)
    base, faulted = _written(mgr), mgr.books.stats().disk_faulted_bytes
    mgr.shard_io.dead([c])
    mgr.move(c, DISK)
    assert c.tier is DISK and _written(mgr) == base  # a slot, nothing written
    assert mgr.shard_io.read_ahead([c])  # nothing to read: no read-ahead issued
    mgr.books.tiers[DISK].store.drain()  # type: ignore[union-attr]
    assert mgr.books.stats().disk_io.bytes_read == 0  # type: ignore[union-attr]
    mgr.access([c], discard=True)  # the owner overwrites every slot next
    assert mgr.books.stats().disk_faulted_bytes == faulted  # brought in uncopied
    assert not c.dead  # in use: live again
    used = c.used - c.rank * c.shard_numel
    assert torch.count_nonzero(c.shard[used:]) == 0  # padding zero
    c.shard.fill_(3.0)
    mgr.release([c], state=TensorState.HOLD)
    mgr.move(c, DISK)  # live: written, and its values kept
    assert _written(mgr) == base + SHARD
    mgr.move(c, ACC)
    assert torch.all(c.shard[:used] == 3.0)


def test_a_chunk_said_written_is_live_again(tmp_path):
    mgr = _manager(tmp_path)
    c = next(c for c in mgr.chunks.values() if c.tier is DISK)
    mgr.move(c, ACC)
    mgr.shard_io.dead([c])
    c.shard.fill_(2.0)  # written outside the access protocol (an optimizer's update)
    mgr.shard_io.written([c])
    base = _written(mgr)
    mgr.move(c, DISK)
    assert _written(mgr) == base + SHARD
    mgr.move(c, ACC)
    assert torch.all(c.shard[: c.used] == 2.0)
