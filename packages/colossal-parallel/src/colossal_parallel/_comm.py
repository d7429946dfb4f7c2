"""``CountedComm``: the collectives of the package, addressed by mesh axis and counted.

Each method is functional: it returns a new tensor and leaves its argument untouched, so autograd
functions may call it on saved tensors. Shape errors raise ``ConfigError`` before any
communication. Bytes are counted per [Note: counted bytes] in ``_counter.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from colossal_contracts import ConfigError

from ._counter import CommCounter

if TYPE_CHECKING:
    from ._mesh import ProcessMesh

__all__ = ["CountedComm"]

ReduceOp = dist.ReduceOp
# torch >= 2.13 renames the flat-tensor collectives; older releases only have the old names.
_all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_flat = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _fresh(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of ``t``, detached: the collectives never touch their argument."""
    return t.detach().clone(memory_format=torch.contiguous_format)


def _check_split(t: torch.Tensor, axis: str, p: int, dim: int, op: str) -> None:
    """``ConfigError`` (before any communication) unless dim ``dim`` of ``t`` splits in ``p``."""
    if t.dim() == 0 or t.shape[dim] % p != 0:
        raise ConfigError(
            f"{op} along axis {axis!r} of size {p} needs dim {dim} of shape "
            f"{tuple(t.shape)} to be divisible by {p}; pad the tensor or change the split"
        )


class CountedComm:
    """Collectives over the axes of one ``ProcessMesh``; ``counter`` records every call."""

    counter: CommCounter

    def __init__(self, mesh: ProcessMesh) -> None:
        self._mesh = mesh
        self.counter = CommCounter()

    @property
    def mesh(self) -> ProcessMesh:
        """The mesh whose axes this layer addresses."""
        return self._mesh

    def size(self, axis: str) -> int:
        """Number of ranks along ``axis`` (shorthand for ``mesh.size``)."""
        return self._mesh.size(axis)

    def coord(self, axis: str) -> int:
        """This rank's coordinate along ``axis`` (shorthand for ``mesh.coord``)."""
        return self._mesh.coord(axis)

    def _setup(self, t: torch.Tensor, axis: str) -> tuple[int, dist.ProcessGroup]:
        if not isinstance(t, torch.Tensor):
            raise ConfigError(f"collectives take a torch.Tensor, got {type(t).__name__}")
        return self._mesh.size(axis), self._mesh.group(axis)

    def all_reduce(
        self, t: torch.Tensor, axis: str, op: dist.ReduceOp.RedOpType = ReduceOp.SUM
    ) -> torch.Tensor:
        """Element-wise reduction of ``t`` over the ranks along ``axis``."""
        p, group = self._setup(t, axis)
        out = _fresh(t)
        if p == 1:
            return out
        self.counter.record(axis, "all_reduce", _nbytes(out))
        dist.all_reduce(out, op=op, group=group)
        return out

    def all_gather(self, t: torch.Tensor, axis: str, dim: int = 0) -> torch.Tensor:
        """Every rank's ``t`` concatenated along ``dim`` in coordinate order."""
        p, group = self._setup(t, axis)
        if p == 1:
            return _fresh(t)
        x = t.detach().movedim(dim, 0).contiguous()
        out = x.new_empty((p * x.shape[0], *x.shape[1:]))
        self.counter.record(axis, "all_gather", _nbytes(out))
        _all_gather_flat(out, x, group=group)
        return out.movedim(0, dim).contiguous()

    def reduce_scatter(
        self,
        t: torch.Tensor,
        axis: str,
        dim: int = 0,
        op: dist.ReduceOp.RedOpType = ReduceOp.SUM,
    ) -> torch.Tensor:
        """Reduce ``t`` over ``axis`` and keep the ``coord``-th of ``size`` chunks along ``dim``."""
        p, group = self._setup(t, axis)
        _check_split(t, axis, p, dim, "reduce_scatter")
        if p == 1:
            return _fresh(t)
        x = t.detach().movedim(dim, 0).contiguous()
        out = x.new_empty((x.shape[0] // p, *x.shape[1:]))
        self.counter.record(axis, "reduce_scatter", _nbytes(x))
        _reduce_scatter_flat(out, x, op=op, group=group)
        return out.movedim(0, dim).contiguous()

    def broadcast(self, t: torch.Tensor, axis: str, src: int = 0) -> torch.Tensor:
        """The ``t`` of the rank at coordinate ``src`` along ``axis``, on every rank."""
        p, group = self._setup(t, axis)
        out = _fresh(t)
        if p == 1:
            return out
        self.counter.record(axis, "broadcast", _nbytes(out))
        dist.broadcast(out, src=self._mesh.global_rank(axis, src), group=group)
        return out

    def reduce(
        self,
        t: torch.Tensor,
        axis: str,
        dst: int = 0,
        op: dist.ReduceOp.RedOpType = ReduceOp.SUM,
    ) -> torch.Tensor:
        """The reduction of ``t`` over ``axis`` on the rank at coordinate ``dst``.

        On other ranks the result's values are unspecified (torch.distributed semantics).
        """
        p, group = self._setup(t, axis)
        out = _fresh(t)
        if p == 1:
            return out
        self.counter.record(axis, "reduce", _nbytes(out))
        dist.reduce(out, dst=self._mesh.global_rank(axis, dst), op=op, group=group)
        return out

    def all_to_all(self, t: torch.Tensor, axis: str, split_dim: int, cat_dim: int) -> torch.Tensor:
        """Split ``t`` in ``size`` chunks along ``split_dim``, send chunk i to coordinate i, and
        concatenate the chunks received (in coordinate order) along ``cat_dim``."""
        p, group = self._setup(t, axis)
        _check_split(t, axis, p, split_dim, "all_to_all")
        if p == 1:
            return _fresh(t)
        x = t.detach().movedim(split_dim, 0).contiguous()
        out = torch.empty_like(x)
        self.counter.record(axis, "all_to_all", _nbytes(x))
        dist.all_to_all_single(out, x, group=group)
        chunks = [c.movedim(0, split_dim) for c in out.chunk(p, dim=0)]
        return torch.cat(chunks, dim=cat_dim)
