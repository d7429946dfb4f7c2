"""``GridEmbedding`` and ``GridVocabEmbedding``: token lookups whose output has a ``TpLayout``.

``GridEmbedding`` keeps the whole vocabulary and splits the embedding columns: its columns are a
vector parameter along dim 1 ([Note: vector parameters]). ``GridVocabEmbedding`` also splits the
vocabulary along ``chunk_axis``: the ranks along that axis all-gather their token ids, look up the
ids that fall in their vocabulary block (zeros elsewhere) and reduce-scatter the partial
embeddings back to batch chunks, so the weight is stored once per (vocabulary, hidden) block.
"""

from __future__ import annotations

from typing import TypeVar

import torch
import torch.nn.functional as F
from torch import nn

from colossal_contracts import ConfigError

from .._autograd import copy_to_axis, reduce_scatter_along
from .._config import divide, require_plain_embedding
from .._mesh import ProcessMesh
from .._torch_op import torch_function_op
from ._common import block_generator
from ._layout import TpLayout, materialize_vector, vector_chunk
from ._mode import ModeLayer

__all__ = ["GridEmbedding", "GridVocabEmbedding"]

_E = TypeVar("_E", bound="_GridTable")


def _check_ids(ids: torch.Tensor, what: str) -> None:
    if ids.dtype not in (torch.int64, torch.int32) or ids.dim() < 1:
        raise ConfigError(
            f"{what}: expected integer token ids of shape (batch, ...), got {ids.dtype} "
            f"{tuple(ids.shape)}; split them with split_to_layout(ids, mesh, layout, hidden=False)"
        )


class _GridTable(ModeLayer):
    """What the two embeddings share: ``from_embedding``; subclasses say which piece they keep."""

    weight: nn.Parameter

    def _weight_piece(self, w: torch.Tensor) -> torch.Tensor:
        """This rank's piece of the full table ``w (num_embeddings, embedding_dim)``."""
        raise NotImplementedError

    @classmethod
    def from_embedding(
        cls: type[_E], emb: nn.Embedding, mesh: ProcessMesh, *, layout: TpLayout | None = None
    ) -> _E:
        """This rank's piece of an unsharded ``nn.Embedding`` (a plain table; see
        ``require_plain_embedding``)."""
        require_plain_embedding(emb, cls.__name__)
        out = cls(*emb.weight.shape, mesh, layout=layout, dtype=emb.weight.dtype)
        with torch.no_grad():
            out.weight.copy_(out._weight_piece(emb.weight.detach()))
        return out


class GridEmbedding(_GridTable):
    """Embedding of ``num_embeddings`` rows; output block ``(..., dim / size(hidden_axis))``."""

    weight: nn.Parameter  # (num_embeddings, dim / (q_hidden * q_chunk))

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        mesh: ProcessMesh,
        *,
        layout: TpLayout | None = None,
        dtype: torch.dtype | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__(mesh, layout)
        lay = self.layout
        parts = mesh.size(lay.hidden_axis) * mesh.size(lay.chunk_axis)
        n = divide(embedding_dim, parts, what=f"{type(self).__name__} embedding_dim")
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        g = block_generator(mesh, seed, (lay.hidden_axis, lay.chunk_axis), tag=1)
        self.weight = nn.Parameter(torch.randn(num_embeddings, n, generator=g, dtype=dtype))

    def _weight_piece(self, w: torch.Tensor) -> torch.Tensor:
        return vector_chunk(w, self.mesh, self.layout, dim=1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        _check_ids(ids, type(self).__name__)
        w = materialize_vector(self.weight, self.mesh, self.layout, dim=1)
        return F.embedding(ids, w)


class GridVocabEmbedding(_GridTable):
    """Vocabulary-parallel embedding; output block ``(..., dim / size(hidden_axis))``."""

    weight: nn.Parameter  # (num_embeddings / q_chunk, dim / q_hidden), replicated on replica axes

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        mesh: ProcessMesh,
        *,
        layout: TpLayout | None = None,
        dtype: torch.dtype | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__(mesh, layout)
        lay, name = self.layout, type(self).__name__
        v = divide(num_embeddings, mesh.size(lay.chunk_axis), what=f"{name} num_embeddings")
        h = divide(embedding_dim, mesh.size(lay.hidden_axis), what=f"{name} embedding_dim")
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.vocab_start = mesh.coord(lay.chunk_axis) * v
        g = block_generator(mesh, seed, (lay.chunk_axis, lay.hidden_axis), tag=2)
        self.weight = nn.Parameter(torch.randn(v, h, generator=g, dtype=dtype))

    def _weight_piece(self, w: torch.Tensor) -> torch.Tensor:
        """The (vocabulary, hidden) block of this rank."""
        mesh, lay = self.mesh, self.layout
        w = w.chunk(mesh.size(lay.chunk_axis), 0)[mesh.coord(lay.chunk_axis)]
        return w.chunk(mesh.size(lay.hidden_axis), 1)[mesh.coord(lay.hidden_axis)]

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        _check_ids(ids, type(self).__name__)
        return _vocab_lookup(ids, self.weight, self.mesh, self.layout, self.vocab_start)


@torch_function_op  # one operator over the parameter ([Note: operators a mode sees])
def _vocab_lookup(
    ids: torch.Tensor, w: torch.Tensor, mesh: ProcessMesh, layout: TpLayout, vocab_start: int
) -> torch.Tensor:
    comm, axis = mesh.comm, layout.chunk_axis
    for a in layout.replica_axes:
        w = copy_to_axis(w, comm, a)
    all_ids = comm.all_gather(ids, axis, dim=0)  # ids of every chunk along `axis`
    local = all_ids - vocab_start
    inside = (local >= 0) & (local < w.shape[0])
    part = F.embedding(local.clamp(0, w.shape[0] - 1), w) * inside.unsqueeze(-1).to(w.dtype)
    return reduce_scatter_along(part, comm, axis, 0)
