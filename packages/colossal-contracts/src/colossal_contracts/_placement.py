"""Protocols for memory tiers and the placement policies that move chunks between them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import torch

from ._memory import TierName

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
    """Decides which chunks leave the compute tier when room is needed.

    ``choose_evictions`` returns chunk ids whose bytes add up to at least ``needed_bytes`` (or
    every evictable chunk, when that is not enough: the caller then raises ``CapacityError``).
    """

    name: str

    def choose_evictions(
        self, candidates: Sequence[ChunkInfo], needed_bytes: int, *, moment: int
    ) -> list[int]:
        """Ids of the chunks to move off the compute tier, in the order to move them."""
        ...
