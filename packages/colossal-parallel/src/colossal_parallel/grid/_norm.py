"""``GridLayerNorm``: LayerNorm over a hidden dim that is split along a mesh axis.

Statistics are two all-reduces of one value per local row along ``hidden_axis`` (all-reduce in
both passes: each rank's normalised block feeds different outputs). The affine weight and bias
are vector parameters ([Note: vector parameters]).
"""

from __future__ import annotations

import torch
from torch import nn

from colossal_contracts import ConfigError

from .._autograd import copy_to_axis, reduce_from_axis
from .._config import divide
from .._mesh import ProcessMesh
from ._common import check_last_dim
from ._layout import TpLayout, materialize_vector, vector_chunk
from ._mode import ModeLayer

__all__ = ["GridLayerNorm"]


class GridLayerNorm(ModeLayer):
    """LayerNorm of ``normalized_shape`` features on a block ``(..., H / size(hidden_axis))``."""

    weight: nn.Parameter  # (H / (q_hidden * q_chunk),), stored chunk of the hidden block
    bias: nn.Parameter  # same shape

    def __init__(
        self,
        normalized_shape: int,
        mesh: ProcessMesh,
        *,
        layout: TpLayout | None = None,
        eps: float = 1e-5,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(mesh, layout)
        name = type(self).__name__
        parts = mesh.size(self.layout.hidden_axis) * mesh.size(self.layout.chunk_axis)
        n = divide(normalized_shape, parts, what=f"{name} normalized_shape")
        self.normalized_shape = normalized_shape
        self.local_features = normalized_shape // mesh.size(self.layout.hidden_axis)
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(n, dtype=dtype))
        self.bias = nn.Parameter(torch.zeros(n, dtype=dtype))

    @classmethod
    def from_layernorm(
        cls, ln: nn.LayerNorm, mesh: ProcessMesh, *, layout: TpLayout | None = None
    ) -> GridLayerNorm:
        """This rank's shard of an affine ``nn.LayerNorm`` (with bias) over the last dim."""
        if len(ln.normalized_shape) != 1 or ln.weight is None or ln.bias is None:
            raise ConfigError(
                f"{cls.__name__}.from_layernorm needs an nn.LayerNorm over the last dim only with "
                f"weight and bias, got normalized_shape={tuple(ln.normalized_shape)}, "
                f"weight={ln.weight is not None}, bias={ln.bias is not None}; build it with "
                "elementwise_affine=True and bias=True (a frozen zero bias is equivalent)"
            )
        (h,) = ln.normalized_shape
        out = cls(h, mesh, layout=layout, eps=ln.eps, dtype=ln.weight.dtype)
        with torch.no_grad():
            out.weight.copy_(vector_chunk(ln.weight.detach(), mesh, out.layout))
            out.bias.copy_(vector_chunk(ln.bias.detach(), mesh, out.layout))
        return out

    def _sum_over_hidden(self, t: torch.Tensor) -> torch.Tensor:
        comm, axis = self.mesh.comm, self.layout.hidden_axis
        return copy_to_axis(reduce_from_axis(t, comm, axis), comm, axis)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_last_dim(x, self.local_features, type(self).__name__)
        n = self.normalized_shape
        mean = self._sum_over_hidden(x.sum(-1, keepdim=True)) / n
        xc = x - mean
        var = self._sum_over_hidden((xc * xc).sum(-1, keepdim=True)) / n
        w = materialize_vector(self.weight, self.mesh, self.layout)
        b = materialize_vector(self.bias, self.mesh, self.layout)
        return xc * torch.rsqrt(var + self.eps) * w + b
