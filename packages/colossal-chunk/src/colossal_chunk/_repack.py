"""Re-packing the chunk manager's chunks in first-use order.

[Note: first-use order] ``repack(order)`` re-packs every parameter, and every parallel chunk with
it, in the order given (the compute order a warmup traced), so that tensors used together share
a chunk. Values of every kind are kept exactly; chunk ids are those a fresh ``register`` and
``add_parallel`` of each kind in turn would give.

[Note: streaming re-pack] The re-pack never holds the model: each new parameter chunk is filled,
then its twins, from the old chunks' values, and an old chunk's payload goes (its memory or its
file's slot) as soon as every tensor it held has its new home. The tiers stop counting the old
chunks before the first new one is placed, so the new chunks land where they would if the old
ones were gone (as when the re-pack copied everything out first); what the tiers do not count
for that while is the old chunks still open. On one rank an old chunk's values are read where
they live (a disk payload through its mapping, whose pages are the file's), so the re-pack's own
memory is the new chunk being filled; on several ranks an old chunk is all-gathered once, when
first needed, and the copy dropped with its payload. In first-use order the old chunks come in
nearly the order they were registered, so few are open at once: the full copy it used to make
(16 B per parameter: 4.8 GB for a 302M-parameter GPT with its states on disk) ran a 3.6B one
out of RAM.

``ChunkRegistry.repack`` does it (once the manager has finished everything in flight) with
``register``'s and ``add_parallel``'s parts (``_pack``, ``_new_twin``, ``_fill``) and the
``OldChunks`` here; sizes given to it (an owner's fitted ``chunk_numel`` and
``frozen_chunk_numel``) replace the config's before the new chunks are made.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from colossal_contracts import ChunkStateError

from ._chunk import Chunk, _all_gather
from ._placement import Placement

__all__ = ["OldChunks"]


class OldChunks:
    """The chunks a re-pack replaces: each one's full values, made when first asked for, and
    given up once every tensor it holds has been taken ([Note: streaming re-pack])."""

    def __init__(self, chunks: list[Chunk], placement: Placement, group: dist.ProcessGroup | None):
        self._placement, self._group = placement, group
        self._of = {(c.kind, n): c for c in chunks for n in c.records}
        self._left = {c.chunk_id: len(c.records) for c in chunks}
        self._full: dict[int, torch.Tensor] = {}
        # the tiers count them no more: new chunks are placed as if they were gone already
        self._tier = {c.chunk_id: placement.give_up_room(c) for c in chunks}
        placement.drop_kept_buffers()  # sized for the old chunks

    def value(self, kind: str, name: str) -> torch.Tensor:
        """The full value of tensor ``name`` of ``kind`` (a view of its old chunk's values)."""
        c = self._of[(kind, name)]
        full = self._full.get(c.chunk_id)
        if full is None:
            full = self._full[c.chunk_id] = _full_values(c, self._group)
        rec = c.records[name]
        return full[rec.offset : rec.end].view(rec.shape)

    def shape(self, kind: str, name: str) -> torch.Size:
        """Tensor ``name``'s shape."""
        return self._of[(kind, name)].records[name].shape

    def taken(self, kind: str, names: Sequence[str]) -> None:
        """``names`` of ``kind`` have their new home: give up old chunks left with none."""
        for name in names:
            c = self._of.pop((kind, name))
            self._left[c.chunk_id] -= 1
            if self._left[c.chunk_id] == 0:
                self._full.pop(c.chunk_id, None)
                self._placement.discard_payload(c, self._tier.pop(c.chunk_id))

    def kinds(self) -> dict[str, torch.dtype]:
        """Every twin kind there is (not "param"), with its dtype."""
        return {c.kind: c.dtype for c in self._of.values() if c.kind != "param"}


def _full_values(c: Chunk, group: dist.ProcessGroup | None) -> torch.Tensor:
    """All of chunk ``c``'s values: its shard itself on one rank (read where it lives), an
    all-gathered copy when sharded."""
    shard = c.shard
    if shard is None:
        raise ChunkStateError(f"chunk {c.chunk_id} has no shard storage yet")
    if c.world_size == 1:
        return shard.detach()
    nccl = dist.get_backend(group) == "nccl"
    dev = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
    full = torch.empty(c.capacity, dtype=c.dtype, device=dev)
    _all_gather(full, shard.detach().to(dev).contiguous(), group=group)
    return full
