"""``TpLayers``: how one tensor-parallel mode shards each kind of layer a decoder has.

A model's plan (``gpt/parallelize.py``, ``palm/parallelize.py``) says *which* layer is which kind
(column-style projection into the heads or the MLP, row-style projection back, norm, embedding,
key/value projection, output); a ``TpLayers`` of the mesh's mode says *how* to shard that kind.
Every method takes the unsharded module and returns this rank's sharded replacement built from it
(``from_linear`` and friends), so sharding is a pure function of the weights.

[Note: fused projections] Several heads' worth of outputs fused in one Linear (GPT's ``qkv``
holds all of q, then all of k, then all of v) are split by the tensor-parallel layers into
contiguous blocks of the output dim. ``interleave_rows`` first reorders the output rows so that
block ``r`` holds q, k and v of rank ``r``'s heads, and the model's ``chunk(3, dim=-1)`` then
splits the local output correctly.
"""

from __future__ import annotations

import torch
from torch import nn

from colossal_contracts import ConfigError
from colossal_parallel import ProcessMesh

from .._io import LMIO

__all__ = ["TpLayers", "interleave_rows"]


def interleave_rows(linear: nn.Linear, parts: int, blocks: int) -> nn.Linear:
    """A copy of ``linear`` whose output rows, viewed as ``parts`` fused parts of ``blocks``
    blocks each, are reordered block-major (see [Note: fused projections])."""
    out = nn.Linear(
        linear.in_features,
        linear.out_features,
        bias=linear.bias is not None,
        dtype=linear.weight.dtype,
        device=linear.weight.device,
    )
    with torch.no_grad():
        w = linear.weight.view(parts, blocks, -1, linear.in_features).transpose(0, 1)
        out.weight.copy_(w.reshape(linear.out_features, linear.in_features))
        if linear.bias is not None:
            b = linear.bias.view(parts, blocks, -1).transpose(0, 1)
            out.bias.copy_(b.reshape(-1))
    return out


class TpLayers:
    """The sharding rules of one mode on one mesh (subclasses: ``Layers1D``, ``GridLayers``)."""

    mesh: ProcessMesh
    mode: str

    def __init__(self, mesh: ProcessMesh) -> None:
        self.mesh = mesh
        self.mode = mesh.config.tp_mode

    @property
    def head_parts(self) -> int:
        """Into how many blocks the heads (and any fused output) of a column layer are cut."""
        raise NotImplementedError

    def check_heads(self, num_heads: int, what: str) -> None:
        """``ConfigError`` unless ``num_heads`` splits evenly over ``head_parts``."""
        if num_heads % self.head_parts:
            raise ConfigError(
                f"{what}: {num_heads} heads cannot be split over the {self.head_parts} ranks that "
                f"share a {self.mode} tensor-parallel layer; choose a head count that is a "
                f"multiple of {self.head_parts} or a smaller tensor-parallel size"
            )

    def column(self, linear: nn.Linear) -> nn.Module:
        """A projection whose output (heads, MLP width) is split over the ranks."""
        raise NotImplementedError

    def row(self, linear: nn.Linear) -> nn.Module:
        """The projection back to the residual stream from a split input."""
        raise NotImplementedError

    def kv(self, linear: nn.Linear, num_heads: int, num_kv_heads: int) -> nn.Module:
        """Key or value projection of ``num_kv_heads`` heads feeding ``num_heads`` query heads."""
        raise NotImplementedError

    def norm(self, norm: nn.Module) -> nn.Module:
        """A LayerNorm or RMSNorm over the residual stream."""
        raise NotImplementedError

    def token_embedding(self, emb: nn.Embedding, *, positions_follow: bool) -> nn.Module:
        """The token embedding (possibly tied to the head); ``positions_follow`` when the model
        adds a position embedding to its output before the first block (GPT)."""
        raise NotImplementedError

    def position_embedding(self, emb: nn.Embedding) -> nn.Module:
        """A learned position table, looked up with ``arange(T)``."""
        raise NotImplementedError

    def output_head(self, linear: nn.Linear) -> nn.Module:
        """An untied LM head ``hidden -> vocab``; used through ``io``, never called by the model."""
        raise NotImplementedError

    def io(self, *, head: nn.Module | None, positions_follow: bool) -> LMIO:
        """The model boundary: ``head`` is the sharded untied head, None when tied."""
        raise NotImplementedError
