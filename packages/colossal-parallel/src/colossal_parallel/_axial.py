"""Dynamic axial parallelism (FastFold, Cheng et al., 2022): move which dim of a tensor is
sharded across the ranks of a mesh axis with one all-to-all, differentiably and counted.

[Note: axis switch] A tensor sharded along ``from_dim`` (each rank holds 1/p of it, whole along
``to_dim``) becomes sharded along ``to_dim`` (whole along ``from_dim``): split the local tensor in
p chunks along ``to_dim``, send chunk i to coordinate i, concatenate what arrives along
``from_dim`` in coordinate order. The backward is the switch the other way. Each switch counts its
local input bytes as ``all_to_all`` (see [Note: counted bytes]); a device sends (p-1)/p of them.

``switch_shard_dim_async`` starts the all-to-all and returns at once; the tensor is read only
through ``PendingSwitch.wait()``, so compute issued in between overlaps the transfer. Backward
mirrors it: the inverse all-to-all starts where ``wait()`` was in the forward and is waited for
where the switch started, so the backward of the compute in between overlaps it.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from colossal_contracts import ConfigError

from ._comm import CountedComm

__all__ = ["PendingSwitch", "switch_shard_dim", "switch_shard_dim_async"]


def _norm_dims(x: torch.Tensor, from_dim: int, to_dim: int) -> tuple[int, int]:
    if not isinstance(x, torch.Tensor):
        raise ConfigError(f"switch_shard_dim takes a torch.Tensor, got {type(x).__name__}")
    n = x.dim()
    f, t = from_dim % n if n else 0, to_dim % n if n else 0
    if n < 2 or not (-n <= from_dim < n and -n <= to_dim < n) or f == t:
        raise ConfigError(
            f"switch_shard_dim needs two different dims of a tensor of shape {tuple(x.shape)}, "
            f"got from_dim={from_dim}, to_dim={to_dim}"
        )
    return f, t


def _check(x: torch.Tensor, comm: CountedComm, axis: str, to_dim: int) -> int:
    p = comm.size(axis)
    if x.shape[to_dim] % p:
        raise ConfigError(
            f"cannot switch the sharded dim to dim {to_dim} of shape {tuple(x.shape)} across "
            f"{p} ranks of axis {axis!r}: it must be divisible by {p}; pad it or change the size"
        )
    return p


class _Switch(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, comm: CountedComm, axis: str, from_dim: int, to_dim: int
    ) -> torch.Tensor:
        ctx.comm, ctx.axis, ctx.from_dim, ctx.to_dim = comm, axis, from_dim, to_dim
        return comm.all_to_all(x, axis, split_dim=to_dim, cat_dim=from_dim)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> Any:
        gx = ctx.comm.all_to_all(g, ctx.axis, split_dim=ctx.from_dim, cat_dim=ctx.to_dim)
        return gx, None, None, None, None


def switch_shard_dim(
    x: torch.Tensor, comm: CountedComm, axis: str, *, from_dim: int, to_dim: int
) -> torch.Tensor:
    """``x`` sharded along ``from_dim`` -> sharded along ``to_dim`` ([Note: axis switch])."""
    f, t = _norm_dims(x, from_dim, to_dim)
    if _check(x, comm, axis, t) == 1:
        return x
    return _Switch.apply(x, comm, axis, f, t)


class _Box:
    """The in-flight all-to-alls of one ``PendingSwitch``: forward's and backward's work handles
    and buffers (a buffer must outlive its transfer)."""

    comm: CountedComm
    axis: str
    work: Any = None
    send: torch.Tensor | None = None
    bwd_work: Any = None
    bwd_send: torch.Tensor | None = None
    bwd_recv: torch.Tensor | None = None

    def launch(self, send: torch.Tensor) -> tuple[Any, torch.Tensor]:
        """Start the all-to-all of ``send`` (chunk i to coordinate i along dim 0), counted."""
        recv = torch.empty_like(send)
        self.comm.counter.record(self.axis, "all_to_all", send.numel() * send.element_size())
        group = self.comm.mesh.group(self.axis)
        return dist.all_to_all_single(recv, send, group=group, async_op=True), recv


class _Start(torch.autograd.Function):
    """Launch the all-to-all of ``x`` (moved so ``to_dim`` is dim 0); returns the receive buffer,
    which must not be read before ``_Finish``. Backward waits for the inverse all-to-all that
    ``_Finish``'s backward started (autograd runs the backward of everything computed between
    the two first, which is what overlaps it)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, to_dim: int, box: _Box) -> torch.Tensor:
        ctx.to_dim, ctx.box = to_dim, box
        box.send = x.detach().movedim(to_dim, 0).contiguous()
        box.work, recv = box.launch(box.send)
        return recv

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> Any:
        box = ctx.box
        if box.bwd_work is None:  # not started by _Finish (cannot happen in one backward)
            gx = box.comm.all_to_all(g, box.axis, split_dim=0, cat_dim=0)
        else:
            # g is the buffer _Finish handed on; its only producer is that all-to-all
            box.bwd_work.wait()
            gx = box.bwd_recv
            box.bwd_work, box.bwd_send, box.bwd_recv = None, None, None
        return gx.movedim(0, ctx.to_dim), None, None


class _Finish(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, recv: torch.Tensor, box: _Box) -> torch.Tensor:
        ctx.box = box
        if box.work is not None:
            box.work.wait()
        box.work, box.send = None, None
        return recv.view_as(recv)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> Any:
        # chunk i of the forward's receive buffer came from coordinate i: send its gradient back
        box = ctx.box
        box.bwd_send = g.contiguous()
        box.bwd_work, box.bwd_recv = box.launch(box.bwd_send)
        return box.bwd_recv, None


class PendingSwitch:
    """An all-to-all in flight; ``wait()`` returns the switched tensor (once)."""

    def __init__(self, recv: torch.Tensor, box: _Box | None, p: int, from_dim: int, to_dim: int):
        self._recv, self._box = recv, box
        self._p, self._from, self._to = p, from_dim, to_dim

    def wait(self) -> torch.Tensor:
        """Block until the transfer is done; the tensor sharded along ``to_dim``."""
        if self._box is None:
            return self._recv
        out = _Finish.apply(self._recv, self._box)
        self._box = None
        chunks = [c.movedim(0, self._to) for c in out.chunk(self._p, dim=0)]
        self._recv = torch.cat(chunks, dim=self._from)
        return self._recv

    def __call__(self) -> torch.Tensor:
        return self.wait()


def switch_shard_dim_async(
    x: torch.Tensor, comm: CountedComm, axis: str, *, from_dim: int, to_dim: int
) -> PendingSwitch:
    """Start ``switch_shard_dim``; compute issued before ``wait()`` overlaps the transfer."""
    f, t = _norm_dims(x, from_dim, to_dim)
    p = _check(x, comm, axis, t)
    if p == 1:
        return PendingSwitch(x, None, 1, f, t)
    box = _Box()
    box.comm, box.axis = comm, axis
    return PendingSwitch(_Start.apply(x, t, box), box, p, f, t)
