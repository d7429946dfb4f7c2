"""``SummaLinear``: the Linear of 2D and 2.5D tensor parallelism (see [Note: SUMMA blocks])."""

from __future__ import annotations

import math

import torch
from torch import nn

from .._autograd import copy_to_axis
from .._mesh import ProcessMesh
from .._tpnd._common import block_generator, check_last_dim, divide
from .._tpnd._layout import TpLayout, materialize_vector, vector_chunk
from .._tpnd._mode import ModeLayer
from ._summa import COL_PEERS, ROW_PEERS, summa_matmul

__all__ = ["SummaLinear"]


class SummaLinear(ModeLayer):
    """``y = x W + b`` with ``W`` in ``q x q`` blocks, one per grid rank (replicated over depth).

    Input and output blocks: ``(b, ..., features / q)`` of batch chunk ``layout.row_chunk``.
    """

    weight: nn.Parameter  # (in / q, out / q): block W[i, j], stored (in, out)
    bias: nn.Parameter | None  # (out / q**2,): chunk i of output block j

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
        name, q = type(self).__name__, mesh.size(ROW_PEERS)
        k = divide(in_features, q, what=f"{name} in_features")
        n = divide(out_features, q, what=f"{name} out_features")
        self.in_features, self.out_features = in_features, out_features
        bound = 1.0 / math.sqrt(in_features)
        g = block_generator(mesh, seed, (COL_PEERS, ROW_PEERS), tag=3)
        w = torch.empty(k, n, dtype=dtype).uniform_(-bound, bound, generator=g)
        self.weight = nn.Parameter(w)
        if bias:
            nb = divide(out_features, q * q, what=f"{name} out_features (bias)")
            b = torch.empty(nb, dtype=dtype).uniform_(-bound, bound, generator=g)
            self.bias = nn.Parameter(b)
        else:
            self.register_parameter("bias", None)

    @classmethod
    def from_linear(
        cls, linear: nn.Linear, mesh: ProcessMesh, *, layout: TpLayout | None = None
    ) -> SummaLinear:
        """This rank's blocks of an unsharded ``nn.Linear`` (weight ``(out, in)``)."""
        out = cls(
            linear.in_features,
            linear.out_features,
            mesh,
            bias=linear.bias is not None,
            layout=layout,
            dtype=linear.weight.dtype,
        )
        q, i, j = mesh.size(ROW_PEERS), mesh.coord(COL_PEERS), mesh.coord(ROW_PEERS)
        w = linear.weight.detach().t()  # (in, out)
        with torch.no_grad():
            out.weight.copy_(w.chunk(q, 0)[i].chunk(q, 1)[j])
            if out.bias is not None:
                out.bias.copy_(vector_chunk(linear.bias.detach(), mesh, out.layout))
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_last_dim(x, self.weight.shape[0], type(self).__name__)
        w = self.weight
        for a in self.layout.replica_axes:  # 2.5D: the same block on every depth layer
            w = copy_to_axis(w, self.mesh.comm, a)
        y = summa_matmul(x.reshape(-1, x.shape[-1]), w, self.mesh.comm)
        y = y.reshape(*x.shape[:-1], y.shape[-1])
        if self.bias is not None:
            y = y + materialize_vector(self.bias, self.mesh, self.layout)
        return y
