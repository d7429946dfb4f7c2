"""The chunk manager's collectives: reduce-scatters, all-gathers ahead of use, and finishing
what is in flight.

[Note: collectives in flight] (``_pending.py``): ``gather_ahead`` and ``reduce(async_op=True)``
start collectives that an access, a move, a re-pack or ``settle()`` of the chunk finishes. A
runtime whose ``ManagerHooks.keep_gathered`` says so keeps a chunk gathered after a release when the rule says it
is used again soon. Every rank must make the same calls, as for any collective.

[Note: gathers ahead] ``gather_ahead`` is the budgeted path's overlap: a chunk a coming moment
uses is all-gathered while the current moment computes, its shard first brought to the compute
tier if it is on the host (finishing its prefetch, else a copy). Room is made the way a
prefetch makes it: only chunks whose next use comes after that chunk's are evicted, furthest
first, and nothing when they cannot free enough (then the chunk is gathered at its access, as
without overlap). Under a tight budget this turns the waits on synchronous all-gathers into
gathers that run beside compute. It can move a little more than waiting does: a chunk evicted
for a gather ahead may be one that the access, once the current chunk is released, would have
kept (GPT tiny, a quarter budget, 2 ranks: 3% more bytes moved).

[Note: gathers from the host] A sharded chunk whose shard is on the host and whose shard and
gathered buffer together do not fit in the moment's room beside what is there is gathered
straight from the host shard (``Placement.from_host``): the shard is copied into its own slice
of the gathered buffer (on a GPU, a host-to-device copy) and gathered in place, as FSDP2's CPU
offload copies a shard in for its all-gather; the copy counts as a move of the shard. The shard
stays on the host, so the access needs room for the buffer only and evicts nothing to bring the
shard in, nor later to take it out again; releasing the chunk copies this rank's slice back to
the host shard (counted), and a reduce-scatter into it counts its result's copy. A prefetch does
not bring in such a shard: it would only take room from gathered buffers. Under a tight budget
the compute tier holds more gathered buffers and fewer cached shards. GPT tiny on 4 ranks, a
quarter budget, per step and rank: 16 shard moves each way -> 10 (plus the counted staging
copies), evictions of a chunk whose reduce-scatter is in flight 10 -> 9. On one rank nothing
changes (a shard is the gathered buffer), nor where everything fits.

[Note: coalesced gathers] The chunks one ``gather_ahead`` starts are all-gathered in one
collective (torch's coalescing manager, ``GatherBatch``), not one each. Where a budget shrinks
chunks, a step's all-gathers multiply, and each pays a collective's latency whatever its size:
gloo on loopback with 4 ranks sharing 2 cores measured about 2.5 ms for one 1 MiB all-gather,
10.6 ms for four started together and 5.7 ms for the same four coalesced. A runtime that asks
for the chunks of several coming moments at once (Gemini's ``GeminiConfig.gather_ahead``) gets
fewer, larger collectives that start earlier. The values gathered are the same bits. Without a
coalescing manager in torch, each chunk starts its own.

The manager holds one ``Collectives`` (``ChunkManager.collectives``); it reads the manager's chunks,
placement, policy and hooks, and the moment from its ``Residency``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
import torch.distributed as dist

from colossal_contracts import PlacementPolicy, TierName

from ._chunk import Chunk
from ._hooks import ManagerHooks
from ._pending import GatherBatch, InFlightCount
from ._placement import Placement
from ._register import ChunkRegistry
from ._resident import Residency

__all__ = ["Collectives"]

ACC = TierName.ACCELERATOR
COALESCING = hasattr(dist, "_coalescing_manager")  # torch's, since 2.0: [Note: coalesced gathers]


class Collectives:
    """Collectives on chunks; see the module docstring."""

    def __init__(
        self,
        placement: Placement,
        policy: PlacementPolicy,
        registry: ChunkRegistry,
        *,
        hooks: ManagerHooks,
        residency: Residency,
        in_flight: InFlightCount,
        bind: Callable[[Chunk], None],
    ) -> None:
        """``registry`` holds the manager's chunks by id now; ``residency`` the moment and the fast
        path's flag; ``bind`` re-points a chunk's views."""
        self._placement, self._policy, self._registry = placement, policy, registry
        self._hooks, self._residency, self._bind = hooks, residency, bind
        self._in_flight = in_flight  # [Note: collectives in flight]

    def _chunk(self, item: Chunk | int) -> Chunk:
        return self._registry.chunks[item.chunk_id if isinstance(item, Chunk) else item]

    def reduce(
        self, chunk: Chunk | int, into: Chunk | int | None, *, average: bool, async_op: bool,
        read_on_host: bool,
    ) -> None:  # fmt: skip
        """``ChunkManager.reduce`` (its defaults and docstring are there)."""
        c = self._chunk(chunk)
        dst = None if into is None else self._chunk(into)
        if dst is c or c.world_size == 1:
            dst = None
        if c.world_size > 1:
            self._hooks.before_collective("reduce-scatter", c)
        if dst is not None:
            self._reduce_target(dst, read_on_host=read_on_host)
        elif c.world_size > 1 and c.tier is not ACC:  # gathered from the host: the result lands
            self._placement.moves.count_copy(ACC, c.current_tier, c.shard_bytes)
        ws = self._placement.workspace
        pending = c.start_reduce_scatter(average=average, into=dst, workspace=ws)
        if async_op:
            return
        self._placement.drop_gathered(c, pending.wait())
        self._bind(c)

    def _reduce_target(self, dst: Chunk, *, read_on_host: bool = False) -> None:
        """Where a reduce-scatter ``into`` ``dst`` lands: its shard's values are dead (the result
        overwrites them). A shard off the compute tier comes to it uncopied when it fits in this
        moment's room without evicting anything and is not ``read_on_host``; else a host shard
        stays there and takes the result straight from the collective (counted as a move off the
        compute tier, as FSDP2's CPU offload copies reduced gradients to the host), and a disk
        shard is brought in as an access would bring it. (A shard brought in for a reader on the
        host would be evicted again, or copied there, before that reader: two moves for none.)"""
        pl, acc, moment = self._placement, self._placement.tiers[ACC], self._residency.moment
        pl.settle(dst)
        if dst.tier is ACC:
            return
        if dst.tier is TierName.HOST and (
            read_on_host or acc.used_bytes + dst.shard_bytes > pl.room.limit(moment)
        ):
            pl.moves.count_copy(ACC, TierName.HOST, dst.shard_bytes)
            return
        pl.room.make_room(
            dst.shard_bytes,
            self._registry.chunks.values(),
            exclude={dst.chunk_id},
            moment=moment,
            what=f"the reduce-scatter into chunk {dst.chunk_id}",
        )
        pl.move(dst, ACC, copy=False)
        self._residency.unsteady()

    def gather_ahead(self, chunks: Iterable[Chunk | int]) -> int:
        """Start all-gathering sharded ``chunks`` for a coming moment, while their shards and
        gathered buffers fit in this moment's room, making room by evicting only chunks used
        after them ([Note: gathers ahead]); returns how many started, as one collective when
        several do ([Note: coalesced gathers]). Collective: every rank must pass the same chunks
        in the same state, in the order of their use."""
        pl, acc = self._placement, self._placement.tiers[ACC]
        started: list[tuple[Chunk, torch.Tensor]] = []
        moment = self._residency.moment
        self._residency.unsteady()
        next_use = self._policy.next_use
        for item in chunks:
            c = self._chunk(item)
            if c.world_size == 1 or c.is_gathered:
                continue
            if c.tier is TierName.DISK:
                continue  # brought in by its access, after the disk read-ahead
            staged = pl.room.from_host(c, moment)  # [Note: gathers from the host]
            if not pl.room.room_before(
                c.full_bytes if staged else pl.room.need_for_access(c, gather=True),
                moment=moment,
                target_use=next_use(c.chunk_id, moment),
                chunks=self._registry.chunks.values(),
                skip=c,
            ):
                break
            self.finish(c)
            if c.tier is not ACC and not staged:
                pl.move(c, ACC)  # finishes its prefetch, or copies the shard in now
            self._hooks.before_collective("all-gather", c)
            pl.count_staging(c)
            acc.reserve(c.full_bytes, what=f"gathered chunk {c.chunk_id}")
            started.append((c, pl.gathered_buffer(c)))
        _start_gathers(started)
        return len(started)

    def settle(self, chunks: Iterable[Chunk] | None = None) -> None:
        """Finish every prefetch in flight (of ``chunks`` only, when given). Call before writing
        shards outside the access protocol (an optimizer step, restoring parameters from fp32
        masters): a copy in flight would otherwise bring back old values. Finishes collectives
        in flight too ([Note: collectives in flight])."""
        if chunks is not None:
            for c in chunks:
                self.finish(c)
                self._placement.settle(c)
            return
        everything = self._registry.chunks
        if self._in_flight.now:
            for c in everything.values():
                self.finish(c)
        self._placement.settle_all(everything)

    def finish(self, chunk: Chunk) -> None:
        """Finish ``chunk``'s collective if one is in flight (its ``Lifecycle``), freeing a
        gathered buffer a reduce-scatter dropped and re-pointing the views."""
        if chunk.lifecycle.in_flight:
            self._placement.drop_gathered(chunk, chunk.wait())
            self._bind(chunk)


def _start_gathers(started: list[tuple[Chunk, torch.Tensor]]) -> None:
    """Start the all-gathers of ``(chunk, gathered buffer)`` pairs (one manager's chunks: one
    process group), as one collective when there are several ([Note: coalesced gathers])."""
    if len(started) < 2 or not COALESCING:
        for c, full in started:
            c.start_gather(full)
        return
    with GatherBatch(started[0][0].group) as batch:
        for c, full in started:
            c.start_gather(full, batch=batch)
