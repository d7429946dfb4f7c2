"""What every placement policy shares: the facts it is bound to, and LRU eviction.

Hooks and their no-op defaults are the contract's ([Note: policy hooks] in
``colossal_contracts.PlacementPolicy``); every policy here subclasses it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from colossal_contracts import ChunkInfo, PlacementPolicy, TierName

__all__ = ["ChunkSummary", "LruPolicy", "PolicyContext", "SimpleChunkInfo"]


@dataclass(frozen=True)
class ChunkSummary:
    """A registered chunk as policies see it.

    Attributes:
        chunk_id: its id in the manager.
        kind: "param" for parameter chunks, else the parallel kind ("grad", "master", ...).
        num_bytes: bytes of its payload at rest (this rank's shard).
    """

    chunk_id: int
    kind: str
    num_bytes: int


@dataclass(frozen=True)
class PolicyContext:
    """What a policy is told once the chunks exist.

    Attributes:
        chunks: every chunk, in id order.
        chunk_of: the parameter chunk that holds each parameter name.
        capacity_bytes: the compute tier's byte budget.
    """

    chunks: tuple[ChunkSummary, ...]
    chunk_of: Mapping[str, int] = field(default_factory=dict)
    capacity_bytes: int = 0


@dataclass(frozen=True)
class SimpleChunkInfo:
    """A plain ``colossal_contracts.ChunkInfo``."""

    chunk_id: int
    num_bytes: int
    tier: TierName = TierName.ACCELERATOR
    pinned: bool = False


class LruPolicy(PlacementPolicy):
    """Evicts the least recently used chunk first; needs no trace. The fallback of other policies.

    Attributes:
        name: "lru".
    """

    name = "lru"

    def __init__(self) -> None:
        self._last_use: dict[int, int] = {}
        self._clock = 0

    def on_access(self, chunk_ids: Sequence[int], moment: int) -> None:
        for cid in chunk_ids:
            self._clock += 1
            self._last_use[cid] = self._clock

    def _lru_order(self, candidates: Sequence[ChunkInfo]) -> list[ChunkInfo]:
        return sorted(candidates, key=lambda c: (self._last_use.get(c.chunk_id, 0), c.chunk_id))

    def choose_evictions(
        self, candidates: Sequence[ChunkInfo], needed_bytes: int, *, moment: int
    ) -> list[int]:
        return _take(self._lru_order(candidates), needed_bytes)


def _take(ordered: Sequence[ChunkInfo], needed_bytes: int) -> list[int]:
    """Ids from the front of ``ordered`` until their bytes reach ``needed_bytes``."""
    out, got = [], 0
    for info in ordered:
        if got >= needed_bytes:
            break
        if info.pinned:
            continue
        out.append(info.chunk_id)
        got += info.num_bytes
    return out
