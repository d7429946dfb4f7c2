"""PaLM-family decoder, leaf modules first. Shapes: B batch, T time, C hidden, H query heads,
K key/value heads, D head width, F SwiGLU width, V vocabulary.

Head counts are read from tensor shapes in ``forward`` (``view(B, T, -1, D)``), so a
tensor-parallel plan that gives a rank a slice of the heads needs no change here.
"""

from __future__ import annotations

import math
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from .._attention import CausalAttention
from .._checkpointing import CheckpointedBlock
from .._inputs import check_token_ids
from .._io import LMIO
from .._kv_cache import KVCache, LayerKV, cached_attention
from .._lm import embed_ids, lm_head
from .._rotary import apply_rotary, rotary_tables
from .config import PaLMConfig

__all__ = ["PaLM", "PaLMAttention", "PaLMBlock", "SwiGLU", "build_norm"]


def build_norm(cfg: PaLMConfig) -> nn.Module:
    """The config's norm over ``hidden_size``, without bias (PaLM has none; Llama's RMSNorm neither)."""
    if cfg.norm == "rmsnorm":
        return nn.RMSNorm(cfg.hidden_size, eps=cfg.norm_eps)
    return nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps, bias=False)


class PaLMAttention(nn.Module):
    """Causal attention with rotary positions and ``K`` shared key/value heads (K=1: multi-query)."""

    def __init__(self, cfg: PaLMConfig):
        super().__init__()
        c, d = cfg.hidden_size, cfg.head_size
        self.head_dim = d
        self.q = nn.Linear(c, cfg.num_heads * d, bias=False)
        self.k = nn.Linear(c, cfg.num_kv_heads * d, bias=False)
        self.v = nn.Linear(c, cfg.num_kv_heads * d, bias=False)
        self.proj = nn.Linear(cfg.num_heads * d, c, bias=False)
        self.core = CausalAttention()  # a long-sequence plan swaps in ring attention or Ulysses

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: LayerKV | None = None,
    ) -> torch.Tensor:
        d = self.head_dim
        q, k, v = self.q(x), self.k(x), self.v(x)  # whole sequence even when x holds a slice
        B, T = q.shape[:2]
        q = q.reshape(B, T, -1, d).transpose(1, 2)  # (B, H, T, D)
        k = k.reshape(B, T, -1, d).transpose(1, 2)  # (B, K, T, D)
        v = v.reshape(B, T, -1, d).transpose(1, 2)  # (B, K, T, D)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if cache is not None:  # [Note: incremental decoding]: K heads cached, not H
            k, v = cache.append(k, v)
        rep = q.shape[1] // k.shape[1]  # query head h reads key/value head h // rep
        if rep > 1:
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        y = self.core(q, k, v) if cache is None else cached_attention(q, k, v)  # (B, H, T, D)
        return self.proj(y.transpose(1, 2).reshape(B, T, -1))


class SwiGLU(nn.Module):
    """``proj(silu(gate(x)) * up(x))`` (Shazeer, 2020)."""

    def __init__(self, cfg: PaLMConfig):
        super().__init__()
        self.gate = nn.Linear(cfg.hidden_size, cfg.ffn_size, bias=False)
        self.up = nn.Linear(cfg.hidden_size, cfg.ffn_size, bias=False)
        self.proj = nn.Linear(cfg.ffn_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.silu(self.gate(x)) * self.up(x))  # (B, T, F) inside


class PaLMBlock(CheckpointedBlock):
    """Parallel: ``x + attn(ln1(x)) + mlp(ln1(x))`` (``ln2`` is None). Sequential (Llama):
    ``x + attn(ln1(x))``, then ``+ mlp(ln2(.))``."""

    def __init__(self, cfg: PaLMConfig):
        super().__init__()
        self.parallel = cfg.parallel_block
        self.ln1 = build_norm(cfg)
        self.attn = PaLMAttention(cfg)
        self.ln2 = None if cfg.parallel_block else build_norm(cfg)
        self.mlp = SwiGLU(cfg)

    def _forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: LayerKV | None = None,
    ) -> torch.Tensor:
        if self.ln2 is None:
            h = self.ln1(x)
            return x + self.attn(h, cos, sin, cache) + self.mlp(h)
        x = x + self.attn(self.ln1(x), cos, sin, cache)
        return x + self.mlp(self.ln2(x))


class PaLM(nn.Module):
    """The model. ``forward(idx)`` gives logits (B, T, V); ``forward(idx, targets)`` the mean loss.

    With ``tie_embeddings`` the output matrix is ``wte.weight`` and ``lm_head`` is None.
    """

    def __init__(self, cfg: PaLMConfig):
        super().__init__()
        self.config = cfg
        self.io = LMIO()
        self.wte = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.blocks = nn.ModuleList(PaLMBlock(cfg) for _ in range(cfg.num_layers))
        self.ln_f = build_norm(cfg)
        self.lm_head = (
            None if cfg.tie_embeddings else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        )
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """N(0, 0.02) for matrices, output projections scaled by 1/sqrt(2 * layers); norms 1."""
        resid_std = 0.02 / math.sqrt(2 * self.config.num_layers)
        for name, p in self.named_parameters():
            if p.dim() == 1:
                p.fill_(1.0)
            else:
                p.normal_(0.0, resid_std if name.endswith("proj.weight") else 0.02)

    @property
    def output_weight(self) -> torch.Tensor:
        """The ``(V, C)`` matrix of the output head (the embedding when tied)."""
        return self.wte.weight if self.lm_head is None else self.lm_head.weight

    def forward(
        self,
        idx: torch.Tensor,
        targets: torch.Tensor | None = None,
        *,
        cache: KVCache | None = None,
    ) -> torch.Tensor:
        if cache is not None:
            return self._decode(idx, cache)
        x = self.embed(idx)
        cos, sin = self.rotary(idx.shape[1], x)
        for block in self.blocks:
            x = block(x, cos, sin)
        return self.head(x, targets)

    def _decode(self, idx: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Logits ``(B, T, V)`` of the tokens ``idx`` that follow the cached positions
        ([Note: incremental decoding]); unsharded models only."""
        check_token_ids(idx, self.config.vocab_size)
        T = idx.shape[1]
        start = cache.check_room(T, self.config.max_seq_len)
        x = self.wte(idx)  # (B, T, C)
        cos, sin = rotary_tables(
            start + T,
            self.config.head_size,
            theta=self.config.rope_theta,
            device=x.device,
            dtype=x.dtype,
        )
        cos, sin = cos[start:], sin[start:]  # (T, D): this step's positions
        for i, block in enumerate(self.blocks):
            x = block(x, cos, sin, cache.layer(i))
        cache.advance(T)
        return lm_head(self.io, self.config, self.ln_f, self.output_weight, x, None)

    def embed(self, idx: torch.Tensor) -> torch.Tensor:
        """Ids ``(B, T)`` to the first block's input ``(B, T, C)``."""
        return embed_with(self, idx)

    def rotary(self, seq_len: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``cos, sin`` tables for the positions this rank's attention sees of ``seq_len``."""
        return rotary_with(self, seq_len, x)

    def head(self, x: torch.Tensor, targets: torch.Tensor | None) -> torch.Tensor:
        """The last block's output to logits, or to the mean loss with ``targets``."""
        return head_with(self, x, targets)


class _PaLMEnds(Protocol):
    """What ``embed``, ``rotary`` and ``head`` read: a ``PaLM``, or a pipeline stage that holds
    its ends (``PaLMStage``)."""

    @property
    def config(self) -> PaLMConfig: ...
    @property
    def io(self) -> LMIO: ...
    @property
    def wte(self) -> nn.Embedding: ...
    @property
    def ln_f(self) -> nn.Module: ...
    @property
    def lm_head(self) -> nn.Linear | None: ...


def embed_with(m: _PaLMEnds, idx: torch.Tensor) -> torch.Tensor:
    """Ids ``(B, T)`` to the first block's input ``(B, T, C)``."""
    return embed_ids(m.io, m.config, idx, lambda ids, _: m.wte(ids))


def rotary_with(m: _PaLMEnds, seq_len: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos, sin`` tables for the positions this rank's attention sees of ``seq_len``."""
    cos, sin = rotary_tables(
        seq_len, m.config.head_size, theta=m.config.rope_theta, device=x.device, dtype=x.dtype
    )
    pos = m.io.positions(seq_len, x.device)
    return (cos, sin) if pos.numel() == seq_len else (cos[pos], sin[pos])


def head_with(m: _PaLMEnds, x: torch.Tensor, targets: torch.Tensor | None) -> torch.Tensor:
    """The last block's output to logits, or to the mean loss with ``targets``."""
    weight = m.wte.weight if m.lm_head is None else m.lm_head.weight
    return lm_head(m.io, m.config, m.ln_f, weight, x, targets)
