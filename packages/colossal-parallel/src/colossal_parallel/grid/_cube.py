"""The 3D Linear on a ``q x q x q`` cube (Agarwal et al.; Colossal-AI's 3D tensor parallelism).

[Note: cube blocks] For ``Y = X W`` with ``X (M, K)``, ``W (K, N)``: take an input layout with
row axes ``("tp_wt", r)`` and hidden axis ``h`` (``{r, h} = {"tp_in", "tp_out"}``). With
``a = coord("tp_wt")``, ``c = coord(r)``, ``l = coord(h)``, a rank holds

    X piece:  rows chunk a*q + c of q*q, input block l              (M/q^2, K/q)
    W piece:  piece a of q (along K) of block W[l, c]               (K/q^2, N/q)

    forward   X[a, l]   = all-gather of the X pieces along r        (M/q, K/q)
              W[l, c]   = all-gather of the W pieces along tp_wt    (K/q, N/q)
              Y piece   = reduce-scatter along h of X[a, l] W[l, c] (M/q^2, N/q)
                        = rows chunk a*q + l, output block c
    backward  dY[a, c] block = all-gather of dY pieces along h;
              dX piece  = reduce-scatter along r of dY W[l, c]^T
              dW piece  = reduce-scatter along tp_wt of X[a, l]^T dY

The output's layout is the input's with ``r`` and ``h`` swapped, so consecutive Linears alternate
between ``LAYOUT_3D`` (rows ``tp_wt, tp_in``; hidden ``tp_out``) and ``LAYOUT_3D_T`` (rows
``tp_wt, tp_out``; hidden ``tp_in``), and a pair returns to the layout it started in.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .._comm import CountedComm
from .._torch_op import torch_function_op
from ._layout import TpLayout
from ._linear import GridLinear

__all__ = ["LAYOUT_3D", "LAYOUT_3D_T", "CubeLinear", "cube_matmul"]

WEIGHT = "tp_wt"
LAYOUT_3D = TpLayout(row_axes=(WEIGHT, "tp_in"), hidden_axis="tp_out")
LAYOUT_3D_T = TpLayout(row_axes=(WEIGHT, "tp_out"), hidden_axis="tp_in")


def _swap(layout: TpLayout) -> TpLayout:
    return LAYOUT_3D_T if layout == LAYOUT_3D else LAYOUT_3D


class _Cube(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, w: torch.Tensor, comm: CountedComm, r: str, h: str
    ) -> torch.Tensor:
        ctx.comm, ctx.r, ctx.h = comm, r, h
        xb = comm.all_gather(x, r, dim=0)  # X[a, l]: (M/q, K/q)
        wb = comm.all_gather(w, WEIGHT, dim=0)  # W[l, c]: (K/q, N/q)
        ctx.save_for_backward(xb, wb)
        return comm.reduce_scatter(xb @ wb, h, dim=0)  # (M/q^2, N/q)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> Any:
        xb, wb = ctx.saved_tensors
        comm: CountedComm = ctx.comm
        gb = comm.all_gather(g.contiguous(), ctx.h, dim=0)  # dY block: (M/q, N/q)
        gx = comm.reduce_scatter(gb @ wb.t(), ctx.r, dim=0) if ctx.needs_input_grad[0] else None
        gw = comm.reduce_scatter(xb.t() @ gb, WEIGHT, dim=0) if ctx.needs_input_grad[1] else None
        return gx, gw, None, None, None


@torch_function_op
def cube_matmul(
    x: torch.Tensor, w: torch.Tensor, comm: CountedComm, layout: TpLayout
) -> torch.Tensor:
    """The output piece of ``X W`` from an input piece and a weight piece ([Note: cube blocks])."""
    return _Cube.apply(x, w, comm, layout.chunk_axis, layout.hidden_axis)


class CubeLinear(GridLinear):
    """``y = x W + b`` on the cube; the output layout is the input layout swapped."""

    _INIT_TAG = 4
    weight: nn.Parameter  # (in / q**2, out / q): piece coord(tp_wt) of block W[l, c], (in, out)
    bias: nn.Parameter | None  # (out / q**2,): vector parameter of the output layout

    @property
    def out_layout(self) -> TpLayout:
        """The input layout with its inner row axis and hidden axis swapped."""
        return _swap(self.layout)

    def _weight_parts(self) -> tuple[int, int]:
        q = self.mesh.size(WEIGHT)
        return q * q, q

    def _weight_axes(self) -> tuple[str, ...]:
        return (self.layout.hidden_axis, self.layout.chunk_axis, WEIGHT)

    def _weight_piece(self, w: torch.Tensor) -> torch.Tensor:
        mesh, lay, q = self.mesh, self.layout, self.mesh.size(WEIGHT)
        block = w.chunk(q, 0)[mesh.coord(lay.hidden_axis)].chunk(q, 1)[mesh.coord(lay.chunk_axis)]
        return block.chunk(q, 0)[mesh.coord(WEIGHT)]

    def _matmul(self, x: torch.Tensor) -> torch.Tensor:
        return cube_matmul(x, self.weight, self.mesh.comm, self.layout)
