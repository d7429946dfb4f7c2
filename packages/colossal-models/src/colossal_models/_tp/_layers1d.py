"""Megatron 1D tensor parallelism (and its sequence parallelism) for decoder layers.

The residual stream is replicated over the ``tp`` ranks, or with sequence parallelism split
along the sequence dim (dim 1); column projections split heads and MLP width, row projections
sum them back (all-reduce, or reduce-scatter to the sequence split). Norms are replicated. The
vocabulary is split: the token embedding keeps rows ``[r*V/p, (r+1)*V/p)`` and the head, tied
to it or not, gives vocabulary-split logits whose loss never gathers them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from colossal_contracts import ConfigError
from colossal_parallel import ProcessMesh, copy_to_axis, gather_along, split_along
from colossal_parallel.tp1d import (
    ColumnParallelLinear,
    LayerNorm1D,
    RowParallelLinear,
    VocabParallelEmbedding,
    vocab_parallel_cross_entropy,
)

from .._io import LMIO, at_least_fp32
from ._base import TpLayers
from ._kv import GatheredKV, kv_sharing

__all__ = ["IO1D", "Layers1D", "RMSNorm1D"]

AXIS = "tp"
SEQ = 1  # (B, T, C): the sequence dim


class RMSNorm1D(nn.Module):
    """``nn.RMSNorm`` whose weight gradient is summed over ``tp`` (its input is sequence-split)."""

    weight: nn.Parameter  # (hidden,), replicated

    def __init__(self, norm: nn.RMSNorm, mesh: ProcessMesh) -> None:
        super().__init__()
        self.mesh, self.eps = mesh, norm.eps
        self.normalized_shape = tuple(norm.normalized_shape)
        self.weight = nn.Parameter(norm.weight.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = copy_to_axis(self.weight, self.mesh.comm, AXIS)
        return F.rms_norm(x, self.normalized_shape, w, self.eps)


class IO1D(LMIO):
    """Replicated ids; with sequence parallelism the embedded input is split on entry (when the
    embedding cannot do it, e.g. GPT adds positions after it) and the head gathers it back."""

    def __init__(self, mesh: ProcessMesh, *, sequence_parallel: bool, split_on_enter: bool):
        super().__init__()
        self.mesh = mesh
        self.sequence_parallel, self.split_on_enter = sequence_parallel, split_on_enter

    def enter(self, x: torch.Tensor) -> torch.Tensor:
        if self.sequence_parallel and self.split_on_enter:
            return split_along(x, self.mesh.comm, AXIS, SEQ)  # (B, T/p, C)
        return x

    def forward(
        self, h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor | None
    ) -> torch.Tensor:
        comm = self.mesh.comm
        if self.sequence_parallel:
            h = gather_along(h, comm, AXIS, SEQ, grad="reduce_scatter")  # (B, T, C)
        else:
            h = copy_to_axis(h, comm, AXIS)
        logits = F.linear(h, weight)  # (B, T, V/p): weight holds this rank's vocabulary rows
        if targets is None:
            return gather_along(logits, comm, AXIS, -1)
        return vocab_parallel_cross_entropy(at_least_fp32(logits), targets, self.mesh, axis=AXIS)


class Layers1D(TpLayers):
    """1D sharding rules; ``sequence_parallel`` splits the residual stream along the sequence."""

    def __init__(self, mesh: ProcessMesh, *, sequence_parallel: bool) -> None:
        super().__init__(mesh)
        self.sp = sequence_parallel

    @property
    def head_parts(self) -> int:
        return self.mesh.size(AXIS)

    def column(self, linear: nn.Linear) -> nn.Module:
        return ColumnParallelLinear.from_linear(linear, self.mesh, sequence_parallel=self.sp)

    def row(self, linear: nn.Linear) -> nn.Module:
        return RowParallelLinear.from_linear(
            linear, self.mesh, input_is_parallel=True, sequence_parallel=self.sp
        )

    def kv(self, linear: nn.Linear, num_heads: int, num_kv_heads: int) -> nn.Module:
        share = kv_sharing(num_heads, num_kv_heads, self.head_parts, "1d key/value projection")
        layer = self.column(linear)
        if share is None:
            return layer
        width = linear.out_features // num_kv_heads
        index = self.mesh.coord(AXIS) // share
        return GatheredKV(layer, self.mesh, AXIS, index=index, head_width=width)

    def norm(self, norm: nn.Module) -> nn.Module:
        if isinstance(norm, nn.LayerNorm):
            return LayerNorm1D.from_layernorm(norm, self.mesh, sequence_parallel=self.sp)
        if isinstance(norm, nn.RMSNorm):
            return RMSNorm1D(norm, self.mesh) if self.sp else norm
        raise ConfigError(f"1d plan: no rule for norm {type(norm).__name__}")

    def token_embedding(self, emb: nn.Embedding, *, positions_follow: bool) -> nn.Module:
        # With sequence parallelism the lookup reduce-scatters straight to the sequence split,
        # unless positions are added after it: then it all-reduces and IO1D.enter splits.
        sp = self.sp and not positions_follow
        return VocabParallelEmbedding.from_embedding(
            emb, self.mesh, sequence_parallel=sp, seq_dim=SEQ
        )

    def position_embedding(self, emb: nn.Embedding) -> nn.Module:
        return emb  # replicated table (small); split with the stream by IO1D.enter

    def output_head(self, linear: nn.Linear) -> nn.Module:
        return ColumnParallelLinear.from_linear(linear, self.mesh)  # weight: vocabulary rows

    def io(self, *, head: nn.Module | None, positions_follow: bool) -> LMIO:
        return IO1D(self.mesh, sequence_parallel=self.sp, split_on_enter=positions_follow)
