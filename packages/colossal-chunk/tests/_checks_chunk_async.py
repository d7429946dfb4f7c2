"""Run on every rank by test_chunk_async.py: async reduce-scatter with accumulation."""

import torch
import torch.distributed as dist

from colossal_chunk import Chunk
from colossal_contracts import TensorState


def _ready(chunk: Chunk) -> None:
    for name in chunk.records:
        chunk.set_state(name, TensorState.COMPUTE)
        chunk.set_state(name, TensorState.READY_FOR_REDUCE)


def two_micro_batches_accumulate_into_the_shard() -> bool:
    """Two reduce-scatters, the second accumulated, give the averaged sum of both buffers."""
    group = dist.group.WORLD if dist.is_initialized() else None
    rank, world = (dist.get_rank(), dist.get_world_size()) if group is not None else (0, 1)
    chunk = Chunk(0, 8 * world, torch.float32, kind="grad", group=group)
    chunk.add("a", (3, world))
    chunk.add("b", (5 * world,))
    chunk.fill_shard(
        torch.empty(chunk.shard_numel), {n: torch.zeros(r.shape) for n, r in chunk.records.items()}
    )
    sums = torch.zeros(chunk.capacity)
    for micro in range(2):
        g = torch.Generator().manual_seed(10 * micro + rank)
        full = torch.randn(chunk.capacity, generator=g)
        every = [
            torch.randn(chunk.capacity, generator=torch.Generator().manual_seed(10 * micro + r))
            for r in range(world)
        ]
        sums += torch.stack(every).sum(0) / world
        buf = torch.empty(chunk.capacity)
        if world == 1:
            if micro == 0:
                chunk.materialize(buf)
            chunk.full.add_(full)  # type: ignore[union-attr]
        else:
            chunk.materialize(buf)
            chunk.full.copy_(full)  # type: ignore[union-attr]
        _ready(chunk)
        pending = chunk.start_reduce_scatter(accumulate=micro > 0)
        assert chunk.state("a") is TensorState.HOLD
        pending.wait()
        assert pending.wait() is None  # a second wait does nothing
    lo = rank * chunk.shard_numel
    return torch.allclose(chunk.shard, sums[lo : lo + chunk.shard_numel], atol=1e-6)
