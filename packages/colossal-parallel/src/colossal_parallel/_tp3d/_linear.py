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

import math
from typing import Any

import torch
from torch import nn

from .._comm import CountedComm
from .._mesh import ProcessMesh
from .._tpnd._common import block_generator, check_last_dim, divide
from .._tpnd._layout import TpLayout, materialize_vector, vector_chunk
from .._tpnd._mode import ModeLayer

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


def cube_matmul(
    x: torch.Tensor, w: torch.Tensor, comm: CountedComm, layout: TpLayout
) -> torch.Tensor:
    """The output piece of ``X W`` from an input piece and a weight piece ([Note: cube blocks])."""
    return _Cube.apply(x, w, comm, layout.chunk_axis, layout.hidden_axis)


class CubeLinear(ModeLayer):
    """``y = x W + b`` on the cube; the output layout is the input layout swapped."""

    MODE = "3d"
    LAYOUTS = (LAYOUT_3D, LAYOUT_3D_T)
    weight: nn.Parameter  # (in / q**2, out / q): piece coord(tp_wt) of block W[l, c], (in, out)
    bias: nn.Parameter | None  # (out / q**2,): vector parameter of the output layout

    def __init__(
        self,
        in_features: int,
        out_features: int,
        mesh: ProcessMesh,
        *,
        bias: bool = True,
        layout: TpLayout | None = None,
        dtype: torch.dtype | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__(mesh, layout)
        name, q = type(self).__name__, mesh.size(WEIGHT)
        k = divide(in_features, q * q, what=f"{name} in_features")
        n = divide(out_features, q, what=f"{name} out_features")
        self.in_features, self.out_features = in_features, out_features
        bound = 1.0 / math.sqrt(in_features)
        axes = (self.layout.hidden_axis, self.layout.chunk_axis, WEIGHT)
        g = block_generator(mesh, seed, axes, tag=4)
        self.weight = nn.Parameter(
            torch.empty(k, n, dtype=dtype).uniform_(-bound, bound, generator=g)
        )
        if bias:
            nb = divide(out_features, q * q, what=f"{name} out_features (bias)")
            b = torch.empty(nb, dtype=dtype).uniform_(-bound, bound, generator=g)
            self.bias = nn.Parameter(b)
        else:
            self.register_parameter("bias", None)

    @property
    def out_layout(self) -> TpLayout:
        """The input layout with its inner row axis and hidden axis swapped."""
        return _swap(self.layout)

    @classmethod
    def from_linear(
        cls, linear: nn.Linear, mesh: ProcessMesh, *, layout: TpLayout | None = None
    ) -> CubeLinear:
        """This rank's piece of an unsharded ``nn.Linear`` (weight ``(out, in)``)."""
        out = cls(
            linear.in_features,
            linear.out_features,
            mesh,
            bias=linear.bias is not None,
            layout=layout,
            dtype=linear.weight.dtype,
        )
        lay, q = out.layout, mesh.size(WEIGHT)
        w = linear.weight.detach().t()  # (in, out)
        block = w.chunk(q, 0)[mesh.coord(lay.hidden_axis)].chunk(q, 1)[mesh.coord(lay.chunk_axis)]
        with torch.no_grad():
            out.weight.copy_(block.chunk(q, 0)[mesh.coord(WEIGHT)])
            if out.bias is not None:
                out.bias.copy_(vector_chunk(linear.bias.detach(), mesh, out.out_layout))
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k_local = self.in_features // self.mesh.size(WEIGHT)
        check_last_dim(x, k_local, type(self).__name__)
        y = cube_matmul(x.reshape(-1, k_local), self.weight, self.mesh.comm, self.layout)
        y = y.reshape(-1, *x.shape[1:-1], y.shape[-1])
        if self.bias is not None:
            y = y + materialize_vector(self.bias, self.mesh, self.out_layout)
        return y
