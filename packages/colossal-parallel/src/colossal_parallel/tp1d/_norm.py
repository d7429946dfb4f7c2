"""1D LayerNorm: replicated weights; with sequence parallelism, a per-rank sequence shard.

Without sequence parallelism every rank normalises the same replicated activations and computes
the same weight gradients, so nothing is communicated. With it, each rank sees ``1/p`` of the
tokens, so the weight and bias gradients are all-reduced along ``axis`` (identity forward).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from colossal_contracts import ConfigError

from .._autograd import copy_to_axis
from .._mesh import ProcessMesh
from ._base import Layer1D

__all__ = ["LayerNorm1D"]


class LayerNorm1D(Layer1D):
    """``nn.LayerNorm`` over the last dim, tensor-parallel aware (see module docstring)."""

    weight: nn.Parameter  # (hidden,), replicated
    bias: nn.Parameter | None  # (hidden,), replicated

    def __init__(
        self,
        hidden: int,
        mesh: ProcessMesh,
        *,
        eps: float = 1e-5,
        bias: bool = True,
        sequence_parallel: bool = False,
        axis: str = "tp",
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__(mesh, axis)
        self.hidden, self.eps, self.sequence_parallel = hidden, eps, sequence_parallel
        kw = {"dtype": dtype, "device": device}
        self.weight = nn.Parameter(torch.ones(hidden, **kw))
        self.bias = nn.Parameter(torch.zeros(hidden, **kw)) if bias else None

    @classmethod
    def from_layernorm(cls, norm: nn.LayerNorm, mesh: ProcessMesh, **kwargs: Any) -> LayerNorm1D:
        """A copy of an unsharded ``nn.LayerNorm`` with a 1-dim ``normalized_shape``."""
        if len(norm.normalized_shape) != 1 or norm.weight is None:
            raise ConfigError(
                "LayerNorm1D.from_layernorm needs an affine nn.LayerNorm over the last dim only, "
                f"got normalized_shape={tuple(norm.normalized_shape)}, "
                f"elementwise_affine={norm.weight is not None}"
            )
        layer = cls(
            norm.normalized_shape[0],
            mesh,
            eps=norm.eps,
            bias=norm.bias is not None,
            dtype=norm.weight.dtype,
            device=norm.weight.device,
            **kwargs,
        )
        with torch.no_grad():
            layer.weight.copy_(norm.weight)
            if layer.bias is not None:
                layer.bias.copy_(norm.bias)
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w, b = self.weight, self.bias
        if self.sequence_parallel:
            w = copy_to_axis(w, self.mesh.comm, self.axis)
            b = copy_to_axis(b, self.mesh.comm, self.axis) if b is not None else None
        return F.layer_norm(x, (self.hidden,), w, b, self.eps)

    def extra_repr(self) -> str:
        return f"{self.hidden}, eps={self.eps}, sequence_parallel={self.sequence_parallel}"
