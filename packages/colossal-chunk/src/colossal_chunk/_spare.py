"""Spare payloads: the CPU storage a move freed, reused by the next move of the same size.

[Note: spare payloads] A host or emulated-accelerator payload is its own fresh mapping
([Note: host payloads]), so a move between those tiers used to pay a page fault and a kernel
zero-fill for every page of the destination, then unmap the source: under a budget that makes
chunks move every step, the faults cost about as much as the copies. Every move frees a payload
of exactly the size it allocates, so the payload a move frees is kept as a spare (one per size
and dtype, or as many as fit in ``SPARE_BYTES``) and the next move of that size copies into it:
its pages are already mapped. Host memory then exceeds the tiers' accounting by at most one
payload per chunk size (a move held that much for a moment anyway: the destination is allocated
before the source is freed), or ``SPARE_BYTES`` for payloads smaller than that: under a quarter
budget small chunks move several at a time (stock-module GPT tiny on one rank at a quarter of
its resident bytes, 14 chunks of 1 MB: 126.5 ms a step with one spare per size, 122.2 with up
to eight, side by side).

A storage is kept only when nothing else can see it: no other tensor views it (its storage's use
count) and no other Python name holds the tensor; otherwise it is left to be freed as before.
A spare's values are whatever it held: only callers that overwrite the whole payload (a copy)
or zero what must be zero (a move without copy zeroes its padding) take one. CUDA memory and
pinned host memory are cached by their allocators already and never pass through here.
"""

from __future__ import annotations

import sys

import torch

from ._tier import Tier

__all__ = ["SparePayloads"]

_use_count = getattr(torch._C, "_storage_Use_Count", None)  # absent: nothing is ever kept
# references to a tensor while ``give`` inspects it: the caller's name, ``give``'s and
# ``_alone``'s arguments and ``getrefcount``'s
_GIVE_REFS = 4
SPARE_BYTES = 8 << 20  # spares of a size smaller than this: as many as fit ([Note: spare payloads])


class SparePayloads:
    """Spare 1-D CPU payloads by (numel, dtype): one of each, or as many as fit in
    ``spare_bytes``; see [Note: spare payloads]."""

    def __init__(self, enabled: bool = True, *, spare_bytes: int = 0) -> None:
        self.enabled = enabled and _use_count is not None
        self.spare_bytes = spare_bytes
        self._spare: dict[tuple[int, torch.dtype], list[torch.Tensor]] = {}

    @staticmethod
    def serves(tier: Tier) -> bool:
        """Whether ``tier``'s payloads are plain CPU mappings (host, emulated accelerator)."""
        return tier.store is None and tier.device.type == "cpu" and not tier.pin_memory

    def take(self, numel: int, dtype: torch.dtype) -> torch.Tensor | None:
        """A kept spare of ``numel`` ``dtype`` values (uninitialized), or None."""
        kept = self._spare.get((numel, dtype)) if self.enabled else None
        if not kept:
            return None
        spare = kept.pop()
        if not kept:
            del self._spare[(numel, dtype)]
        return spare

    def allocate(self, tier: Tier, key: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """A payload of ``numel`` ``dtype`` values on ``tier``: a spare (uninitialized) when one
        of that size is kept and the tier serves spares, else ``tier.allocate`` (does not
        reserve)."""
        if self.serves(tier):
            spare = self.take(numel, dtype)
            if spare is not None:
                return spare
        return tier.allocate(key, numel, dtype)

    def give(self, payload: torch.Tensor, tier: Tier) -> None:
        """Keep ``payload`` (just freed from ``tier``) as a spare if nothing else can see it and
        fewer of its size are kept than ``spare_bytes`` holds (at least one); otherwise drop the
        reference (it is freed with its last view). The caller must hold ``payload`` under one
        name only and drop it after this call."""
        if not self.enabled or not self.serves(tier) or payload.storage_offset() != 0:
            return
        nbytes = payload.nbytes
        if nbytes == 0 or payload.untyped_storage().nbytes() != nbytes:
            return
        key = (payload.numel(), payload.dtype)
        if len(self._spare.get(key, ())) >= max(1, self.spare_bytes // nbytes):
            return
        if _alone(payload, _GIVE_REFS):
            self._spare.setdefault(key, []).append(payload)

    def clear(self) -> None:
        """Drop every spare (their storage is freed)."""
        self._spare.clear()

    def tensors(self) -> list[torch.Tensor]:
        """The spares kept now (live CPU storages: a memory tracer counts them as model data)."""
        return [t for kept in self._spare.values() for t in kept]

    @property
    def nbytes(self) -> int:
        """Bytes held by spares now."""
        return sum(t.nbytes for t in self.tensors())


def _alone(t: torch.Tensor, refs: int) -> bool:
    """Whether nothing else holds ``t`` (Python references beyond the ``refs`` its caller
    counts; another thread's C++ reference shows as one of them) nor a view of its storage."""
    if sys.getrefcount(t) > refs or _use_count is None:
        return False
    # the tensor's own reference and the temporary storage object's: any other is a view
    return _use_count(t.untyped_storage()._cdata) == 2
