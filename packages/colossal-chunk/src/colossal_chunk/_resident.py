"""Where the chunk manager's chunks reside: moves and prefetches to the compute tier, and the
fast paths for chunks that stay there.

[Note: resident fast path] ``fully_resident()`` says that a whole step can run without touching a
tier: one rank (nothing is gathered or reduced across ranks), every parameter chunk on the
compute tier and never evicted after use, no collective or copy in flight, no demand being
recorded, and room at every moment of the step for what is there now plus the headroom a runtime
asks for (chunks it may add lazily). Then ``access`` and ``release`` would only change states,
and a runtime may skip them around operators for that step; the values computed are the same.
Until the layout or the moment changes (``register``, ``add_parallel``, ``move``, ``set_moment``,
``track_demand``, ``gather_ahead``, ``prefetch``, an access off the fast path), the manager's own
fast paths then skip their room check too: it held for every moment when ``fully_resident``
answered.

The manager holds one ``Residency`` (``ChunkManager.residency``): the moment the step is at, the
fast path's steady flag, moves and prefetches to the compute tier, and ``fully_resident``.
"""

from __future__ import annotations

from collections.abc import Callable

from colossal_contracts import PlacementPolicy, TensorState, TierName

from ._chunk import Chunk
from ._pending import InFlightCount
from ._placement import Placement
from ._register import ChunkRegistry
from ._tier import UNLIMITED

__all__ = ["Residency"]

ACC = TierName.ACCELERATOR


class Residency:
    """Where the chunks reside through a step; see the module docstring."""

    moment: int  # the moment the step is at (``set_moment``)
    steady: bool  # fully_resident() said yes and nothing changed since

    def __init__(
        self,
        placement: Placement,
        policy: PlacementPolicy,
        registry: ChunkRegistry,
        *,
        world_size: int,
        in_flight: InFlightCount,
        tracking: Callable[[], bool],
        bind: Callable[[Chunk], None],
    ) -> None:
        """``registry`` holds the manager's chunks by id now (a re-pack replaces them);
        ``tracking`` says whether the books record demand; ``bind`` re-points a chunk's views."""
        self._placement, self._policy, self._registry = placement, policy, registry
        self._world_size, self._in_flight, self._tracking = world_size, in_flight, tracking
        self._bind = bind
        self.moment = 0
        self._num_moments = 0  # moments of the longest step seen (set_moment), for the room check
        self.steady = False

    def set_moment(self, moment: int) -> int:
        """Record that the step reached ``moment``; returns the moments of the longest step seen."""
        self.moment, self.steady = moment, False
        if moment >= self._num_moments:
            self._num_moments = moment + 1
        return self._num_moments

    def unsteady(self) -> None:
        """What the fast path checked changed: it checks its room again ([Note: resident fast
        path])."""
        self.steady = False

    def resident(self, by_chunk: dict[int, list[str]]) -> bool:
        """Whether every chunk of ``by_chunk`` is gathered on the compute tier and fits: an access
        then only changes states."""
        chunks = self._registry.chunks
        for cid in by_chunk:
            c = chunks[cid]
            if c.tier is not ACC or not c.is_gathered:
                return False
        pl = self._placement
        return self.steady or pl.tiers[ACC].used_bytes <= pl.room.limit(self.moment)

    def fully_resident(self, headroom: int = 0) -> bool:
        """See [Note: resident fast path]; ``headroom``: compute-tier bytes that must stay free at
        every moment besides what is there now. Costs one pass over chunks and moments."""
        self.steady = self._fully_resident(headroom)
        return self.steady

    def _fully_resident(self, headroom: int) -> bool:
        if self._world_size > 1 or self._tracking() or self._in_flight.now:
            return False
        policy = self._policy
        for c in self._registry.chunks.values():
            if c.kind == "param" and (c.tier is not ACC or policy.evict_after_use(c.chunk_id)):
                return False
        acc = self._placement.tiers[ACC]
        if acc.capacity_bytes >= UNLIMITED:
            return True
        need = acc.used_bytes + headroom
        limit = self._placement.room.limit
        return all(limit(m) >= need for m in range(max(1, self._num_moments)))

    def move(self, c: Chunk, tier: TierName) -> None:
        """Move chunk ``c``'s shard (no collective in flight) to ``tier``, releasing its gathered
        buffer if it leaves the compute tier and making room when it comes there."""
        pl = self._placement
        self.steady = False
        if tier is not ACC and c.world_size > 1 and c.is_gathered:
            pl.release_gathered(c)
        if tier is ACC:
            pl.room.make_room(
                pl.room.need_for_access(c, gather=False),
                self._registry.chunks.values(),
                exclude={c.chunk_id},
                moment=self.moment,
                what=f"moving chunk {c.chunk_id}",
            )
        pl.move(c, tier)
        self._bind(c)

    def after_release(
        self, chunks: list[Chunk], reshard: bool, keep: Callable[[Chunk], bool]
    ) -> None:
        """Released ``chunks``: with ``reshard``, a sharded one whose tensors are all HOLD drops
        its gathered buffer unless ``keep(chunk)``; one the policy evicts after use leaves the
        compute tier."""
        evict_after = self._policy.evict_after_use
        for c in chunks:
            moved = False
            if reshard and c.world_size > 1 and c.all_in(TensorState.HOLD) and not keep(c):
                self._placement.release_gathered(c)
                moved = True
            if c.movable and evict_after(c.chunk_id):
                self._placement.offload(c)
                moved = True
            if moved:  # else storage is unchanged: the views still point at it
                self._bind(c)

    def prefetch(self, horizon: int = 1) -> int:
        """Start copying chunks the policy says the next ``horizon`` moments need; returns how many.

        Needs a policy with ``upcoming`` (``AutoPolicy`` after warmup); never breaks the budget and
        evicts only chunks needed later than the one fetched.
        """
        next_use = self._policy.next_use
        issued, self.steady = 0, False
        chunks = self._registry.chunks
        for cid in self._policy.upcoming(self.moment, horizon):
            if self._placement.prefetch(
                chunks[cid],
                moment=self.moment,
                chunks=chunks.values(),
                target_use=next_use(cid, self.moment),
            ):
                issued += 1
        return issued
