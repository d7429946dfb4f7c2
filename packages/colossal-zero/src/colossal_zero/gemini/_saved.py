"""Tensors autograd saves from parameters, kept as places in a chunk instead of storage.

[Note: saved parameter views] An operator's backward may need a parameter (or a view of it, such
as the transposed weight a matmul saves). Saving it as is would keep the chunk storage it points
at alive after the chunk moved or was released, memory that no tier accounts for. While an
operator that reads parameters runs, saved tensors that share storage with one of its chunks are
packed as (chunk id, offset, shape, stride) and unpacked as a view of that chunk's current
gathered buffer. ``_PreBackward`` has re-accessed the operator's parameters before its backward
unpacks them, so the buffer is on the compute tier and gathered then.

[Note: checkpointed regions] Inside ``torch.utils.checkpoint`` (non-reentrant), checkpoint's own
saved-tensor hooks are installed when an operator runs. The hooks here compose with them: a
parameter view is still packed as a place (checkpoint never sees it, in forward or in its
recompute, so both count the same tensors and no parameter storage is held), every other tensor
goes to checkpoint's pack hook. Unpacking such a tensor is what makes checkpoint recompute the
region, in backward, where no access mode runs; so checkpoint's unpack runs inside ``replay``
(the runtime's access mode): the recomputed operators access their parameters as in forward,
and their saved parameter views are places again. Operators that read no parameter get
``recompute_hooks`` for the same reason (any of their tensors may be the first one unpacked).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch._C._autograd import _top_saved_tensors_default_hooks
from torch.autograd.graph import saved_tensors_hooks

from colossal_chunk import Chunk, ChunkManager
from colossal_contracts import InternalError

__all__ = ["recompute_hooks", "saved_param_views"]

Replay = Callable[[], AbstractContextManager[Any]]
_Hooks = tuple[Callable[[torch.Tensor], Any], Callable[[Any], torch.Tensor]]


class _Place:
    __slots__ = ("chunk_id", "offset", "shape", "stride")

    def __init__(self, chunk_id: int, offset: int, shape: torch.Size, stride: tuple[int, ...]):
        self.chunk_id, self.offset, self.shape, self.stride = chunk_id, offset, shape, stride


class _Outer:
    """What an outer hook (checkpoint's) packed; unpacked by that hook, inside ``replay``."""

    __slots__ = ("packed", "unpack")

    def __init__(self, packed: Any, unpack: Callable[[Any], torch.Tensor]):
        self.packed, self.unpack = packed, unpack


def _outer() -> _Hooks | None:
    return _top_saved_tensors_default_hooks(False)


def _unpack_outer(x: _Outer, replay: Replay) -> torch.Tensor:
    with replay():  # [Note: checkpointed regions]: checkpoint may recompute here
        return x.unpack(x.packed)


def saved_param_views(
    manager: ChunkManager, chunks: Iterable[Chunk], replay: Replay
) -> saved_tensors_hooks:
    """Hooks for one operator whose parameters live in ``chunks`` (gathered now)."""
    by_ptr = {c.full.untyped_storage().data_ptr(): c for c in chunks if c.full is not None}
    outer = _outer()

    def pack(t: torch.Tensor) -> Any:
        try:
            ptr = t.untyped_storage().data_ptr()
        except (RuntimeError, NotImplementedError):
            ptr = None
        c = by_ptr.get(ptr) if ptr is not None else None
        full = c.full if c is not None else None
        if c is None or full is None or t.device != full.device:
            return t if outer is None else _Outer(outer[0](t), outer[1])
        off = t.storage_offset() - full.storage_offset()
        return _Place(c.chunk_id, off, t.shape, t.stride())

    def unpack(x: Any) -> torch.Tensor:
        if isinstance(x, _Outer):
            return _unpack_outer(x, replay)
        if not isinstance(x, _Place):
            return x
        full = manager.groups[x.chunk_id].param.full
        if full is None:
            raise InternalError(
                f"chunk {x.chunk_id} is not gathered when a backward needs a parameter saved "
                "from it; this is a bug in colossal-zero's operator hooks"
            )
        return full.as_strided(x.shape, x.stride, full.storage_offset() + x.offset)

    return saved_tensors_hooks(pack, unpack)


def recompute_hooks(replay: Replay) -> saved_tensors_hooks | None:
    """For an operator that reads no parameter: None outside checkpointed regions (nothing to
    do), else checkpoint's hooks with their unpack run inside ``replay``."""
    outer = _outer()
    if outer is None:
        return None
    pack_outer, unpack_outer = outer

    def pack(t: torch.Tensor) -> Any:
        return _Outer(pack_outer(t), unpack_outer)

    def unpack(x: _Outer) -> torch.Tensor:
        return _unpack_outer(x, replay)

    return saved_tensors_hooks(pack, unpack)
