"""Disk payloads kept while their chunk is read elsewhere, so that going back unchanged writes
nothing.

[Note: disk copies] A forward or backward pass reads parameter chunks off disk and, when the
room runs out, evicts them back: a write of the same bytes the disk already holds (about 30% of
a step's disk writes, measured on GPT 20 x 512 under 128 MiB of host). While the owner says
that chunks of some kinds are not written (``keep``: Gemini's runtime says so for fp32
parameter chunks on one rank, from the start of a forward or a backward to its end: FSDP2
makes the same assumption when it frees an unsharded parameter without writing it back), a
chunk of such a kind moved off disk by a copy leaves its disk payload where it is, still
counted on the disk tier; moved back to disk, it maps that payload again instead of writing
(``Placement.move``). A chunk's copy is dropped (its slot freed) when the owner ends the
window (``keep`` with no kinds), when the chunk is written in place or forgotten, and, oldest
first, whenever the disk tier needs the room for another payload: a copy is a cache, never a
reason to refuse a move. The payload mapped again counts as not read ahead (its pages may have
left the page cache): a use issues a read-ahead as for any payload on disk. Frozen chunks
(colossal-chunk's [Note: frozen chunks]) are never written: theirs are kept whatever the
owner's kinds, and outlive the end of its window.
"""

from __future__ import annotations

import torch

from colossal_contracts import InternalError

from .._chunk import Chunk
from .._tier import Tier
from ._store import DiskStore

__all__ = ["DiskCopies"]


class DiskCopies:
    """The disk payloads kept for chunks that live on another tier now; see [Note: disk copies].

    Invariant: every key held names a payload of the disk tier whose bytes are counted in its
    ``used_bytes``, and whose chunk has the same values (nothing wrote it since it was read).
    """

    kinds: frozenset[str]  # chunk kinds whose disk payloads are kept (empty: none)
    reused_bytes: int  # bytes moved back to disk by mapping a kept payload: writes saved

    def __init__(self, disk: Tier | None):
        self._disk = disk
        self.kinds = frozenset()
        self._held: dict[str, int] = {}  # key -> payload bytes, oldest first
        self._frozen: set[str] = set()  # keys of frozen chunks' payloads among them
        self.reused_bytes = 0

    def keep(self, kinds: frozenset[str]) -> None:
        """Keep the disk payloads of chunks of ``kinds`` read off disk from now on; with no
        kinds, drop every payload kept (the owner may write those chunks again)."""
        self.kinds = kinds if self._disk is not None else frozenset()
        if not self.kinds:
            self.drop_all()

    def takes(self, chunk: Chunk) -> bool:
        """Whether ``chunk``, read off disk now, keeps its disk payload."""
        return chunk.frozen or chunk.kind in self.kinds

    def hold(self, key: str, nbytes: int, *, frozen: bool = False) -> None:
        """Keep ``key``'s disk payload (its chunk was just copied off it)."""
        self._held[key] = nbytes
        if frozen:
            self._frozen.add(key)

    def has(self, key: str) -> bool:
        return key in self._held

    def reuse(self, key: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """``key``'s kept payload, mapped again as its chunk's shard (no longer kept: it is in use)."""
        nbytes = self._held.pop(key)
        self._frozen.discard(key)
        self.reused_bytes += nbytes
        return self._store().remap(key, numel, dtype)

    def drop(self, key: str) -> None:
        """Free ``key``'s kept payload, if kept."""
        nbytes = self._held.pop(key, None)
        self._frozen.discard(key)
        disk = self._disk
        if nbytes is not None and disk is not None:  # (held payloads imply a disk tier)
            disk.free(nbytes)
            disk.discard(key)

    def drop_all(self) -> None:
        """Drop every payload kept but frozen chunks' (their values never change)."""
        for key in [k for k in self._held if k not in self._frozen]:
            self.drop(key)

    def make_room(self, nbytes: int) -> None:
        """Drop kept payloads, oldest first, until ``nbytes`` fit on the disk tier (or none is
        left)."""
        disk = self._disk
        while self._held and disk is not None and disk.free_bytes < nbytes:
            self.drop(next(iter(self._held)))

    def _store(self) -> DiskStore:
        if self._disk is None or self._disk.store is None:
            raise InternalError("no disk tier: nothing can be kept on it")
        return self._disk.store
