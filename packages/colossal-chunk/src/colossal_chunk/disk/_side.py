"""The disk side of ``Placement``: read-ahead, fault-in accounting, write-out of shards updated
in place, and the disk payloads kept for chunks read elsewhere ([Note: disk copies] in
``disk/_copies.py``).

``Placement`` holds one (``Placement.disk``), given its tiers, read-ahead window, kept disk
copies, spare payloads and rebind callback.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from colossal_contracts import TierName

from .._chunk import Chunk
from .._spare import SparePayloads
from .._tier import Tier
from ._copies import DiskCopies
from ._read_ahead import ReadAheadWindow
from ._store import DiskIOStats

__all__ = ["DiskSide", "payload_key"]

DISK = TierName.DISK


def payload_key(chunk: Chunk, tier: TierName) -> str:
    """The name of ``chunk``'s payload on ``tier`` (a file name on disk): unique among live chunks
    even while a re-pack's new chunks take the ids of old ones not yet given up ([Note:
    streaming re-pack])."""
    return f"{chunk.kind}-{chunk.chunk_id}.{id(chunk):x}@{tier.value}"  # one file per kind


class DiskSide:
    """What ``Placement`` does with the disk tier; see the module docstring."""

    def __init__(
        self,
        tiers: dict[TierName, Tier],
        read_ahead_window: ReadAheadWindow,
        disk_copies: DiskCopies,
        spares: SparePayloads,
        rebind: Callable[[Chunk], None],
    ) -> None:
        self.tiers, self.read_ahead_window = tiers, read_ahead_window
        self.disk_copies, self.spares, self._rebind = disk_copies, spares, rebind

    def read_ahead(self, chunk: Chunk) -> bool:
        """Start reading ``chunk``'s shard into memory if it lives on disk (for a use soon) and
        the read-ahead window has room for it; False when it has not ([Note: read-ahead
        window])."""
        if chunk.tier is not DISK or chunk.dead:  # nothing to read ([Note: dead shards])
            return True
        if not self.read_ahead_window.admit(chunk):
            return False
        self.tiers[DISK].read_ahead(payload_key(chunk, DISK))
        return True

    def used(self, chunk: Chunk) -> None:
        """``chunk``'s shard is about to be read where it lives (copied off, or updated in
        place): on disk, counted as faulted in unless it was read ahead ([Note: disk
        fault-ins] in ``colossal_chunk/_tier.py``)."""
        if chunk.tier is DISK:
            self.tiers[DISK].used(payload_key(chunk, DISK), chunk.shard_bytes)

    def finish_read(self, chunk: Chunk) -> None:
        """``chunk``'s shard is read next, on this thread: on disk, its read-ahead not taken up
        by the reader yet is done here ([Note: disk read-ahead and write-behind])."""
        if chunk.tier is DISK:
            self.tiers[DISK].finish_read(payload_key(chunk, DISK))

    def written(self, chunk: Chunk) -> None:
        """``chunk``'s shard was written in place: if it lives on disk, start writing it out
        (its pages leave this process's memory now)."""
        self.disk_copies.drop(payload_key(chunk, DISK))  # no longer the chunk's values
        if chunk.tier is DISK and chunk.shard is not None:
            self.read_ahead_window.drop(chunk)
            self.tiers[DISK].write_behind(payload_key(chunk, DISK), chunk.shard)

    def read_only(self, chunk: Chunk) -> None:
        """``chunk``'s shard was only read in place: if it lives on disk, its pages leave this
        process's memory with nothing written ([Note: reads let go] in ``disk/_store.py``)."""
        if chunk.tier is DISK and chunk.shard is not None:
            self.read_ahead_window.drop(chunk)
            self.tiers[DISK].let_go(payload_key(chunk, DISK), chunk.shard)

    def stage(self, chunk: Chunk) -> torch.Tensor | None:
        """If ``chunk`` lives on disk, make a host copy of its shard the shard and return the
        payload's mapping (for ``unstage``); None, changing nothing, elsewhere ([Note: staged
        updates] in ``disk/_store.py``)."""
        if chunk.tier is not DISK or chunk.shard is None or chunk.shard.numel() == 0:
            return None
        copy = self.tiers[DISK].stage(payload_key(chunk, DISK), chunk.shard)
        return chunk.replace_shard(copy, copy=False)

    def unstage(self, chunk: Chunk, mapping: torch.Tensor, *, write: bool) -> None:
        """Give ``chunk`` its payload's ``mapping`` back as its shard; with ``write``, the host
        copy's values are written into the payload first (else they are dropped)."""
        copy = chunk.replace_shard(mapping, copy=False)
        if write:
            self.tiers[DISK].unstage(payload_key(chunk, DISK), copy)

    def disk_io(self) -> DiskIOStats | None:
        """Background disk I/O so far (None without a disk tier)."""
        disk = self.tiers.get(DISK)
        return None if disk is None or disk.store is None else disk.store.io_stats()

    def back_to_disk(self, chunk: Chunk) -> None:
        """Move ``chunk``'s shard to disk by mapping its kept payload again: nothing is copied
        or written ([Note: disk copies])."""
        kept = self.disk_copies.reuse(payload_key(chunk, DISK), chunk.shard_numel, chunk.dtype)
        self.take_kept(chunk, kept, DISK)

    def take_kept(self, chunk: Chunk, kept: torch.Tensor, dst: TierName) -> None:
        """Make ``kept``, an unchanged copy of ``chunk``'s shard held on ``dst``, its shard: the
        payload it leaves goes back to the spares, nothing is copied or written."""
        old = chunk.replace_shard(kept, copy=False)
        del kept  # the chunk holds the only reference
        self._rebind(chunk)
        s = self.tiers[chunk.current_tier]
        self.spares.give(old, s)
        del old
        self.leave(chunk, s, copied=False)
        chunk.tier = dst

    def leave(self, chunk: Chunk, src: Tier, *, copied: bool) -> None:
        """``chunk``'s shard left ``src``: free its payload there, or, when it was copied off
        disk and the owner keeps such chunks' disk payloads, keep it ([Note: disk copies])."""
        key = payload_key(chunk, src.name)
        if src.name is DISK:
            self.read_ahead_window.drop(chunk)
            if copied and self.disk_copies.takes(chunk):
                self.disk_copies.hold(key, chunk.shard_bytes, frozen=chunk.frozen)
                return
        src.free(chunk.shard_bytes)
        src.discard(key)
