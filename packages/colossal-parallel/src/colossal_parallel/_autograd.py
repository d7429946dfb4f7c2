"""Autograd-aware collectives: each is an ``autograd.Function`` whose forward and backward both go
through ``CountedComm``, so the bytes of the backward pass are counted too.

==========================  ===================  ===================
function                    forward              backward
==========================  ===================  ===================
``copy_to_axis``            identity             all-reduce
``reduce_from_axis``        all-reduce           identity
``split_along``             keep own chunk       all-gather
``gather_along``            all-gather           keep own chunk
``gather_along(grad="rs")`` all-gather           reduce-scatter
``reduce_scatter_along``    reduce-scatter       all-gather
==========================  ===================  ===================
"""

from __future__ import annotations

from typing import Any, Literal

import torch

from colossal_contracts import ConfigError

from ._comm import CountedComm

__all__ = [
    "copy_to_axis",
    "gather_along",
    "local_chunk",
    "reduce_from_axis",
    "reduce_scatter_along",
    "split_along",
]


def local_chunk(x: torch.Tensor, comm: CountedComm, axis: str, dim: int) -> torch.Tensor:
    """This rank's ``coord(axis)``-th of ``size(axis)`` equal chunks of ``x`` along ``dim``."""
    p = comm.size(axis)
    if x.shape[dim] % p != 0:
        raise ConfigError(
            f"cannot split dim {dim} of shape {tuple(x.shape)} into {p} equal parts along "
            f"axis {axis!r}; make that dimension a multiple of {p}"
        )
    return x.chunk(p, dim=dim)[comm.coord(axis)].contiguous()


class _CopyTo(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, comm: CountedComm, axis: str) -> torch.Tensor:
        ctx.comm, ctx.axis = comm, axis
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> Any:
        return ctx.comm.all_reduce(g, ctx.axis), None, None


class _ReduceFrom(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, comm: CountedComm, axis: str) -> torch.Tensor:
        return comm.all_reduce(x, axis)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> Any:
        return g, None, None


class _Split(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, comm: CountedComm, axis: str, dim: int) -> torch.Tensor:
        ctx.comm, ctx.axis, ctx.dim = comm, axis, dim
        return local_chunk(x, comm, axis, dim)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> Any:
        return ctx.comm.all_gather(g, ctx.axis, dim=ctx.dim), None, None, None


class _Gather(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, comm: CountedComm, axis: str, dim: int, grad: str
    ) -> torch.Tensor:
        ctx.comm, ctx.axis, ctx.dim, ctx.grad = comm, axis, dim, grad
        return comm.all_gather(x, axis, dim=dim)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> Any:
        if ctx.grad == "reduce_scatter":
            gx = ctx.comm.reduce_scatter(g, ctx.axis, dim=ctx.dim)
        else:
            gx = local_chunk(g, ctx.comm, ctx.axis, ctx.dim)
        return gx, None, None, None, None


class _ReduceScatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, comm: CountedComm, axis: str, dim: int) -> torch.Tensor:
        ctx.comm, ctx.axis, ctx.dim = comm, axis, dim
        return comm.reduce_scatter(x, axis, dim=dim)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> Any:
        return ctx.comm.all_gather(g, ctx.axis, dim=ctx.dim), None, None, None


def copy_to_axis(x: torch.Tensor, comm: CountedComm, axis: str) -> torch.Tensor:
    """Identity forward; all-reduce of the gradient along ``axis`` backward."""
    return _CopyTo.apply(x, comm, axis)


def reduce_from_axis(x: torch.Tensor, comm: CountedComm, axis: str) -> torch.Tensor:
    """All-reduce (sum) along ``axis`` forward; identity backward."""
    return _ReduceFrom.apply(x, comm, axis)


def split_along(x: torch.Tensor, comm: CountedComm, axis: str, dim: int) -> torch.Tensor:
    """Keep this rank's chunk of ``x`` along ``dim`` forward; all-gather the gradient backward."""
    return _Split.apply(x, comm, axis, dim)


def gather_along(
    x: torch.Tensor,
    comm: CountedComm,
    axis: str,
    dim: int,
    *,
    grad: Literal["split", "reduce_scatter"] = "split",
) -> torch.Tensor:
    """All-gather ``x`` along ``dim`` forward. Backward keeps this rank's chunk of the gradient
    (``grad="split"``: the consumer is replicated) or reduce-scatters it (``grad="reduce_scatter"``:
    each rank's consumer saw different data, as at a sequence-parallel boundary)."""
    if grad not in ("split", "reduce_scatter"):
        raise ConfigError(f"gather_along grad must be 'split' or 'reduce_scatter', got {grad!r}")
    return _Gather.apply(x, comm, axis, dim, grad)


def reduce_scatter_along(x: torch.Tensor, comm: CountedComm, axis: str, dim: int) -> torch.Tensor:
    """Reduce-scatter along ``dim`` forward; all-gather of the gradient backward."""
    return _ReduceScatter.apply(x, comm, axis, dim)
