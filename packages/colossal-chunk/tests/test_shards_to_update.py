"""An owner's in-place update walked by ``ShardIO.shards_to_update`` ([Note: shards to update]):
with a disk tier each item's shards are read ahead (this one and the next ones, soonest first),
updated on host copies in its turn and written out after; on the compute tier what the update
brings there is held while it runs and let go after; an item updated without its turn's block
(the fast case) never has its plan asked for."""

import torch

from colossal_chunk import ChunkConfig, ChunkManager, ShardUpdate
from colossal_chunk._shard_io import ShardIO
from colossal_contracts import TierName

ACC, DISK = TierName.ACCELERATOR, TierName.DISK
N = 1024  # elements per chunk: one fp32 shard is 4 KiB


def _manager(tmp_path, **kw) -> ChunkManager:  # type: ignore[no-untyped-def]
    cfg = ChunkConfig(N, accelerator_bytes=16 * N * 4, device="cpu", **kw)
    torch.manual_seed(0)
    mgr = ChunkManager(cfg)
    mgr.register([(f"p{i}", torch.nn.Parameter(torch.randn(N))) for i in range(4)])
    mgr.add_parallel("state", torch.float32, copy_params=True)
    mgr.add_parallel("grad", torch.float32, copy_params=True)
    return mgr


def test_disk_shards_are_read_ahead_staged_and_written_back(tmp_path, monkeypatch):
    mgr = _manager(tmp_path, host_bytes=2 * N * 4, disk_dir=tmp_path / "d")
    groups = list(mgr.groups.values())
    assert any(g.twin("state").tier is DISK for g in groups)
    want = {g.chunk_id: g.twin("state").shard.clone() + g.twin("grad").shard for g in groups}
    asked: list[int] = []
    ahead: list[list[int]] = []
    said: list[tuple[str, list[int]]] = []  # what was said after each turn
    read_ahead, written, read_done = ShardIO.read_ahead, ShardIO.written, ShardIO.read_done
    monkeypatch.setattr(
        ShardIO,
        "read_ahead",
        lambda self, cs: ahead.append([c.chunk_id for c in cs]) or read_ahead(self, cs),
    )
    for name, fn in (("written", written), ("read_done", read_done)):
        monkeypatch.setattr(
            ShardIO,
            name,
            lambda self, cs, name=name, fn=fn: (
                said.append((name, [c.chunk_id for c in cs])) or fn(self, cs)
            ),
        )

    def plan(g):  # type: ignore[no-untyped-def]
        asked.append(g.chunk_id)
        state = g.twin("state")
        return ShardUpdate((state,), (g.twin("grad"),), staged=(state,))

    for k, (g, turn) in enumerate(mgr.shard_io.shards_to_update(groups, plan)):
        state = g.twin("state")
        mapping = state.shard
        assert len(said) == 2 * k  # the turns before this one are let go, this one not yet
        with turn.running():
            if state.tier is DISK:
                assert state.shard is not mapping  # a host copy, written back at the end
            state.shard.add_(g.twin("grad").shard)
        assert state.shard is mapping
    assert said == [  # after each turn: its gradients let go, its state written out
        (name, [g.twin(kind).chunk_id])
        for g in groups
        for name, kind in (("read_done", "grad"), ("written", "state"))
    ]
    assert sorted(asked) == [g.chunk_id for g in groups]  # each plan asked once
    first = groups[0]  # the first turn reads ahead its own update set, then the next ones'
    assert ahead[0] == [first.twin("state").chunk_id, first.twin("grad").chunk_id]
    for g in groups:
        assert torch.equal(g.twin("state").shard, want[g.chunk_id])
    mgr.close()


def test_what_an_update_brings_to_the_compute_tier_is_held_only_while_it_runs(tmp_path):
    mgr = _manager(tmp_path, host_bytes=None, disk_bytes=0)
    groups = list(mgr.groups.values())
    for g in groups:
        mgr.move(g.twin("state"), ACC)
        mgr.books.keep_on_compute([g.twin("state")])
    asked: list[int] = []

    def plan(g):  # type: ignore[no-untyped-def]
        asked.append(g.chunk_id)
        state, grad = g.twin("state"), g.twin("grad")
        return ShardUpdate((state,), (grad,), home=state, bring=(g.param, grad), hold=(grad,))

    for g, turn in mgr.shard_io.shards_to_update(groups, plan):
        if g is groups[0]:  # the fast case: updated without its turn's block
            continue
        grad = g.twin("grad")
        assert grad.tier is not ACC
        with turn.running():
            assert grad.tier is ACC and grad.kept  # held: bringing param cannot evict it
            assert g.param.tier is ACC and not g.param.kept  # brought, not held
            assert g.twin("state").kept
        assert not grad.kept and g.twin("state").kept  # let go; the state stays kept
    assert asked == [g.chunk_id for g in groups[1:]]  # no disk: asked only for a turn's block
    mgr.close()
