"""Tensors autograd saves from parameters, kept as places in a chunk instead of storage.

[Note: saved parameter views] An operator's backward may need a parameter (or a view of it, such
as the transposed weight a matmul saves). Saving it as is would keep the chunk storage it points
at alive after the chunk moved or was released, memory that no tier accounts for. While an
operator that reads parameters runs, saved tensors that share storage with one of its chunks are
packed as (chunk id, offset, shape, stride) and unpacked as a view of that chunk's current
gathered buffer. ``_PreBackward`` has re-accessed the operator's parameters before its backward
unpacks them, so the buffer is on the compute tier and gathered then.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch.autograd.graph import saved_tensors_hooks

from colossal_chunk import Chunk, ChunkManager

__all__ = ["saved_param_views"]


class _Place:
    __slots__ = ("chunk_id", "offset", "shape", "stride")

    def __init__(self, chunk_id: int, offset: int, shape: torch.Size, stride: tuple[int, ...]):
        self.chunk_id, self.offset, self.shape, self.stride = chunk_id, offset, shape, stride


def saved_param_views(manager: ChunkManager, chunks: Iterable[Chunk]) -> saved_tensors_hooks:
    """Hooks for one operator whose parameters live in ``chunks`` (gathered now)."""
    by_ptr = {c.full.untyped_storage().data_ptr(): c for c in chunks if c.full is not None}

    def pack(t: torch.Tensor) -> Any:
        try:
            ptr = t.untyped_storage().data_ptr()
        except (RuntimeError, NotImplementedError):
            return t
        c = by_ptr.get(ptr)
        if c is None or t.device != c.full.device:  # type: ignore[union-attr]
            return t
        off = t.storage_offset() - c.full.storage_offset()  # type: ignore[union-attr]
        return _Place(c.chunk_id, off, t.shape, t.stride())

    def unpack(x: Any) -> torch.Tensor:
        if not isinstance(x, _Place):
            return x
        full = manager.chunks[x.chunk_id].full
        if full is None:
            raise RuntimeError(
                f"chunk {x.chunk_id} is not gathered when a backward needs a parameter saved "
                "from it; this is a bug in colossal-zero's operator hooks"
            )
        return full.as_strided(x.shape, x.stride, full.storage_offset() + x.offset)

    return saved_tensors_hooks(pack, unpack)
