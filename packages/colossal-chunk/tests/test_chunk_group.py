"""One record per chunk ([Note: one record per chunk]): the lifecycle's table of legal moves,
residency on the chunk, the manager's groups and twins, and hooks given at construction."""

import sys
from pathlib import Path

import pytest
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
import _checks_chunk_group as checks

from colossal_chunk import (
    AutoPolicy,
    Chunk,
    ChunkConfig,
    ChunkKind,
    ChunkManager,
    GradPhase,
    Lifecycle,
)
from colossal_chunk._hooks import NoHooks
from colossal_contracts import ConfigError, StateTransitionError, TierName

ACC, HOST = TierName.ACCELERATOR, TierName.HOST
NUMEL = 256


@pytest.mark.parametrize(
    ("old", "new", "legal"),
    [
        (Lifecycle.SHARDED, Lifecycle.GATHERING, True),
        (Lifecycle.SHARDED, Lifecycle.GATHERED, True),
        (Lifecycle.SHARDED, Lifecycle.REDUCING, False),  # nothing gathered to reduce
        (Lifecycle.GATHERING, Lifecycle.GATHERED, True),
        (Lifecycle.GATHERING, Lifecycle.SHARDED, False),  # a gather must finish first
        (Lifecycle.GATHERED, Lifecycle.REDUCING, True),
        (Lifecycle.GATHERED, Lifecycle.GATHERING, False),
        (Lifecycle.REDUCING, Lifecycle.SHARDED, True),
        (Lifecycle.REDUCING, Lifecycle.GATHERED, False),  # the buffer goes with the reduce
    ],
)
def test_the_lifecycle_allows_only_its_table(old, new, legal):
    if legal:
        assert old.to(new, 7) is new
    else:
        with pytest.raises(StateTransitionError, match=f"chunk 7.*{old.name} -> {new.name}"):
            old.to(new, 7)
    assert new.in_flight is (new in (Lifecycle.GATHERING, Lifecycle.REDUCING))


def test_an_illegal_move_of_a_chunk_raises_and_changes_nothing():
    c = Chunk(0, 8, torch.float32)
    c.add("w", (8,))
    c.fill_shard(torch.empty(8), {"w": torch.ones(8)})
    assert c.lifecycle is Lifecycle.GATHERED  # one rank: the shard is the gathered buffer
    with pytest.raises(StateTransitionError):
        c._move(Lifecycle.GATHERING)
    assert c.lifecycle is Lifecycle.GATHERED and not c.in_flight


def _manager(acc: int | None = None) -> tuple[ChunkManager, list[nn.Parameter]]:
    params = [nn.Parameter(torch.full((NUMEL,), float(i))) for i in range(3)]
    cfg = ChunkConfig(NUMEL, accelerator_bytes=acc, device="cpu", disk_bytes=0)
    m = ChunkManager(cfg, policy=AutoPolicy())
    m.register([(f"p{i}", p) for i, p in enumerate(params)], frozen=["p2"])
    return m, params


def test_each_parameter_chunk_has_one_group_with_its_twins():
    m, _ = _manager()
    masters = m.add_parallel(ChunkKind.MASTER, torch.float64, copy_params=True)
    m.add_parallel("state", torch.float32)
    assert m.registry.twin_kinds == ("master", "state")
    assert sorted(m.groups) == [c.chunk_id for c in m.registry.param_chunks()]
    for c, master in zip(m.registry.trainable_chunks(), masters, strict=True):
        group = m.registry.group_of(c)
        assert group.param is c and group.twin("master") is master
        assert m.registry.parallel_chunk(ChunkKind.MASTER, c) is master
        assert group.grads is GradPhase.EMPTY and not group.holds_gradients
    frozen = m.chunk_of("p2")
    assert m.registry.group_of(frozen).twins == {}
    with pytest.raises(ConfigError, match=r"no 'master' twin.*frozen"):
        m.registry.parallel_chunk("master", frozen)
    with pytest.raises(ConfigError, match="not a parameter chunk"):
        m.registry.group_of(masters[0])
    m.close()


def test_a_repack_makes_new_groups_with_the_same_twin_kinds():
    m, params = _manager()
    m.add_parallel("master", torch.float64, copy_params=True)
    old = dict(m.groups)
    m.repack(["p1", "p0", "p2"])
    assert m.registry.twin_kinds == ("master",)
    assert all(m.groups[i] is not old.get(i) for i in m.groups)
    twin = m.registry.parallel_chunk("master", m.chunk_of("p1"))
    assert torch.equal(twin.shard_view("p1")[0], params[1].data.double().reshape(-1))
    m.close()


def test_gradient_state_is_cleared_in_one_place():
    m, _ = _manager()
    group = m.registry.group_of(m.chunk_of("p0"))
    group.grads, group.accumulated = GradPhase.REDUCED, True
    group.kept_grads["p0"] = torch.ones(NUMEL)
    assert group.holds_gradients
    group.clear_gradients()
    assert group.grads is GradPhase.EMPTY and not group.accumulated and not group.kept_grads
    m.close()


def test_residency_is_on_the_chunk():
    m, _ = _manager(acc=2 * 4 * NUMEL)
    c0, c1 = m.chunk_of("p0"), m.chunk_of("p1")
    m.move(c0, ACC)
    m.books.keep_on_compute([c0])
    assert c0.kept and not c1.kept
    m.books.keep_on_compute([c0], keep=False)
    assert not c0.kept
    m.move(c0, HOST)
    m.policy.set_schedule([[c0.chunk_id], [c1.chunk_id]])  # type: ignore[attr-defined]
    m._placement.inline_copy_bytes = 0  # a copy on the worker: in flight until settled
    m.set_moment(0, prefetch=1)
    assert c1.prefetch is not None and c1.tier is HOST
    m.settle([c1])
    assert c1.prefetch is None and c1.tier is ACC
    m.close()


def test_hooks_are_checked_at_construction():
    cfg = ChunkConfig(NUMEL, device="cpu", disk_bytes=0)
    assert isinstance(ChunkManager(cfg).hooks, NoHooks)
    with pytest.raises(ConfigError, match="not ManagerHooks"):
        ChunkManager(cfg, hooks=object())  # type: ignore[arg-type]


def test_the_lifecycle_follows_collectives_and_reshard_overrides_the_hooks(world):
    for out in world(2).run(checks.lifecycle_through_collectives):
        assert out == checks.EXPECTED
