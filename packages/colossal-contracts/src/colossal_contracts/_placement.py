"""Protocols for memory tiers and the placement policies that move chunks between them."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import torch

from ._memory import MemStatsSource, TierName

__all__ = ["ChunkInfo", "MemoryTier", "PlacementPolicy"]


@runtime_checkable
class MemoryTier(Protocol):
    """A place chunks can live: a name, a torch device and a byte capacity.

    Invariant: ``used_bytes <= capacity_bytes`` at every moment; the owner enforces it.
    """

    name: TierName
    device: torch.device
    capacity_bytes: int
    emulated: bool

    @property
    def used_bytes(self) -> int:
        """Bytes of chunk payloads held now."""
        ...


@runtime_checkable
class ChunkInfo(Protocol):
    """What a policy may know about a chunk when it chooses what to evict."""

    chunk_id: int
    num_bytes: int
    tier: TierName
    pinned: bool
    """True while any of its tensors is in COMPUTE: such a chunk may not be evicted."""


@runtime_checkable
class PlacementPolicy(Protocol):
    """Decides which chunks leave the compute tier when room is needed, and (through the hooks
    below, whose defaults do nothing) how much room there is and what to fetch early.

    [Note: policy hooks] A policy subclasses this class and overrides what it needs; the chunk
    manager and ``simulate_policy`` call every hook directly, so the defaults are the behaviour
    of a policy that knows nothing beyond ``choose_evictions``.

    ``choose_evictions`` returns chunk ids whose bytes add up to at least ``needed_bytes`` (or
    every evictable chunk, when that is not enough: the caller then raises ``CapacityError``).
    """

    name: str

    def choose_evictions(
        self, candidates: Sequence[ChunkInfo], needed_bytes: int, *, moment: int
    ) -> list[int]:
        """Ids of the chunks to move off the compute tier, in the order to move them."""
        ...

    def bind(self, context: Any) -> None:
        """Once chunks exist (and after a re-pack): which chunks there are, which chunk holds
        each parameter name, the compute tier's capacity (colossal-chunk's ``PolicyContext``)."""
        return None

    def update(self, stats: MemStatsSource) -> None:
        """A warmup step's statistics (compute order and non-model bytes per moment)."""
        return None

    def on_moment(self, moment: int) -> None:
        """The step reached ``moment`` ([Note: moments])."""
        return None

    def on_access(self, chunk_ids: Sequence[int], moment: int) -> None:
        """These chunks were just made ready for compute."""
        return None

    def model_budget(self, capacity: int, moment: int) -> int:
        """Bytes chunks may use on the compute tier at ``moment``."""
        return capacity

    def evict_after_use(self, chunk_id: int) -> bool:
        """Move the chunk off the compute tier as soon as it is released."""
        return False

    def upcoming(self, moment: int, horizon: int) -> list[int]:
        """Chunks the next ``horizon`` moments use, soonest first (what to prefetch)."""
        return []

    def next_use(self, chunk_id: int, moment: int) -> float:
        """The moment the chunk is next needed after ``moment`` (inf: unknown)."""
        return math.inf
