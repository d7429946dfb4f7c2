"""A two-block GPT-style transformer, unsharded and built from the multi-dimensional layers.

The parallel model is generic over a mode's "kit" (its layer classes); its blocks are built from
the unsharded model's weights, so the two must train identically.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, HIDDEN, HEADS, SEQ, FFN = 16, 8, 2, 4, 32


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int) -> torch.Tensor:
    """Causal attention of (b, S, heads*hd) projections; heads are independent."""
    b, s, f = q.shape
    hd = f // heads

    def split(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(b, s, heads, hd).transpose(1, 2)  # (b, heads, S, hd)

    scores = split(q) @ split(k).transpose(-1, -2) / math.sqrt(hd)
    mask = torch.ones(s, s, dtype=torch.bool).tril()
    att = scores.masked_fill(~mask, float("-inf")).softmax(-1)
    return (att @ split(v)).transpose(1, 2).reshape(b, s, f)


class RefBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(HIDDEN), nn.LayerNorm(HIDDEN)
        self.q, self.k, self.v = (nn.Linear(HIDDEN, HIDDEN) for _ in range(3))
        self.proj = nn.Linear(HIDDEN, HIDDEN)
        self.fc1, self.fc2 = nn.Linear(HIDDEN, FFN), nn.Linear(FFN, HIDDEN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.proj(attention(self.q(h), self.k(h), self.v(h), HEADS))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class RefModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(VOCAB, HIDDEN), nn.Embedding(SEQ, HIDDEN)
        self.blocks = nn.ModuleList([RefBlock(), RefBlock()])
        self.lnf = nn.LayerNorm(HIDDEN)
        self.head = nn.Linear(HIDDEN, VOCAB, bias=False)
        with torch.no_grad():  # non-trivial affine parameters, so their gradients are tested
            for m in self.modules():
                if isinstance(m, nn.LayerNorm):
                    m.weight.uniform_(0.5, 1.5)
                    m.bias.uniform_(-0.2, 0.2)

    def forward(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids) + self.pos(pos)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.lnf(x))

    def loss(self, ids: torch.Tensor, pos: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self(ids, pos)
        return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


class ParBlock(nn.Module):
    def __init__(self, ref: RefBlock, mesh, kit: dict, layout) -> None:
        super().__init__()
        LN, Lin = kit["LayerNorm"], kit["Linear"]
        self.heads = HEADS // mesh.size(layout.hidden_axis)
        self.ln1 = LN.from_layernorm(ref.ln1, mesh, layout=layout)
        self.q, self.k, self.v = (
            Lin.from_linear(m, mesh, layout=layout) for m in (ref.q, ref.k, ref.v)
        )
        self.proj = Lin.from_linear(ref.proj, mesh, layout=self.q.out_layout)
        self.ln2 = LN.from_layernorm(ref.ln2, mesh, layout=layout)
        self.fc1 = Lin.from_linear(ref.fc1, mesh, layout=layout)
        self.fc2 = Lin.from_linear(ref.fc2, mesh, layout=self.fc1.out_layout)
        assert self.proj.out_layout == layout and self.fc2.out_layout == layout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.proj(attention(self.q(h), self.k(h), self.v(h), self.heads))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class ParModel(nn.Module):
    def __init__(self, ref: RefModel, mesh, kit: dict) -> None:
        super().__init__()
        lay = kit["layout"]
        self.mesh, self.layout = mesh, lay
        self.tok = kit["VocabParallelEmbedding"].from_embedding(ref.tok, mesh, layout=lay)
        self.pos = kit["Embedding"].from_embedding(ref.pos, mesh, layout=lay)
        self.blocks = nn.ModuleList([ParBlock(b, mesh, kit, lay) for b in ref.blocks])
        self.lnf = kit["LayerNorm"].from_layernorm(ref.lnf, mesh, layout=lay)
        self.head = kit["Classifier"].from_linear(ref.head, mesh, layout=lay)
        self.cross_entropy = kit["cross_entropy"]

    def loss(self, ids: torch.Tensor, pos: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """``ids``, ``pos``: local blocks in ``self.layout``; ``targets`` in the logits' layout."""
        x = self.tok(ids) + self.pos(pos)
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.lnf(x))
        return self.cross_entropy(logits, targets, self.mesh, self.head.out_layout)
