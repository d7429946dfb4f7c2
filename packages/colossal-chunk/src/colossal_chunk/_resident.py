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

``ChunkManager`` inherits these methods (``move``, ``prefetch``, ``fully_resident``); they read its chunks, placement, policy and moment.
"""

from __future__ import annotations

from collections.abc import Callable

from colossal_contracts import PlacementPolicy, TensorState, TierName

from ._books import Books
from ._chunk import Chunk
from ._pending import InFlightCount
from ._placement import Placement
from ._tier import UNLIMITED, Tier

__all__ = ["ManagerResident"]

ACC = TierName.ACCELERATOR


class ManagerResident:
    """Residency verbs and the states-only access; see the module docstring."""

    world_size: int  # the manager's
    policy: PlacementPolicy  # the manager's
    chunks: dict[int, Chunk]  # every chunk by id (the manager's)
    tiers: dict[TierName, Tier]  # the manager's (a property there)
    in_flight: InFlightCount  # the manager's
    _placement: Placement  # the manager's
    _moment: int  # the manager's
    _num_moments: int  # the manager's: moments of the longest step seen
    _steady: bool  # fully_resident() said yes and nothing changed since
    books: Books  # the manager's: records demand while tracking
    _finish: Callable[[Chunk], None]  # the collectives': finishes a chunk's collective
    _bind: Callable[[Chunk], None]  # the manager's: re-points a chunk's parameter views

    def _access_resident(self, by_chunk: dict[int, list[str]]) -> None:
        """``access`` when every chunk is gathered on the compute tier and fits: states only."""
        for cid, names in by_chunk.items():
            c = self.chunks[cid]
            for name in names:
                c.set_state(name, TensorState.COMPUTE)
        self.policy.on_access(list(by_chunk), self._moment)
        if self.books.tracking:
            self.books.note_demand()

    def _resident(self, by_chunk: dict[int, list[str]]) -> bool:
        for cid in by_chunk:
            c = self.chunks[cid]
            if c.tier is not ACC or not c.is_gathered:
                return False
        return self._steady or self.tiers[ACC].used_bytes <= self._placement.limit(self._moment)

    def fully_resident(self, headroom: int = 0) -> bool:
        """See [Note: resident fast path]; ``headroom``: compute-tier bytes that must stay free at
        every moment besides what is there now. Costs one pass over chunks and moments."""
        self._steady = self._fully_resident(headroom)
        return self._steady

    def _fully_resident(self, headroom: int) -> bool:
        if self.world_size > 1 or self.books.tracking or self.in_flight.now:
            return False
        policy = self.policy
        for c in self.chunks.values():
            if c.kind == "param" and (c.tier is not ACC or policy.evict_after_use(c.chunk_id)):
                return False
        acc = self.tiers[ACC]
        if acc.capacity_bytes >= UNLIMITED:
            return True
        need = acc.used_bytes + headroom
        return all(self._placement.limit(m) >= need for m in range(max(1, self._num_moments)))

    def move(self, chunk: Chunk | int, tier: TierName | str) -> None:
        """Move a chunk's shard to ``tier`` (releasing its gathered buffer if it leaves the compute
        tier). Raises ``CapacityError`` if ``tier`` is full, ``StateTransitionError`` if a tensor
        is in COMPUTE."""
        c = self.chunks[chunk.chunk_id if isinstance(chunk, Chunk) else chunk]
        tier = TierName(tier)
        self._steady = False
        self._finish(c)
        if tier is not ACC and c.world_size > 1 and c.is_gathered:
            self._placement.release_gathered(c)
        if tier is ACC:
            self._placement.make_room(
                self._placement.need_for_access(c, gather=False),
                self.chunks.values(),
                exclude={c.chunk_id},
                moment=self._moment,
                what=f"moving chunk {c.chunk_id}",
            )
        self._placement.move(c, tier)
        self._bind(c)

    def prefetch(self, horizon: int = 1) -> int:
        """Start copying chunks the policy says the next ``horizon`` moments need; returns how many.

        Needs a policy with ``upcoming`` (``AutoPolicy`` after warmup); never breaks the budget and
        evicts only chunks needed later than the one fetched.
        """
        next_use = self.policy.next_use
        issued, self._steady = 0, False
        for cid in self.policy.upcoming(self._moment, horizon):
            c = self.chunks[cid]
            if self._placement.prefetch(
                c,
                moment=self._moment,
                chunks=self.chunks.values(),
                target_use=next_use(cid, self._moment),
            ):
                issued += 1
        return issued
