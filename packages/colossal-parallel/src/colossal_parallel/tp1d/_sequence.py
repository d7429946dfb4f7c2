"""Megatron sequence parallelism for 1D: enter and leave the sequence-split regions.

[Note: sequence parallelism] Between tensor-parallel blocks the activations are replicated on every
``tp`` rank, and LayerNorm and dropout there repeat the same work ``p`` times. Sequence parallelism
splits those regions along the sequence (``seq_dim``): the row-parallel layer ending a block
reduce-scatters its output along the sequence instead of all-reducing it, and the column-parallel
layer starting the next block all-gathers the sequence back (its gradient is reduce-scattered).
An all-reduce costs one reduce-scatter plus one all-gather, so communication is unchanged while
the activations of LayerNorm, dropout and the residual stream shrink ``p`` times. Replicated
parameters used inside the split regions (LayerNorm, the row-parallel bias, position embeddings)
see only their rank's tokens, so their gradients are all-reduced along ``tp``.
Dropout inside split regions must draw different masks per rank (each rank holds other tokens).
"""

from __future__ import annotations

import torch

from .._autograd import gather_along, split_along
from .._config import divide
from .._mesh import ProcessMesh

__all__ = ["gather_sequence", "split_sequence"]


def split_sequence(
    x: torch.Tensor, mesh: ProcessMesh, *, seq_dim: int = 1, axis: str = "tp"
) -> torch.Tensor:
    """Keep this rank's ``1/p`` of a replicated ``x`` along ``seq_dim`` (gradient: all-gather)."""
    divide(x.shape[seq_dim], mesh.size(axis), what=f"sequence length (dim {seq_dim})")
    return split_along(x, mesh.comm, axis, seq_dim)


def gather_sequence(
    x: torch.Tensor, mesh: ProcessMesh, *, seq_dim: int = 1, axis: str = "tp"
) -> torch.Tensor:
    """All-gather a sequence-split ``x`` for a replicated consumer (gradient: keep own chunk)."""
    return gather_along(x, mesh.comm, axis, seq_dim)
