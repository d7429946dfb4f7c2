"""Re-packing the chunk manager's chunks in first-use order.

[Note: first-use order] ``repack(order)`` re-packs every parameter, and every parallel chunk with
it, in the order given (the compute order a warmup traced), so that tensors used together share
a chunk. Values of every kind are kept exactly; chunk ids change.

``ChunkManager`` inherits these methods; they rebuild its chunks through ``register`` and
``add_parallel``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from colossal_contracts import ChunkStateError, StateTransitionError

from ._chunk import Chunk, _all_gather
from ._group import ChunkGroup
from ._placement import Placement
from ._views import ParamViews

__all__ = ["ManagerRepack"]


class ManagerRepack:
    """``repack`` and the layout it reads; see the module docstring. Uses the manager's
    ``register``, ``add_parallel``, ``param_chunks`` and ``settle``."""

    chunks: dict[int, Chunk]  # every chunk by id (the manager's)
    group: dist.ProcessGroup | None  # the manager's
    _placement: Placement  # the manager's
    _views: ParamViews  # the manager's
    groups: dict[int, ChunkGroup]  # the manager's
    _spill: dict[str, int | None]  # the manager's: twin kind -> spill_reserve

    def registration_order(self) -> list[str]:
        """Parameter names in the order they sit in chunks."""
        return [n for c in self.param_chunks() for n in c.records]

    def repack(self, order: Sequence[str]) -> list[Chunk]:
        """Re-pack every chunk in ``order``; see [Note: first-use order]. Collective when chunks
        are sharded. Every tensor must be HOLD or FREE. Returns the new parameter chunks."""
        self.settle()
        busy = [c.chunk_id for c in self.chunks.values() if not c.movable]
        if busy:
            raise StateTransitionError(
                f"cannot re-pack chunks while chunks {busy[:4]} hold tensors in use; release them"
            )
        values: dict[str, dict[str, torch.Tensor]] = {}  # kind -> name -> full value
        dtypes: dict[str, torch.dtype] = {}
        for c in self.chunks.values():
            full = self._full_copy(c)
            dtypes[c.kind] = c.dtype
            kind = values.setdefault(c.kind, {})
            for name, rec in c.records.items():
                kind[name] = full[rec.offset : rec.end].view(rec.shape)
            self._placement.forget(c)
        params, kinds = dict(self._views.params), dict(self._spill)
        frozen = [
            n for c in self.chunks.values() if c.kind == "param" and c.frozen for n in c.records
        ]
        self.chunks = {}
        self._views.clear()
        self.groups, self._spill = {}, {}
        for name, p in params.items():
            p.data = values["param"][name]
        new = self.register(params.items(), order=order, frozen=frozen)
        for kind in kinds:
            for twin in self.add_parallel(kind, dtypes[kind], spill_reserve=kinds[kind]):
                for name in twin.records:
                    part = twin.shard_view(name)
                    if part is not None:
                        view, a, b = part
                        view.copy_(values[kind][name].reshape(-1)[a:b])
        return new

    def _full_copy(self, c: Chunk) -> torch.Tensor:
        """A CPU copy of the whole chunk ``c`` (all-gathered from the shards when sharded)."""
        shard = c.shard
        if shard is None:
            raise ChunkStateError(f"chunk {c.chunk_id} has no shard storage yet")
        if c.world_size == 1:
            return shard.detach().cpu().clone()
        nccl = dist.get_backend(self.group) == "nccl"
        dev = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
        shard = shard.detach().to(dev).contiguous()
        full = torch.empty(c.capacity, dtype=c.dtype, device=dev)
        _all_gather(full, shard, group=self.group)
        return full.cpu()
