"""``TpLayout``: which mesh axes split an activation of shape ``(batch, ..., hidden)``.

[Note: activation layout] A multi-dimensional tensor-parallel activation is split along its first
dim (the batch) by ``row_axes`` and along its last dim (the hidden features) by ``hidden_axis``.
The batch is cut into ``prod(size(a) for a in row_axes)`` equal chunks and a rank holds chunk
``ravel(coord(a) for a in row_axes)`` (row-major, first axis outermost), and block
``coord(hidden_axis)`` of ``size(hidden_axis)`` equal blocks of the hidden dim. Only the batch is
split (never the sequence), so attention needs no communication.

[Note: vector parameters] A parameter indexed by the hidden dim (bias, LayerNorm weight, the
columns of a non-vocabulary-parallel embedding) is needed, block ``coord(hidden_axis)``, by every
rank that holds that hidden block. It is stored once per block, cut in ``size(row_axes[-1])``
chunks along the hidden dim, chunk ``coord(row_axes[-1])``, and replicated along the outer row
axes (the depth of 2.5D, the weight axis of 3D). Forward all-gathers it along ``row_axes[-1]``;
backward reduce-scatters its gradient there and all-reduces the chunk along the outer row axes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from colossal_contracts import ConfigError

from .._autograd import copy_to_axis, gather_along, local_chunk, split_along
from .._mesh import ProcessMesh
from .._torch_op import torch_function_op

__all__ = [
    "TpLayout",
    "gather_from_layout",
    "materialize_vector",
    "split_to_layout",
    "vector_chunk",
]


@dataclass(frozen=True)
class TpLayout:
    """The mesh axes that split an activation (see [Note: activation layout]).

    Attributes:
        row_axes: axes splitting dim 0 (batch), outermost first; at least one.
        hidden_axis: axis splitting the last dim (hidden features, or the vocabulary of logits).
    """

    row_axes: tuple[str, ...]
    hidden_axis: str

    def __post_init__(self) -> None:
        if not self.row_axes or self.hidden_axis in self.row_axes:
            raise ConfigError(
                f"TpLayout needs at least one row axis and a hidden axis that is not a row axis, "
                f"got row_axes={self.row_axes}, hidden_axis={self.hidden_axis!r}"
            )

    @property
    def chunk_axis(self) -> str:
        """The innermost row axis: vector parameters and vocabularies are cut along it."""
        return self.row_axes[-1]

    @property
    def replica_axes(self) -> tuple[str, ...]:
        """The outer row axes, along which vector parameters are replicated."""
        return self.row_axes[:-1]

    def num_row_chunks(self, mesh: ProcessMesh) -> int:
        """How many equal chunks the batch is cut into."""
        return math.prod(mesh.size(a) for a in self.row_axes)

    def row_chunk(self, mesh: ProcessMesh) -> int:
        """Index of this rank's batch chunk."""
        index = 0
        for a in self.row_axes:
            index = index * mesh.size(a) + mesh.coord(a)
        return index

    def check_batch(self, batch: int, mesh: ProcessMesh, *, what: str) -> None:
        """``ConfigError`` unless ``batch`` splits into the layout's row chunks."""
        n = self.num_row_chunks(mesh)
        if batch % n != 0:
            raise ConfigError(
                f"{what}: batch {batch} must be a multiple of {n} (the ranks along "
                f"{'*'.join(self.row_axes)}); change the batch size"
            )


def split_to_layout(
    x: torch.Tensor, mesh: ProcessMesh, layout: TpLayout, *, hidden: bool = True
) -> torch.Tensor:
    """This rank's block of a full tensor ``x`` (``hidden=False`` for token ids: batch only).

    Differentiable: the gradient of ``x`` is all-gathered, so a replicated full input gets its full
    gradient on every rank. Raises ``ConfigError`` before any collective when a dim does not split.
    """
    layout.check_batch(x.shape[0], mesh, what="split_to_layout")
    if hidden and x.shape[-1] % mesh.size(layout.hidden_axis) != 0:
        raise ConfigError(
            f"split_to_layout: last dim {x.shape[-1]} must be a multiple of "
            f"{mesh.size(layout.hidden_axis)} (axis {layout.hidden_axis!r})"
        )
    if not x.requires_grad:
        for a in layout.row_axes:
            x = local_chunk(x, mesh.comm, a, 0)
        return local_chunk(x, mesh.comm, layout.hidden_axis, -1) if hidden else x
    for a in layout.row_axes:
        x = split_along(x, mesh.comm, a, 0)
    return split_along(x, mesh.comm, layout.hidden_axis, -1) if hidden else x


def gather_from_layout(
    x: torch.Tensor, mesh: ProcessMesh, layout: TpLayout, *, hidden: bool = True
) -> torch.Tensor:
    """The full tensor from every rank's block (inverse of ``split_to_layout``), on every rank.

    Backward keeps this rank's block of the gradient: the consumer is assumed replicated.
    """
    if hidden:
        x = gather_along(x, mesh.comm, layout.hidden_axis, -1)
    for a in reversed(layout.row_axes):
        x = gather_along(x, mesh.comm, a, 0)
    return x


@torch_function_op
def materialize_vector(
    p: torch.Tensor, mesh: ProcessMesh, layout: TpLayout, dim: int = -1
) -> torch.Tensor:
    """The hidden block of a vector parameter from its stored chunk ([Note: vector parameters])."""
    for a in layout.replica_axes:
        p = copy_to_axis(p, mesh.comm, a)
    return gather_along(p, mesh.comm, layout.chunk_axis, dim, grad="reduce_scatter")


def vector_chunk(
    full: torch.Tensor, mesh: ProcessMesh, layout: TpLayout, dim: int = -1
) -> torch.Tensor:
    """This rank's stored chunk of a full vector parameter (its hidden block, then its chunk)."""
    block = full.chunk(mesh.size(layout.hidden_axis), dim=dim)[mesh.coord(layout.hidden_axis)]
    q = mesh.size(layout.chunk_axis)
    return block.chunk(q, dim=dim)[mesh.coord(layout.chunk_axis)].contiguous()
