"""Small models whose memory is computed by hand in the tests."""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint


def linear_chain(dims: list[int]) -> nn.Sequential:
    """Linear layers without bias: d0 -> d1 -> ... -> dn."""
    return nn.Sequential(*(nn.Linear(a, b, bias=False) for a, b in itertools.pairwise(dims)))


class Block(nn.Module):
    """A pre-LayerNorm transformer block (no dropout), like GPT-2's, for (B, T, C) inputs."""

    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.ln2 = nn.LayerNorm(hidden)
        self.fc = nn.Linear(hidden, 4 * hidden)
        self.out = nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)  # each (B, T, C)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, D)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class TinyLM(nn.Module):
    """Embedding, ``num_layers`` blocks, LayerNorm, a head tied to the embedding; returns the loss.
    ``checkpointed`` runs each block under non-reentrant ``torch.utils.checkpoint``."""

    def __init__(
        self,
        vocab: int = 64,
        hidden: int = 32,
        heads: int = 2,
        num_layers: int = 2,
        checkpointed: bool = False,
    ):
        super().__init__()
        self.wte = nn.Embedding(vocab, hidden)
        self.blocks = nn.ModuleList(Block(hidden, heads) for _ in range(num_layers))
        self.ln_f = nn.LayerNorm(hidden)
        self.checkpointed = checkpointed

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx)
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if self.checkpointed else block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def tiny_lm() -> TinyLM:
    """A factory for the CLI test (``--model module:factory``)."""
    return TinyLM()
