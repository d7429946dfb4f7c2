"""A two-block GPT, unsharded and 1D tensor-parallel (optionally sequence-parallel), built from it."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from colossal_parallel import ProcessMesh, copy_to_axis
from colossal_parallel.tp1d import (
    ColumnParallelLinear,
    LayerNorm1D,
    RowParallelLinear,
    VocabParallelEmbedding,
    VocabParallelLMHead,
    vocab_parallel_cross_entropy,
)

V, T, C, NH, LAYERS = 32, 8, 16, 4, 2  # vocabulary, sequence, width, heads, blocks


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int) -> torch.Tensor:
    b, t, c = q.shape  # (B, T, heads * hd)
    q, k, v = (z.view(b, t, heads, c // heads).transpose(1, 2) for z in (q, k, v))
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, heads, T, hd)
    return y.transpose(1, 2).reshape(b, t, c)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.q, self.k, self.v, self.o = (nn.Linear(C, C) for _ in range(4))
        self.fc1, self.fc2 = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.o(_attend(self.q(h), self.k(h), self.v(h), NH))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(V, C), nn.Embedding(T, C)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln_f, self.head = nn.LayerNorm(C), nn.Linear(C, V, bias=False)

    def forward(self, ids: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids) + self.pos.weight[: ids.shape[1]]
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.reshape(-1, V), target.reshape(-1))


class Block1D(nn.Module):
    def __init__(self, ref: Block, mesh: ProcessMesh, sp: bool) -> None:
        super().__init__()
        col = lambda m: ColumnParallelLinear.from_linear(m, mesh, sequence_parallel=sp)  # noqa: E731
        row = lambda m: RowParallelLinear.from_linear(m, mesh, sequence_parallel=sp)  # noqa: E731
        self.ln1 = LayerNorm1D.from_layernorm(ref.ln1, mesh, sequence_parallel=sp)
        self.ln2 = LayerNorm1D.from_layernorm(ref.ln2, mesh, sequence_parallel=sp)
        self.q, self.k, self.v, self.o = col(ref.q), col(ref.k), col(ref.v), row(ref.o)
        self.fc1, self.fc2 = col(ref.fc1), row(ref.fc2)
        self.heads = NH // mesh.size("tp")

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, C) or (B, T/p, C) under SP
        h = self.ln1(x)
        x = x + self.o(_attend(self.q(h), self.k(h), self.v(h), self.heads))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPT1D(nn.Module):
    def __init__(self, ref: GPT, mesh: ProcessMesh, sp: bool) -> None:
        super().__init__()
        self.mesh, self.sp = mesh, sp
        self.tok = VocabParallelEmbedding.from_embedding(ref.tok, mesh, sequence_parallel=sp)
        self.pos = nn.Parameter(ref.pos.weight.detach().clone())  # (T, C), replicated
        self.blocks = nn.ModuleList(Block1D(b, mesh, sp) for b in ref.blocks)
        self.ln_f = LayerNorm1D.from_layernorm(ref.ln_f, mesh, sequence_parallel=sp)
        self.head = VocabParallelLMHead.from_linear(ref.head, mesh, sequence_parallel=sp)

    def forward(self, ids: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        t = ids.shape[1]
        pos = self.pos[:t]
        if self.sp:  # this rank's positions; each rank's rows get only its tokens' gradient
            p, c = self.mesh.size("tp"), self.mesh.coord("tp")
            pos = copy_to_axis(self.pos, self.mesh.comm, "tp")[c * t // p : (c + 1) * t // p]
        x = self.tok(ids) + pos
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.ln_f(x))  # (B, T, V/p)
        return vocab_parallel_cross_entropy(logits, target, self.mesh)
