"""Re-packing the chunk manager's chunks in first-use order.

[Note: first-use order] ``repack(order)`` re-packs every parameter, and every parallel chunk with
it, in the order given (the compute order a warmup traced), so that tensors used together share
a chunk. Values of every kind are kept exactly; chunk ids change. Sizes given to it (an owner's
fitted ``chunk_numel`` and ``frozen_chunk_numel``) replace the config's before the new chunks are
made.

``ChunkRegistry.repack`` does it (once the manager has finished everything in flight), reading
every chunk whole with ``full_copy``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from colossal_contracts import ChunkStateError

from ._chunk import Chunk, _all_gather

__all__ = ["full_copy"]


def full_copy(c: Chunk, group: dist.ProcessGroup | None) -> torch.Tensor:
    """A CPU copy of the whole chunk ``c`` (all-gathered from the shards when sharded)."""
    shard = c.shard
    if shard is None:
        raise ChunkStateError(f"chunk {c.chunk_id} has no shard storage yet")
    if c.world_size == 1:
        return shard.detach().cpu().clone()
    nccl = dist.get_backend(group) == "nccl"
    dev = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
    shard = shard.detach().to(dev).contiguous()
    full = torch.empty(c.capacity, dtype=c.dtype, device=dev)
    _all_gather(full, shard, group=group)
    return full.cpu()
