"""Spare payloads: the CPU storage a move freed, reused by the next move of the same size.

[Note: spare payloads] A host or emulated-accelerator payload is its own fresh mapping
([Note: host payloads]), so a move between those tiers used to pay a page fault and a kernel
zero-fill for every page of the destination, then unmap the source: under a budget that makes
chunks move every step, the faults cost about as much as the copies. Every move frees a payload
of exactly the size it allocates, so the payload a move frees is kept as a spare (one per size
and dtype) and the next move of that size copies into it: its pages are already mapped. Host
memory then exceeds the tiers' accounting by at most one payload per chunk size (a move held
that much for a moment anyway: the destination is allocated before the source is freed).

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
# references to the tensor while ``give`` inspects it: the caller's name, the argument, and
# ``getrefcount``'s own argument
_GIVE_REFS = 3


class SparePayloads:
    """At most one spare 1-D payload per (numel, dtype); see [Note: spare payloads]."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled and _use_count is not None
        self._spare: dict[tuple[int, torch.dtype], torch.Tensor] = {}

    @staticmethod
    def serves(tier: Tier) -> bool:
        """Whether ``tier``'s payloads are plain CPU mappings (host, emulated accelerator)."""
        return tier.store is None and tier.device.type == "cpu" and not tier.pin_memory

    def allocate(self, tier: Tier, key: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """A payload of ``numel`` ``dtype`` values on ``tier``: a spare (uninitialized) when one
        of that size is kept and the tier serves spares, else ``tier.allocate`` (does not
        reserve)."""
        if self.enabled and self.serves(tier):
            spare = self._spare.pop((numel, dtype), None)
            if spare is not None:
                return spare
        return tier.allocate(key, numel, dtype)

    def give(self, payload: torch.Tensor, tier: Tier) -> None:
        """Keep ``payload`` (just freed from ``tier``) as a spare if nothing else can see it and
        none of its size is kept; otherwise drop the reference (it is freed with its last view).
        The caller must hold ``payload`` under one name only and drop it after this call."""
        if not self.enabled or not self.serves(tier) or payload.storage_offset() != 0:
            return
        k = (payload.numel(), payload.dtype)
        if k in self._spare or sys.getrefcount(payload) > _GIVE_REFS:
            return
        storage = payload.untyped_storage()
        # the payload's own reference and ``storage``'s: any other is a view someone holds
        use_count = _use_count
        if use_count is None:  # enabled says it is there
            return
        if use_count(storage._cdata) != 2 or storage.nbytes() != payload.nbytes:
            return
        self._spare[k] = payload

    def clear(self) -> None:
        """Drop every spare (their mappings are unmapped)."""
        self._spare.clear()

    def tensors(self) -> list[torch.Tensor]:
        """The spares kept now (live CPU storages: a memory tracer counts them as model data)."""
        return list(self._spare.values())

    @property
    def nbytes(self) -> int:
        """Bytes held by spares now."""
        return sum(t.nbytes for t in self._spare.values())
