"""SUMMA: ``Y = X W`` on a ``q x q`` grid of ranks, and ``SummaLinear``, the Linear of 2D and 2.5D.

[Note: SUMMA blocks] The rank at grid row ``i = coord("tp_col")``, column ``j = coord("tp_row")``
holds ``X[i, j]`` (batch chunk ``i``, input-feature block ``j``), ``W[i, j]`` (input block ``i``,
output block ``j``) and produces ``Y[i, j]`` (batch chunk ``i``, output block ``j``), so outputs
have the layout of inputs and layers chain without reshuffling. The ranks of grid row ``i`` form
the group along axis ``tp_row`` (their column coordinate ``j`` varies); those of grid column ``j``
the group along ``tp_col`` (see docs/parallel/mesh.md).

    forward    Y[i,j]  = sum_k X[i,k] W[k,j]       k-th step: X[i,k] broadcast along tp_row,
                                                               W[k,j] broadcast along tp_col
    backward   dX[i,k] = sum_j dY[i,j] W[k,j]^T    W[k,j] broadcast along tp_col, products
                                                               reduced along tp_row to column k
               dW[k,j] = sum_i X[i,k]^T dY[i,j]    X[i,k] broadcast along tp_row, products
                                                               reduced along tp_col to row k

Only one ``q``-th of X or W is ever held beyond a rank's own blocks. 2.5D runs the same function
on each depth layer.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .._autograd import copy_to_axis
from .._comm import CountedComm
from .._torch_op import torch_function_op
from ._linear import GridLinear

__all__ = ["COL_PEERS", "ROW_PEERS", "SummaLinear", "summa_matmul"]

ROW_PEERS = "tp_row"  # the ranks of one grid row (column coordinate j varies)
COL_PEERS = "tp_col"  # the ranks of one grid column (row coordinate i varies)


class _Summa(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, comm: CountedComm) -> torch.Tensor:
        # x: (R, K/q) = X[i, j];  w: (K/q, N/q) = W[i, j]
        ctx.comm = comm
        ctx.save_for_backward(x, w)
        out = x.new_zeros(x.shape[0], w.shape[1])  # (R, N/q)
        for k in range(comm.size(ROW_PEERS)):
            a = comm.broadcast(x, ROW_PEERS, src=k)  # X[i, k]
            b = comm.broadcast(w, COL_PEERS, src=k)  # W[k, j]
            out.addmm_(a, b)
        return out

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> Any:
        x, w = ctx.saved_tensors
        comm: CountedComm = ctx.comm
        q, i, j = comm.size(ROW_PEERS), comm.coord(COL_PEERS), comm.coord(ROW_PEERS)
        g = g.contiguous()  # (R, N/q) = dY[i, j]
        gx = gw = None
        if ctx.needs_input_grad[0]:
            for k in range(q):
                b = comm.broadcast(w, COL_PEERS, src=k)  # W[k, j]
                part = comm.reduce(g @ b.t(), ROW_PEERS, dst=k)  # dX[i, k] on column k
                if k == j:
                    gx = part
        if ctx.needs_input_grad[1]:
            for k in range(q):
                a = comm.broadcast(x, ROW_PEERS, src=k)  # X[i, k]
                part = comm.reduce(a.t() @ g, COL_PEERS, dst=k)  # dW[k, j] on row k
                if k == i:
                    gw = part
        return gx, gw, None


@torch_function_op
def summa_matmul(x: torch.Tensor, w: torch.Tensor, comm: CountedComm) -> torch.Tensor:
    """``Y[i, j]`` from ``X[i, j]`` (R, K/q) and ``W[i, j]`` (K/q, N/q); see [Note: SUMMA blocks]."""
    return _Summa.apply(x, w, comm)


class SummaLinear(GridLinear):
    """``y = x W + b`` with ``W`` in ``q x q`` blocks, one per grid rank (replicated over depth).

    Input and output blocks: ``(b, ..., features / q)`` of batch chunk ``layout.row_chunk``.
    """

    _INIT_TAG = 3
    weight: nn.Parameter  # (in / q, out / q): block W[i, j], stored (in, out)
    bias: nn.Parameter | None  # (out / q**2,): chunk i of output block j

    def _weight_parts(self) -> tuple[int, int]:
        q = self.mesh.size(ROW_PEERS)
        return q, q

    def _weight_axes(self) -> tuple[str, ...]:
        return (COL_PEERS, ROW_PEERS)

    def _weight_piece(self, w: torch.Tensor) -> torch.Tensor:
        mesh = self.mesh
        q, i, j = mesh.size(ROW_PEERS), mesh.coord(COL_PEERS), mesh.coord(ROW_PEERS)
        return w.chunk(q, 0)[i].chunk(q, 1)[j]

    def _matmul(self, x: torch.Tensor) -> torch.Tensor:
        return _replicated_summa(x, self.weight, self.mesh.comm, self.layout.replica_axes)


@torch_function_op  # one operator over the parameter ([Note: operators a mode sees])
def _replicated_summa(
    x: torch.Tensor, w: torch.Tensor, comm: CountedComm, replica_axes: tuple[str, ...]
) -> torch.Tensor:
    for a in replica_axes:  # 2.5D: the same block on every depth layer
        w = copy_to_axis(w, comm, a)
    return summa_matmul(x, w, comm)
