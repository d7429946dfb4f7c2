"""GPT-2 style decoder, leaf modules first. Shapes: B batch, T time, C hidden, V vocabulary.

Head counts and widths are read from tensor shapes in ``forward``, so a tensor-parallel plan that
gives a rank a slice of the heads (``parallelize.py``) needs no change here.
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
from .config import GPTConfig

__all__ = ["GPT", "MLP", "Block", "CausalSelfAttention"]


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.head_dim = cfg.head_dim
        self.qkv = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size, bias=cfg.bias)
        self.proj = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=cfg.bias)
        self.dropout = cfg.dropout
        self.core = CausalAttention()  # a long-sequence plan swaps in ring attention or Ulysses

    def forward(self, x: torch.Tensor, cache: LayerKV | None = None) -> torch.Tensor:
        qkv = self.qkv(x)  # (B, T, 3C); T is the whole sequence even when x holds a slice of it
        B, T = qkv.shape[:2]
        q, k, v = qkv.chunk(3, dim=-1)  # each (B, T, C)
        q, k, v = (t.reshape(B, T, -1, self.head_dim).transpose(1, 2) for t in (q, k, v))
        p = self.dropout if self.training else 0.0
        if cache is None:
            y = self.core(q, k, v, p)  # (B, H, T, D)
        else:  # [Note: incremental decoding]: over the cached positions too
            y = cached_attention(q, *cache.append(k, v))
        y = y.transpose(1, 2).reshape(B, T, -1)
        return F.dropout(self.proj(y), p, self.training)


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.hidden_size, cfg.ffn_size, bias=cfg.bias)
        self.proj = nn.Linear(cfg.ffn_size, cfg.hidden_size, bias=cfg.bias)
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.fc(x), approximate="tanh")  # (B, T, 4C); GPT-2's "gelu_new"
        return F.dropout(self.proj(h), self.dropout, self.training)


class Block(CheckpointedBlock):
    """Pre-LayerNorm residual block: x + attn(ln1(x)), then + mlp(ln2(x))."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def _forward(self, x: torch.Tensor, cache: LayerKV | None = None) -> torch.Tensor:
        x = x + self.attn(self.ln1(x), cache)
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """The model. ``forward(idx)`` gives logits (B, T, V); ``forward(idx, targets)`` the mean loss.

    The output projection is tied to the token embedding ``wte`` (one parameter, counted once).
    """

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.config = cfg
        self.io = LMIO()
        self.wte = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.wpe = nn.Embedding(cfg.max_seq_len, cfg.hidden_size)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
        self.ln_f = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps, bias=cfg.bias)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """GPT-2 initialisation: N(0, 0.02), residual projections scaled by 1/sqrt(2 * layers)."""
        resid_std = 0.02 / math.sqrt(2 * self.config.num_layers)
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                p.zero_()
            elif ".ln" in name or name.startswith("ln_f"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, resid_std if name.endswith("proj.weight") else 0.02)

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
        for block in self.blocks:
            x = block(x)
        return self.head(x, targets)

    def _decode(self, idx: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Logits ``(B, T, V)`` of the tokens ``idx`` that follow the cached positions
        ([Note: incremental decoding]); unsharded models only."""
        check_token_ids(idx, self.config.vocab_size)
        T = idx.shape[1]
        start = cache.check_room(T, self.config.max_seq_len)
        pos = torch.arange(start, start + T, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))  # (B, T, C)
        for i, block in enumerate(self.blocks):
            x = block(x, cache.layer(i))
        cache.advance(T)
        return lm_head(self.io, self.config, self.ln_f, self.wte.weight, x, None)

    def embed(self, idx: torch.Tensor) -> torch.Tensor:
        """Ids ``(B, T)`` to the first block's input ``(B, T, C)``."""
        return embed_with(self, idx)

    def head(self, x: torch.Tensor, targets: torch.Tensor | None) -> torch.Tensor:
        """The last block's output to logits, or to the mean loss with ``targets``."""
        return head_with(self, x, targets)


class _GPTEnds(Protocol):
    """What ``embed`` and ``head`` read: a ``GPT``, or a pipeline stage that holds its ends
    (``GPTStage``)."""

    @property
    def config(self) -> GPTConfig: ...
    @property
    def io(self) -> LMIO: ...
    @property
    def wte(self) -> nn.Embedding: ...
    @property
    def wpe(self) -> nn.Embedding: ...
    @property
    def drop(self) -> nn.Dropout: ...
    @property
    def ln_f(self) -> nn.LayerNorm: ...


def embed_with(m: _GPTEnds, idx: torch.Tensor) -> torch.Tensor:
    """Ids ``(B, T)`` to the first block's input ``(B, T, C)``."""

    def lookup(ids: torch.Tensor, seq_len: int) -> torch.Tensor:
        pos = m.io.positions(seq_len, ids.device)  # this rank's positions (all unless split)
        return m.drop(m.wte(ids) + m.wpe(pos))  # (B, T, C)

    return embed_ids(m.io, m.config, idx, lookup)


def head_with(m: _GPTEnds, x: torch.Tensor, targets: torch.Tensor | None) -> torch.Tensor:
    """The last block's output to logits, or to the mean loss with ``targets`` (tied head)."""
    return lm_head(m.io, m.config, m.ln_f, m.wte.weight, x, targets)
