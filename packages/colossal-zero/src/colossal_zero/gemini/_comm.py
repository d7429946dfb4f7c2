"""When Gemini's collectives run on more than one rank: ahead of use, and without waiting.

[Note: overlap] With ``GeminiConfig.overlap_comm`` and a sharded model, once the warmup step has
traced the compute order (the same on every rank, [Note: rank agreement]):

- as moment ``i`` begins, the all-gathers of the chunks moment ``i + 1`` uses are started, so
  they run while moment ``i``'s operator computes (only chunks whose shards are on the compute
  tier, while the gathered buffers fit in the moment's room);
- a chunk that moment ``i + 1`` uses again stays gathered after moment ``i`` releases it (no
  release and re-gather of the same bytes between neighbouring operators);
- a gradient chunk is reduce-scattered as soon as every tensor in it is READY_FOR_REDUCE and
  backward goes on; the collective is finished when the chunk is next used, or all of them at
  the end of backward, before the optimizer reads shards.

Nothing in flight crosses a step: the last moment has no next one, and the end of backward
finishes every collective. Decisions that depend on room must be the same on every rank, so the
non-model peaks the warmup measured are agreed (the largest over ranks) before planning.
The values computed are those of the synchronous path, bit for bit.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from colossal_chunk import Chunk
from colossal_contracts import MemStatsSource, TierName

from ._chunk_index import ChunkIndex

if TYPE_CHECKING:
    from ._runtime import GeminiRuntime

__all__ = ["CommSchedule", "GeminiHooks", "RankMaxStats"]


class CommSchedule:
    """Per moment, the parameter chunks the next moment uses ([Note: overlap])."""

    def __init__(self, order: Sequence[tuple[str, ...]], index: ChunkIndex):
        self.order = list(order)
        self._next: list[tuple[int, ...]] = []
        self._next_set: list[frozenset[int]] = []
        self.reindex(index)

    def reindex(self, index: ChunkIndex) -> None:
        """Map names to chunk ids again with the runtime's ``index`` (after a re-pack)."""
        ids = [index.chunk_ids(names) for names in self.order]
        self._next = [*ids[1:], ()]  # the last moment's next moment is in the next step
        self._next_set = [frozenset(i) for i in self._next]

    def __len__(self) -> int:
        return len(self.order)

    def ahead(self, moment: int) -> tuple[int, ...]:
        """Chunks to start gathering as ``moment`` begins."""
        return self._next[moment] if moment < len(self._next) else ()

    def keep(self, chunk: Chunk, moment: int) -> bool:
        """``ManagerHooks.keep_gathered`` (through ``GeminiHooks``): True if the moment after
        ``moment`` (the current one) uses ``chunk``."""
        return moment < len(self._next_set) and chunk.chunk_id in self._next_set[moment]


class GeminiHooks:
    """colossal-chunk's ``ManagerHooks`` for Gemini's runtime, given to its manager at
    construction: while the warmup step records on more than one rank, every collective is
    checked to be the same on all of them ([Note: rank agreement]); once an overlap schedule
    exists, a chunk the next moment uses stays gathered ([Note: overlap]). It reads the
    runtime's state and holds it weakly (the runtime owns the manager, which owns this)."""

    def __init__(self, runtime: GeminiRuntime) -> None:
        self._runtime = weakref.ref(runtime)

    def before_collective(self, kind: str, chunk: Chunk) -> None:
        rt = self._runtime()
        if rt is not None and rt.agreeing:
            rt.agree_collective(kind, chunk)

    def keep_gathered(self, chunk: Chunk) -> bool:
        rt = self._runtime()
        comm = None if rt is None else rt.comm
        return comm is not None and comm.keep(chunk, rt.moment)


class RankMaxStats:
    """A ``MemStatsSource`` whose accelerator peaks are the largest over the ranks of a group
    (so that every rank plans the same room at every moment); the rest is the local trace's."""

    def __init__(self, local: MemStatsSource, group: dist.ProcessGroup):
        self.local = local
        n = local.num_moments()
        peaks = torch.tensor(
            [local.non_model_peak(i, TierName.ACCELERATOR) for i in range(n)], dtype=torch.int64
        )
        if dist.get_backend(group) == "nccl":
            peaks = peaks.cuda()
        dist.all_reduce(peaks, op=dist.ReduceOp.MAX, group=group)
        self.peaks = peaks.tolist()

    def num_moments(self) -> int:
        return len(self.peaks)

    def non_model_peak(self, moment: int, tier: TierName | str) -> int:
        if TierName(tier) is TierName.ACCELERATOR:
            return self.peaks[moment]
        return self.local.non_model_peak(moment, tier)

    def compute_order(self) -> Sequence[tuple[str, ...]]:
        return self.local.compute_order()
