"""Run on every rank by test_overwrite_moves.py: moves of a shard a reduce-scatter will overwrite."""

import torch
import torch.distributed as dist

from colossal_chunk import Chunk, ChunkConfig
from colossal_chunk._placement import Placement
from colossal_chunk._tier import build_tiers
from colossal_contracts import TensorState, TierName

ACC, HOST = TierName.ACCELERATOR, TierName.HOST


def _copies(chunk: Chunk) -> list[bool]:
    """Record the ``copy`` argument of every ``replace_shard`` call on ``chunk``."""
    seen: list[bool] = []
    inner = chunk.replace_shard

    def spy(storage: torch.Tensor, *, copy: bool = True) -> torch.Tensor:
        seen.append(copy)
        return inner(storage, copy=copy)

    chunk.replace_shard = spy  # type: ignore[method-assign]
    return seen


def evicting_a_reduce_target_copies_nothing() -> dict[str, object]:
    """A gradient shard brought in uncopied for a reduce-scatter ``into`` it and evicted before
    the result came moves without a copy, and the result lands in its host shard; once the
    result is there, a move copies again and keeps the values."""
    group, rank, world = dist.group.WORLD, dist.get_rank(), dist.get_world_size()
    tiers = build_tiers(ChunkConfig(16 * world, device="cpu", disk_bytes=0))
    pl = Placement(tiers, policy=None, budget=lambda moment: 1 << 40)  # type: ignore[arg-type]
    param = Chunk(0, 8 * world, torch.float32, group=group)
    param.add("w", (7 * world,))
    grad = param.same_layout(1, torch.float32, "grad")
    for c in (param, grad):
        zeros = {n: torch.zeros(r.shape) for n, r in c.records.items()}
        pl.reserve_new(c, ACC if c is param else HOST)
        c.fill_shard(pl.allocate_new(c), zeros)
    pl.gather(param, zero=True)
    every = [
        torch.randn(param.capacity, generator=torch.Generator().manual_seed(r))
        for r in range(world)
    ]
    param.full.copy_(every[rank])  # type: ignore[union-attr]
    for name in param.records:
        param.set_state(name, TensorState.COMPUTE)
        param.set_state(name, TensorState.READY_FOR_REDUCE)
    copies = _copies(grad)
    pl.move(grad, ACC, copy=False)  # as the manager brings a reduce target in
    pending = param.start_reduce_scatter(into=grad)
    awaited = grad.awaits_overwrite
    pl.move(grad, HOST)  # evicted before the result came
    pending.wait()
    lo, n = rank * param.shard_numel, param.shard_numel
    want = (torch.stack(every).sum(0) / world)[lo : lo + n]
    landed = torch.equal(grad.shard, want) and grad.tier is HOST
    after = grad.awaits_overwrite
    pl.move(grad, ACC)  # the result is live now: copied
    kept = torch.equal(grad.shard, want)
    pl.close()
    return {
        "copies": copies,
        "awaited": awaited,
        "after": after,
        "landed": landed,
        "kept": kept,
    }


def accumulating_reduce_keeps_the_copy() -> list[bool]:
    """A reduce-scatter that adds into the shard needs its values: the move copies."""
    group, world = dist.group.WORLD, dist.get_world_size()
    tiers = build_tiers(ChunkConfig(16 * world, device="cpu", disk_bytes=0))
    pl = Placement(tiers, policy=None, budget=lambda moment: 1 << 40)  # type: ignore[arg-type]
    grad = Chunk(0, 8 * world, torch.float32, kind="grad", group=group)
    grad.add("w", (8 * world,))
    pl.reserve_new(grad, ACC)
    grad.fill_shard(pl.allocate_new(grad), {"w": torch.ones(8 * world)})
    pl.gather(grad, zero=True)
    grad.full.fill_(2.0)  # type: ignore[union-attr]
    for name in grad.records:
        grad.set_state(name, TensorState.COMPUTE)
        grad.set_state(name, TensorState.READY_FOR_REDUCE)
    pending = grad.start_reduce_scatter(accumulate=True)
    pending.wait()
    copies = _copies(grad)
    pl.move(grad, HOST)
    ok = torch.equal(grad.shard, torch.full((grad.shard_numel,), 3.0))
    pl.close()
    return [*copies, ok, not grad.awaits_overwrite]
