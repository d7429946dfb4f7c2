"""Megatron 1D linear layers: a column-parallel and a row-parallel ``nn.Linear``.

[Note: 1D linear pair] ``ColumnParallelLinear`` keeps rows ``[c*out/p, (c+1)*out/p)`` of the weight
(and bias) on the rank at ``coord(axis) == c``, so its output is split along the last dim.
``RowParallelLinear`` keeps columns ``[c*in/p, (c+1)*in/p)`` of the weight and a replicated bias, so it
consumes exactly that split and all-reduces its partial sums. An MLP or attention block built as
column -> local op -> row communicates once forward (the row all-reduce) and once backward (the
column input-gradient all-reduce). With sequence parallelism (``sequence_parallel=True``) the block
input and output are split along ``seq_dim`` instead of replicated: the column layer all-gathers its
input (reduce-scatter of the gradient) and the row layer reduce-scatters its output (all-gather of
the gradient); the bytes are the same, the activations outside the block are ``p`` times smaller.
"""

from __future__ import annotations

from typing import Any, TypeVar

import torch
import torch.nn.functional as F
from torch import nn

from .._autograd import (
    copy_to_axis,
    gather_along,
    reduce_from_axis,
    reduce_scatter_along,
    split_along,
)
from .._mesh import ProcessMesh
from ._base import Layer1D

__all__ = ["ColumnParallelLinear", "RowParallelLinear"]

_L = TypeVar("_L", bound="_Linear1D")


class _Linear1D(Layer1D):
    """What the column and the row layer share: parameter creation and ``from_linear``.

    Subclasses say which shard of the full weight and bias they keep (``_weight_shard``,
    ``_bias_shard``, see [Note: 1D shards]).
    """

    weight: nn.Parameter
    bias: nn.Parameter | None

    def _init_parameters(
        self,
        weight_shape: tuple[int, int],
        bias_size: int,
        bias: bool,
        dtype: torch.dtype | None,
        device: torch.device | str | None,
    ) -> None:
        """``nn.Linear``'s init (Kaiming-uniform weight) of this rank's shard; zero bias."""
        kw = {"dtype": dtype, "device": device}
        self.weight = nn.Parameter(torch.empty(*weight_shape, **kw))
        self.bias = nn.Parameter(torch.zeros(bias_size, **kw)) if bias else None
        nn.init.kaiming_uniform_(self.weight, a=5**0.5)

    def _weight_shard(self, weight: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _bias_shard(self, bias: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    @classmethod
    def from_linear(cls: type[_L], linear: nn.Linear, mesh: ProcessMesh, **kwargs: Any) -> _L:
        """This rank's shard of an unsharded ``nn.Linear`` (same on every rank)."""
        layer = cls(
            linear.in_features,
            linear.out_features,
            mesh,
            bias=linear.bias is not None,
            dtype=linear.weight.dtype,
            device=linear.weight.device,
            **kwargs,
        )
        with torch.no_grad():
            layer.weight.copy_(layer._weight_shard(linear.weight))
            if layer.bias is not None:
                layer.bias.copy_(layer._bias_shard(linear.bias))
        return layer


class ColumnParallelLinear(_Linear1D):
    """``y = x W^T + b`` with ``W`` split along the output dim (see [Note: 1D linear pair]).

    Input: replicated ``(..., in)``, or with ``sequence_parallel`` split along ``seq_dim``.
    Output: ``(..., out/p)``, or the full ``(..., out)`` with ``gather_output``.
    """

    weight: nn.Parameter  # (out/p, in)
    bias: nn.Parameter | None  # (out/p,)

    def __init__(
        self,
        in_features: int,
        out_features: int,
        mesh: ProcessMesh,
        *,
        bias: bool = True,
        gather_output: bool = False,
        sequence_parallel: bool = False,
        seq_dim: int = 1,
        axis: str = "tp",
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__(mesh, axis)
        self.in_features, self.out_features = in_features, out_features
        self.out_per_rank = self._per_rank(out_features, "out_features")
        self.gather_output = gather_output
        self.sequence_parallel, self.seq_dim = sequence_parallel, seq_dim
        self._init_parameters(
            (self.out_per_rank, in_features), self.out_per_rank, bias, dtype, device
        )

    def _weight_shard(self, weight: torch.Tensor) -> torch.Tensor:
        return self._own_chunk(weight, 0)

    def _bias_shard(self, bias: torch.Tensor) -> torch.Tensor:
        return self._own_chunk(bias, 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        comm = self.mesh.comm
        if self.sequence_parallel:
            x = gather_along(x, comm, self.axis, self.seq_dim, grad="reduce_scatter")
        else:
            x = copy_to_axis(x, comm, self.axis)
        y = F.linear(x, self.weight, self.bias)  # (..., out/p)
        if self.gather_output:
            y = gather_along(y, comm, self.axis, -1)
        return y

    def extra_repr(self) -> str:
        return (
            f"in={self.in_features}, out={self.out_features} (per rank {self.out_per_rank}), "
            f"gather_output={self.gather_output}, sequence_parallel={self.sequence_parallel}"
        )


class RowParallelLinear(_Linear1D):
    """``y = x W^T + b`` with ``W`` split along the input dim (see [Note: 1D linear pair]).

    Input: ``(..., in/p)`` (``input_is_parallel``) or the full ``(..., in)``, which is split here.
    Output: replicated ``(..., out)``, or with ``sequence_parallel`` split along ``seq_dim``.
    """

    weight: nn.Parameter  # (out, in/p)
    bias: nn.Parameter | None  # (out,), replicated

    def __init__(
        self,
        in_features: int,
        out_features: int,
        mesh: ProcessMesh,
        *,
        bias: bool = True,
        input_is_parallel: bool = True,
        sequence_parallel: bool = False,
        seq_dim: int = 1,
        axis: str = "tp",
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__(mesh, axis)
        self.in_features, self.out_features = in_features, out_features
        self.in_per_rank = self._per_rank(in_features, "in_features")
        self.input_is_parallel = input_is_parallel
        self.sequence_parallel, self.seq_dim = sequence_parallel, seq_dim
        self._init_parameters((out_features, self.in_per_rank), out_features, bias, dtype, device)

    def _weight_shard(self, weight: torch.Tensor) -> torch.Tensor:
        return self._own_chunk(weight, 1)

    def _bias_shard(self, bias: torch.Tensor) -> torch.Tensor:
        return bias  # replicated

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        comm = self.mesh.comm
        if not self.input_is_parallel:
            x = split_along(x, comm, self.axis, -1)
        y = F.linear(x, self.weight)  # (..., out), partial sums
        if self.sequence_parallel:
            y = reduce_scatter_along(y, comm, self.axis, self.seq_dim)
        else:
            y = reduce_from_axis(y, comm, self.axis)
        if self.bias is not None:
            # under sequence parallelism each rank sees other tokens: sum the bias gradient
            b = copy_to_axis(self.bias, comm, self.axis) if self.sequence_parallel else self.bias
            y = y + b
        return y

    def extra_repr(self) -> str:
        return (
            f"in={self.in_features} (per rank {self.in_per_rank}), out={self.out_features}, "
            f"input_is_parallel={self.input_is_parallel}, "
            f"sequence_parallel={self.sequence_parallel}"
        )
