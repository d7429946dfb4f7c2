"""Host payloads of frozen chunks kept while their chunk is on the compute tier, so that
evicting it drops the compute-tier copy instead of copying it back.

[Note: host copies] A frozen chunk (colossal-chunk's [Note: frozen chunks]) is never written,
so its host payload stays equal to it while the chunk computes on the accelerator. A copy of
it onto the compute tier therefore leaves the host payload where it is, still counted on the
host tier; evicted, the chunk takes that payload back as its shard and the compute-tier one is
freed: nothing crosses the bus and nothing is written (the disk tier's counterpart is [Note:
disk copies]). A kept payload is a cache: it is dropped, oldest first, when the host tier needs
the room for another payload that cannot go to disk instead (with a disk tier, a payload that
finds no room on the host goes there, and the copies stay), and when its chunk is written in
place (a checkpoint loaded into it) or forgotten.
"""

from __future__ import annotations

import torch

from colossal_contracts import TierName

from ._tier import Tier

__all__ = ["HostCopies", "down"]


class HostCopies:
    """Kept host payloads of frozen chunks that live on the compute tier now; see [Note: host
    copies]. Invariant: every payload held is counted in the host tier's ``used_bytes`` and
    has its chunk's values."""

    reused_bytes: int  # bytes evicted by taking a kept payload back: copies saved

    def __init__(self, host: Tier):
        self._host = host
        self._held: dict[int, torch.Tensor] = {}  # chunk id -> host payload, oldest first
        self.reused_bytes = 0

    def hold(self, chunk_id: int, payload: torch.Tensor) -> None:
        """Keep ``payload`` (the chunk's host shard, just copied to the compute tier)."""
        self._held[chunk_id] = payload

    def has(self, chunk_id: int) -> bool:
        return chunk_id in self._held

    def reuse(self, chunk_id: int) -> torch.Tensor:
        """The kept payload of ``chunk_id``, given back as its shard (no longer kept)."""
        payload = self._held.pop(chunk_id)
        self.reused_bytes += payload.numel() * payload.element_size()
        return payload

    def drop(self, chunk_id: int) -> None:
        """Free the payload kept for ``chunk_id``, if any."""
        payload = self._held.pop(chunk_id, None)
        if payload is not None:
            self._host.free(payload.numel() * payload.element_size())

    def make_room(self, nbytes: int) -> None:
        """Drop kept payloads, oldest first, until ``nbytes`` fit on the host tier (or none is
        left)."""
        while self._held and self._host.free_bytes < nbytes:
            self.drop(next(iter(self._held)))

    def tensors(self) -> list[torch.Tensor]:
        """The kept payloads (model data a memory tracer counts)."""
        return list(self._held.values())

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._held.values())


def down(src: TierName, dst: TierName) -> bool:
    """Whether a move from ``src`` to ``dst`` goes to a lower tier (accelerator > host > disk)."""
    order = (TierName.ACCELERATOR, TierName.HOST, TierName.DISK)
    return order.index(dst) > order.index(src)
