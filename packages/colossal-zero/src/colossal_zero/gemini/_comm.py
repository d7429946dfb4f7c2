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

[Note: gathers several ahead] Under a tight budget chunks are small, an operator computes
for less time than a collective's latency, and an all-gather started one moment ahead is still
waited for: GPT stock-tiny on 4 ranks (2 cores) at a quarter budget spent about two thirds of
its step in ``wait``. With ``GeminiConfig.gather_ahead`` = ``n`` > 1, a moment's window is the
chunks of moments ``i + 1``, ``i + 2``, ... in the order of their first use, until ``n``
distinct chunks are named or their all-gathers would put more than ``ws - 1`` times the fit's
``OVERLAP_BYTES`` on the wire (always all of moment ``i + 1``'s): a batch saves ``ws - 1``
hops of a collective's latency for each collective it replaces, and exposes more bytes
before its first chunk is ready. Fitted on this host's gloo: on 2 ranks batches of two 13.4 MB
chunks were slower (stock-module GPT mini at 0.6 of the states, 0.85 -> 0.99 of FSDP2 offload's
step), on 4 ranks batches of two 8.4 MB chunks faster (0.97-0.99 -> 0.88-0.94 at 0.6 of the
states, 1.15-1.17 -> 1.07-1.13 at a quarter budget; two side-by-side runs). As moment ``i`` begins,
nothing starts while the next moment's chunks and the first chunk after them are gathered or in
flight; otherwise every chunk of the window that is not starts, those that fit in the room as
one collective (colossal-chunk's [Note: coalesced gathers]). So gathers go out in batches of
about ``n - 1`` chunks, each at least one chunk's moments before its use (a window sliding one
chunk at a time would start one chunk per collective again). A chunk gathered this way waits,
gathered, for its moment; one the next moment uses stays gathered as before. Measured side by
side with FSDP2 CPU offload (paired step ratios, 4 ranks): at a quarter budget GPT tiny 1.23 ->
1.08 and stock-tiny 1.27 -> 1.05, at 0.6 of the states 1.00 -> 0.87 and 1.01 -> 0.93. Big
chunks go one by one (the byte cap): batches of three 16.8 MB chunks of a stock-module GPT mini
on 2 ranks were waited for so long that its step took 1.45 of FSDP2 offload's, against 0.88 one
by one.

Nothing in flight crosses a step: the last moment has no next one, and the end of backward
finishes every collective. Decisions that depend on room must be the same on every rank, so the
non-model peaks the warmup measured are agreed (the largest over ranks) before planning.
The values computed are those of the synchronous path, bit for bit.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from colossal_chunk import Chunk
from colossal_contracts import MemStatsSource, TierName

from ._chunk_index import ChunkIndex
from ._fit_cost import OVERLAP_BYTES

if TYPE_CHECKING:
    from ._runtime import GeminiRuntime

__all__ = ["CommSchedule", "GeminiHooks", "RankMaxStats"]


class CommSchedule:
    """Per moment, the parameter chunks the next moment uses ([Note: overlap])."""

    def __init__(self, order: Sequence[tuple[str, ...]], index: ChunkIndex, depth: int = 1):
        """``depth``: ``GeminiConfig.gather_ahead``, the chunks of the coming moments to gather
        as a moment begins ([Note: gathers several ahead])."""
        self.order = list(order)
        self.depth = depth
        self._ahead: list[tuple[int, ...]] = []
        self._lead: list[int] = []  # of ``_ahead[m]``, how many make a gather start
        self._next_set: list[frozenset[int]] = []
        self.reindex(index)

    def reindex(self, index: ChunkIndex) -> None:
        """Map names to chunk ids again with the runtime's ``index`` (after a re-pack)."""
        ids = [index.chunk_ids(names) for names in self.order]
        nxt = [*ids[1:], ()]  # the last moment's next moment is in the next step
        self._next_set = [frozenset(i) for i in nxt]
        self._ahead, self._lead = [], []
        groups = index.groups

        def wire(cid: int) -> int:  # this rank's bytes on the wire of the chunk's all-gather
            c = groups[cid].param
            return c.full_bytes * (c.world_size - 1) // c.world_size

        ws = max((g.param.world_size for g in groups.values()), default=1)
        cap = OVERLAP_BYTES * max(1, ws - 1)  # a batch saves (ws - 1) hops per collective
        for m in range(len(ids)):
            ahead = dict.fromkeys(nxt[m])
            load = sum(wire(c) for c in ahead)
            for j in range(m + 2, len(ids)):  # (no slice: most windows end within a few)
                new = [c for c in ids[j] if c not in ahead]
                load += sum(wire(c) for c in new)
                if len(ahead) >= self.depth or load > cap:
                    break
                ahead.update(dict.fromkeys(new))
            self._ahead.append(tuple(ahead))
            self._lead.append(min(len(ahead), len(nxt[m]) + 1))  # depth 1: all of ``ahead``

    def __len__(self) -> int:
        return len(self.order)

    def ahead(self, moment: int, started: Callable[[int], bool]) -> tuple[int, ...]:
        """Chunks to start gathering as ``moment`` begins, in the order of their first use
        ([Note: gathers several ahead]): none while the next moment's chunks and the one after
        them are ``started`` (gathered, in flight, or not needed), else those of the window that
        are not."""
        if moment >= len(self._ahead):
            return ()
        window = self._ahead[moment]
        if all(started(c) for c in window[: self._lead[moment]]):
            return ()
        return tuple(c for c in window if not started(c))

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
