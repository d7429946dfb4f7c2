"""1D embeddings: split along the embedding dim, or along the vocabulary.

``ParallelEmbedding`` keeps columns ``[c*D/p, (c+1)*D/p)`` of the table and all-gathers its output
along the last dim. ``VocabParallelEmbedding`` keeps rows ``[c*V/p, (c+1)*V/p)``: a rank looks up the
tokens in its range, writes zeros for the others, and the partial outputs are all-reduced (or, with
sequence parallelism, reduce-scattered along ``seq_dim``). The vocabulary split is the one the
vocabulary-parallel LM head and cross-entropy use, so the table can be tied to the head.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from colossal_contracts import ConfigError

from .._autograd import gather_along, reduce_from_axis, reduce_scatter_along
from .._config import divide
from .._mesh import ProcessMesh

__all__ = ["ParallelEmbedding", "VocabParallelEmbedding"]


def _check_plain(emb: nn.Embedding, cls: str) -> None:
    if emb.padding_idx is not None or emb.max_norm is not None or emb.sparse:
        raise ConfigError(
            f"{cls}.from_embedding supports plain nn.Embedding only (no padding_idx, max_norm "
            "or sparse); mask padding tokens in the loss instead"
        )


class ParallelEmbedding(nn.Module):
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
        super().__init__()
        p = mesh.size(axis)
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.dim_per_rank = divide(
            embedding_dim, p, what=f"ParallelEmbedding embedding_dim ({axis})"
        )
        self.mesh, self.axis = mesh, axis
        self.weight = nn.Parameter(
            torch.randn(num_embeddings, self.dim_per_rank, dtype=dtype, device=device)
        )

    @classmethod
    def from_embedding(
        cls, emb: nn.Embedding, mesh: ProcessMesh, **kwargs: Any
    ) -> ParallelEmbedding:
        """This rank's shard of an unsharded ``nn.Embedding`` (same on every rank)."""
        _check_plain(emb, cls.__name__)
        layer = cls(
            emb.num_embeddings,
            emb.embedding_dim,
            mesh,
            dtype=emb.weight.dtype,
            device=emb.weight.device,
            **kwargs,
        )
        c, n = mesh.coord(layer.axis), layer.dim_per_rank
        with torch.no_grad():
            layer.weight.copy_(emb.weight[:, c * n : (c + 1) * n])
        return layer

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out = F.embedding(ids, self.weight)  # (..., D/p)
        return gather_along(out, self.mesh.comm, self.axis, -1)  # (..., D)


class VocabParallelEmbedding(nn.Module):
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
        super().__init__()
        p = mesh.size(axis)
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.vocab_per_rank = divide(
            num_embeddings, p, what=f"VocabParallelEmbedding num_embeddings ({axis})"
        )
        self.vocab_start = mesh.coord(axis) * self.vocab_per_rank
        self.vocab_end = self.vocab_start + self.vocab_per_rank
        self.mesh, self.axis = mesh, axis
        self.sequence_parallel, self.seq_dim = sequence_parallel, seq_dim
        self.weight = nn.Parameter(
            torch.randn(self.vocab_per_rank, embedding_dim, dtype=dtype, device=device)
        )

    @classmethod
    def from_embedding(
        cls, emb: nn.Embedding, mesh: ProcessMesh, **kwargs: Any
    ) -> VocabParallelEmbedding:
        """This rank's rows of an unsharded ``nn.Embedding`` (same on every rank)."""
        _check_plain(emb, cls.__name__)
        layer = cls(
            emb.num_embeddings,
            emb.embedding_dim,
            mesh,
            dtype=emb.weight.dtype,
            device=emb.weight.device,
            **kwargs,
        )
        with torch.no_grad():
            layer.weight.copy_(emb.weight[layer.vocab_start : layer.vocab_end])
        return layer

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        outside = (ids < self.vocab_start) | (ids >= self.vocab_end)
        local = (ids - self.vocab_start).masked_fill(outside, 0)
        out = F.embedding(local, self.weight)  # (..., D), zero rows for tokens of other ranks
        out = out.masked_fill(outside.unsqueeze(-1), 0.0)
        if self.sequence_parallel:
            return reduce_scatter_along(out, self.mesh.comm, self.axis, self.seq_dim)
        return reduce_from_axis(out, self.mesh.comm, self.axis)
