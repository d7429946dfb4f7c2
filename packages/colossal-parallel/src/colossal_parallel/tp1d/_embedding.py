"""1D embeddings: split along the embedding dim, or along the vocabulary.

``ParallelEmbedding`` keeps columns ``[c*D/p, (c+1)*D/p)`` of the table and all-gathers its output
along the last dim. ``VocabParallelEmbedding`` keeps rows ``[c*V/p, (c+1)*V/p)``: a rank looks up the
tokens in its range, writes zeros for the others, and the partial outputs are all-reduced (or, with
sequence parallelism, reduce-scattered along ``seq_dim``). The vocabulary split is the one the
vocabulary-parallel LM head and cross-entropy use, so the table can be tied to the head.
"""

from __future__ import annotations

from typing import Any, TypeVar

import torch
import torch.nn.functional as F
from torch import nn

from .._autograd import gather_along, reduce_from_axis, reduce_scatter_along
from .._config import require_plain_embedding
from .._mesh import ProcessMesh
from ._base import Layer1D

__all__ = ["ParallelEmbedding", "VocabParallelEmbedding"]

_E = TypeVar("_E", bound="_Embedding1D")


class _Embedding1D(Layer1D):
    """What the two embeddings share: ``from_embedding``; subclasses say which shard they keep."""

    weight: nn.Parameter

    def _weight_shard(self, weight: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    @classmethod
    def from_embedding(cls: type[_E], emb: nn.Embedding, mesh: ProcessMesh, **kwargs: Any) -> _E:
        """This rank's shard of an unsharded ``nn.Embedding`` (same on every rank).

        Only a plain table converts: ``padding_idx``, ``max_norm`` and ``sparse`` raise
        ``ConfigError``.
        """
        require_plain_embedding(emb, cls.__name__)
        layer = cls(
            emb.num_embeddings,
            emb.embedding_dim,
            mesh,
            dtype=emb.weight.dtype,
            device=emb.weight.device,
            **kwargs,
        )
        with torch.no_grad():
            layer.weight.copy_(layer._weight_shard(emb.weight))
        return layer


class ParallelEmbedding(_Embedding1D):
    """Embedding table split along the embedding dim; output ``(..., D)`` replicated."""

    weight: nn.Parameter  # (V, D/p)

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        mesh: ProcessMesh,
        *,
        axis: str = "tp",
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__(mesh, axis)
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.dim_per_rank = self._per_rank(embedding_dim, "embedding_dim")
        self.weight = nn.Parameter(
            torch.randn(num_embeddings, self.dim_per_rank, dtype=dtype, device=device)
        )

    def _weight_shard(self, weight: torch.Tensor) -> torch.Tensor:
        return self._own_chunk(weight, 1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out = F.embedding(ids, self.weight)  # (..., D/p)
        return gather_along(out, self.mesh.comm, self.axis, -1)  # (..., D)


class VocabParallelEmbedding(_Embedding1D):
    """Embedding table split along the vocabulary; output replicated (or sequence-split)."""

    weight: nn.Parameter  # (V/p, D): rows [vocab_start, vocab_end)

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        mesh: ProcessMesh,
        *,
        sequence_parallel: bool = False,
        seq_dim: int = 1,
        axis: str = "tp",
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__(mesh, axis)
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.vocab_per_rank = self._per_rank(num_embeddings, "num_embeddings")
        self.vocab_start = mesh.coord(axis) * self.vocab_per_rank
        self.vocab_end = self.vocab_start + self.vocab_per_rank
        self.sequence_parallel, self.seq_dim = sequence_parallel, seq_dim
        self.weight = nn.Parameter(
            torch.randn(self.vocab_per_rank, embedding_dim, dtype=dtype, device=device)
        )

    def _weight_shard(self, weight: torch.Tensor) -> torch.Tensor:
        return self._own_chunk(weight, 0)  # rows [vocab_start, vocab_end)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        outside = (ids < self.vocab_start) | (ids >= self.vocab_end)
        local = (ids - self.vocab_start).masked_fill(outside, 0)
        out = F.embedding(local, self.weight)  # (..., D), zero rows for tokens of other ranks
        out = out.masked_fill(outside.unsqueeze(-1), 0.0)
        if self.sequence_parallel:
            return reduce_scatter_along(out, self.mesh.comm, self.axis, self.seq_dim)
        return reduce_from_axis(out, self.mesh.comm, self.axis)
