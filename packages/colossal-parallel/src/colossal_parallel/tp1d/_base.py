"""``Layer1D``: what every 1D layer shares: a mesh, the axis it is split along, and its shards.

[Note: 1D shards] A 1D layer split along ``axis`` keeps, on the rank at ``coord(axis) == c``,
chunk ``c`` of ``size(axis)`` equal chunks of each split parameter (which dim is split is the
layer's choice); replicated parameters are whole on every rank. ``from_linear`` and
``from_embedding`` cut these chunks from an unsharded module that is the same on every rank.
"""

from __future__ import annotations

import torch
from torch import nn

from .._config import divide
from .._mesh import ProcessMesh

__all__ = ["Layer1D"]


class Layer1D(nn.Module):
    """Base of the 1D layers: binds ``mesh`` and ``axis`` and checks the axis exists."""

    mesh: ProcessMesh
    axis: str

    def __init__(self, mesh: ProcessMesh, axis: str) -> None:
        super().__init__()
        mesh.size(axis)  # unknown axis: ConfigError now, not at the first forward
        self.mesh, self.axis = mesh, axis

    def _per_rank(self, size: int, what: str) -> int:
        """``size / size(axis)``; ``ConfigError`` naming this layer and ``what`` otherwise."""
        name = f"{type(self).__name__} {what} ({self.axis})"
        return divide(size, self.mesh.size(self.axis), what=name)

    def _own_chunk(self, full: torch.Tensor, dim: int) -> torch.Tensor:
        """This rank's chunk of ``full`` along ``dim`` (see [Note: 1D shards])."""
        n = full.shape[dim] // self.mesh.size(self.axis)
        return full.narrow(dim, self.mesh.coord(self.axis) * n, n)
