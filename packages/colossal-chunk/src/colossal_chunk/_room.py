"""Room on the compute tier: the budget at a moment, and evictions that make room for an access
(the policy's choice) or for a prefetch (only chunks needed later than the one fetched).

``Placement`` holds one (``Placement.room``); it reads the placement's tiers, policy and budget,
and the chunks' residency, and evicts through the placement's ``offload``.

[Note: warmup loan] The automatic policy's warmup step measures what a step needs; before it ends
nothing is known to size chunks by. So, when the policy was built with ``warmup_loan``, an access
of the warmup that finds no room even with every other chunk moved off is lent what is missing (beyond the capacity, for the
warmup only) instead of refusing with a figure that knows nothing of the step's later moments.
The loan ends at the first access after the warmup; then the feasibility rule (colossal-zero's
``gemini/_fit.py``) shrinks the chunks until the budget holds every moment, or refuses right after
the warmup with the smallest budget that trains, computed from the measured peaks. On an emulated
tier the loan is bookkeeping; on a real device the warmup holds up to the loan beyond the budget.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable

from colossal_contracts import CapacityError, PlacementPolicy, PolicyError, TierName

from ._chunk import Chunk
from ._tier import Tier
from .policies._auto import AutoPolicy
from .policies._base import SimpleChunkInfo

__all__ = ["ComputeRoom"]

ACC, HOST = TierName.ACCELERATOR, TierName.HOST


class ComputeRoom:
    """The compute tier's room: what chunks hold there, and eviction under its budget; see the
    module docstring."""

    def __init__(
        self,
        tiers: dict[TierName, Tier],
        policy: PlacementPolicy,
        budget: Callable[[int], int],
        offload: Callable[[Chunk], int],
    ) -> None:
        """``budget(moment)``: the policy's model-data budget; ``offload(chunk)`` moves a chunk
        off the compute tier and returns the bytes freed (the placement's)."""
        self.tiers, self.policy = tiers, policy
        self._budget, self._offload = budget, offload

    def acc_bytes(self, chunk: Chunk) -> int:
        """Bytes ``chunk`` holds on the compute tier now (shard there, plus a gathered buffer)."""
        n = chunk.shard_bytes if chunk.tier is ACC or chunk.prefetch is not None else 0
        if chunk.world_size > 1 and chunk.is_gathered:
            n += chunk.full_bytes
        return n

    def need_for_access(self, chunk: Chunk, *, gather: bool) -> int:
        """Bytes to add on the compute tier to make ``chunk`` ready for compute (its shard is
        not brought in when it is gathered from the host: ``from_host``)."""
        n = 0 if chunk.tier is ACC or chunk.prefetch is not None else chunk.shard_bytes
        if gather and chunk.world_size > 1:
            if chunk.is_gathered:
                return 0 if chunk.tier is HOST else n
            n += chunk.full_bytes
        return n

    def from_host(self, chunk: Chunk, moment: int) -> bool:
        """Whether sharded ``chunk`` is (to be) gathered straight from its host shard ([Note:
        gathers from the host] in ``_collectives.py``): it is so already, or its shard and
        gathered buffer together do not fit in ``moment``'s room beside what is there."""
        if chunk.world_size == 1 or chunk.tier is not HOST or chunk.prefetch is not None:
            return False
        if chunk.is_gathered:
            return True
        need = chunk.shard_bytes + chunk.full_bytes
        return self.tiers[ACC].used_bytes + need > self.limit(moment)

    def demand_bytes(self, chunks: Iterable[Chunk]) -> int:
        """Compute-tier bytes of the chunks that may not leave it now (tensors in COMPUTE or
        awaiting reduction) and of kept chunks: what no eviction can free."""
        return sum(self.acc_bytes(c) for c in chunks if not c.movable or c.kept)

    def limit(self, moment: int) -> int:
        acc = self.tiers[ACC]
        if acc.lent_bytes and not self._warming():
            acc.end_loan()  # [Note: warmup loan]
        return min(acc.capacity_bytes, self._budget(moment))

    def _warming(self) -> bool:
        """True while the warmup step of an automatic policy that lends runs ([Note: warmup
        loan])."""
        policy = self.policy
        return isinstance(policy, AutoPolicy) and policy.warmup_loan and not policy.warm

    def make_room(
        self,
        needed: int,
        chunks: Iterable[Chunk],
        *,
        exclude: Collection[int],
        moment: int,
        what: str,
    ) -> None:
        """Evict chunks the policy picks until ``needed`` more bytes fit on the compute tier."""
        acc = self.tiers[ACC]
        limit = self.limit(moment)
        short = acc.used_bytes + needed - limit
        if short <= 0:
            return
        chunks = list(chunks)
        acc_bytes = self.acc_bytes
        cands: dict[int, Chunk] = {}
        infos = []
        for c in chunks:  # the cheapest test first: most chunks hold nothing on the compute tier
            n = acc_bytes(c)
            if n and c.chunk_id not in exclude and not c.kept and c.movable:
                cands[c.chunk_id] = c
                infos.append(SimpleChunkInfo(c.chunk_id, n, ACC, False))
        for cid in self.policy.choose_evictions(infos, short, moment=moment):
            if cid not in cands:
                raise PolicyError(
                    f"policy {self.policy.name!r} chose chunk {cid}, which is not an eviction "
                    "candidate; a policy must return ids from the candidates it is given"
                )
            short -= self._offload(cands.pop(cid))
            if short <= 0:
                return
        for c in list(cands.values()):  # the policy chose too little: take the rest in order
            short -= self._offload(c)
            if short <= 0:
                return
        held = acc.used_bytes
        if self._warming():  # [Note: warmup loan]
            acc.lend(held + needed - acc.capacity_bytes)
            return
        reserve = most = acc.capacity_bytes - limit
        policy = self.policy
        if isinstance(policy, AutoPolicy):  # the unclipped reserve: a clipped one names too little
            reserve = max(reserve, policy.non_model_reserve(moment))
            most = max(reserve, policy.max_non_model_reserve())
        # this access alone needs held + needed; later ones may need more, so the budget named
        # first is one under which nothing ever waits for room: every chunk resident at once,
        # beside the largest reserve of any moment
        whole = sum(c.shard_bytes + (c.full_bytes if c.world_size > 1 else 0) for c in chunks)
        raise CapacityError(
            f"{what} needs {needed:,} bytes on the {acc.name.value} tier"
            f"{' (emulated)' if acc.emulated else ''}, whose model-data budget is {limit:,} bytes "
            f"(capacity {acc.capacity_bytes:,} minus {reserve:,} reserved for non-model data), "
            f"but {held:,} bytes are held by chunks in use, awaiting reduction or kept there, "
            f"so at most {max(0, limit - held):,} can be freed ({_holders(chunks, acc_bytes, exclude)}). "
            f"Raise accelerator_bytes to "
            f"{whole + most:,} (every chunk fits: trains without eviction; this access alone "
            f"needs at least {held + needed + reserve:,}), use a smaller chunk_numel, or release "
            "tensors before accessing more."
        )

    def room_before(
        self,
        needed: int,
        *,
        moment: int,
        target_use: float,
        chunks: Iterable[Chunk],
        skip: Chunk,
    ) -> bool:
        """Make ``needed`` more bytes fit in ``moment``'s room by evicting only chunks (other than
        ``skip``) whose next use comes after ``target_use``, furthest first; False, with nothing
        evicted, when those chunks cannot free enough."""
        short = self.tiers[ACC].used_bytes + needed - self.limit(moment)
        if short <= 0:
            return True
        next_use, acc_bytes = self.policy.next_use, self.acc_bytes
        later, free = [], 0
        for c in chunks:  # the cheapest test first, as in make_room
            n = acc_bytes(c)
            if (
                n
                and c is not skip
                and not c.kept
                and c.movable
                and (use := next_use(c.chunk_id, moment)) > target_use
            ):
                later.append((use, c))
                free += n
        if free < short:
            return False
        later.sort(key=lambda uc: -uc[0])
        for _, c in later:
            if short <= 0:
                break
            short -= self._offload(c)
        return True


def _holders(
    chunks: list[Chunk], acc_bytes: Callable[[Chunk], int], exclude: Collection[int]
) -> str:
    """Who holds the compute tier's bytes that an eviction could not free, for the refusal."""
    parts = []
    for c in chunks:
        n = acc_bytes(c)
        if c.prefetch is not None:
            parts.append(f"chunk {c.chunk_id} ({c.kind}) prefetch in flight")
        elif not n:
            continue
        elif c.chunk_id in exclude:
            parts.append(f"chunk {c.chunk_id} ({c.kind}) {n:,} being accessed")
        elif c.kept:
            parts.append(f"chunk {c.chunk_id} ({c.kind}) {n:,} kept")
        elif not c.movable:
            parts.append(f"chunk {c.chunk_id} ({c.kind}) {n:,} in use")
    return "held: " + (", ".join(parts) if parts else "none by chunks")
