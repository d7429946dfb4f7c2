"""``GridLinear``: what the SUMMA (2D, 2.5D) and cube (3D) Linears share; ``GridHead``: the LM head.

The two differ only in how the weight is cut over the grid and in the matmul that consumes it;
the parameters' creation, ``from_linear``, the input check and the bias are written once here.
"""

from __future__ import annotations

import math
from typing import ClassVar, TypeVar

import torch
from torch import nn

from .._config import divide
from .._mesh import ProcessMesh
from ._common import block_generator, check_last_dim
from ._layout import TpLayout, materialize_vector, vector_chunk
from ._mode import ModeLayer

__all__ = ["GridHead", "GridLinear"]

_L = TypeVar("_L", bound="GridLinear")


class GridLinear(ModeLayer):
    """``y = x W + b`` with ``W (in, out)`` cut in pieces over a grid of ranks.

    Input: block ``(b, ..., in / size(layout.hidden_axis))`` in ``layout``; output: block
    ``(b, ..., out / size(out_layout.hidden_axis))`` in ``out_layout``, same number of rows.
    ``weight`` is this rank's piece of ``W``, ``(in / in_parts, out / out_parts)`` as the
    subclass's ``_weight_parts`` says; every rank that holds the same piece draws the same initial
    values (``block_generator``, no communication). ``bias`` is a vector parameter of
    ``out_layout`` ([Note: vector parameters]).

    Subclasses set ``_INIT_TAG`` and implement ``_weight_parts``, ``_weight_axes``,
    ``_weight_piece`` and ``_matmul``.
    """

    _INIT_TAG: ClassVar[int]  # tells this layer's generator apart from other layers'
    weight: nn.Parameter  # (in / in_parts, out / out_parts), stored (in, out)
    bias: nn.Parameter | None  # (out / (size(hidden_axis) * size(chunk_axis)),) of out_layout

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
        name = type(self).__name__
        in_parts, out_parts = self._weight_parts()
        k = divide(in_features, in_parts, what=f"{name} in_features")
        n = divide(out_features, out_parts, what=f"{name} out_features")
        self.in_features, self.out_features = in_features, out_features
        bound = 1.0 / math.sqrt(in_features)
        g = block_generator(mesh, seed, self._weight_axes(), tag=self._INIT_TAG)
        w = torch.empty(k, n, dtype=dtype).uniform_(-bound, bound, generator=g)
        self.weight = nn.Parameter(w)
        if bias:
            out = self.out_layout
            parts = mesh.size(out.hidden_axis) * mesh.size(out.chunk_axis)
            nb = divide(out_features, parts, what=f"{name} out_features (bias)")
            b = torch.empty(nb, dtype=dtype).uniform_(-bound, bound, generator=g)
            self.bias = nn.Parameter(b)
        else:
            self.register_parameter("bias", None)

    def _weight_parts(self) -> tuple[int, int]:
        """Into how many parts ``in_features`` and ``out_features`` are cut for ``weight``."""
        raise NotImplementedError

    def _weight_axes(self) -> tuple[str, ...]:
        """The axes whose coordinates tell this rank's weight piece apart (for initialisation)."""
        raise NotImplementedError

    def _weight_piece(self, w: torch.Tensor) -> torch.Tensor:
        """This rank's piece of the full weight ``w (in, out)``."""
        raise NotImplementedError

    def _matmul(self, x: torch.Tensor) -> torch.Tensor:
        """The output rows ``(R, out / q)`` of the input rows ``(R, in / q)`` (no bias)."""
        raise NotImplementedError

    @classmethod
    def from_linear(
        cls: type[_L], linear: nn.Linear, mesh: ProcessMesh, *, layout: TpLayout | None = None
    ) -> _L:
        """This rank's piece of an unsharded ``nn.Linear`` (weight ``(out, in)``)."""
        out = cls(
            linear.in_features,
            linear.out_features,
            mesh,
            bias=linear.bias is not None,
            layout=layout,
            dtype=linear.weight.dtype,
        )
        with torch.no_grad():
            out.weight.copy_(out._weight_piece(linear.weight.detach().t()))
            if out.bias is not None:
                out.bias.copy_(vector_chunk(linear.bias.detach(), mesh, out.out_layout))
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k_local = self.in_features // self.mesh.size(self.layout.hidden_axis)
        check_last_dim(x, k_local, type(self).__name__)
        y = self._matmul(x.reshape(-1, k_local))
        y = y.reshape(*x.shape[:-1], y.shape[-1])
        if self.bias is not None:
            y = y + materialize_vector(self.bias, self.mesh, self.out_layout)
        return y


class GridHead(GridLinear):
    """The LM head ``hidden -> vocab`` of a mode: its Linear without a bias by default.

    The logits come vocabulary-parallel, in the Linear's ``out_layout``. Put it before the
    mode's Linear among the bases: ``class Classifier2D(_Mode2D, GridHead, SummaLinear)``.
    """

    def __init__(
        self,
        hidden: int,
        vocab: int,
        mesh: ProcessMesh,
        *,
        bias: bool = False,
        layout: TpLayout | None = None,
        dtype: torch.dtype | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__(hidden, vocab, mesh, bias=bias, layout=layout, dtype=dtype, seed=seed)
