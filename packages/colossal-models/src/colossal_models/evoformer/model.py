"""The Evoformer stack of AlphaFold 2 (supplement Algorithms 6-15), leaf modules first.

Shapes: B batch, S MSA sequences, R residues (I, J, K name residue axes), H heads, D head width.
``m`` is (B, S, R, c_m), ``z`` is (B, R, R, c_z) with z[:, i, j] the pair (i, j).

[Note: axial layout] Each module works on whatever slice of the representation it is given, as
long as the axis it attends or contracts over is whole. A block asks its ``axes`` object (the
model-independent part of dynamic axial parallelism) for the few places where a slice is not
enough: ``gather(x, dim)`` (a pair bias or projection needed for every residue) and ``switch``
(move the sharded axis, e.g. from MSA rows to residues). ``LocalAxes``, the default, does
nothing: one process holds everything. ``parallelize_evoformer`` installs the distributed one.

[Note: chunked inference] With ``chunk_size`` set, attention and transitions run on slices of
``chunk_size`` along an axis they do not mix (MSA rows for row attention, residues otherwise), the
outer product mean on slices of its first residue axis and the triangular multiplicative updates
on slices of their output rows (outgoing) or columns (incoming); each slice is computed exactly as
in the whole tensor, so the result equals the unchunked one up to float rounding of the matmuls.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from colossal_contracts import ConfigError

from .config import EvoformerConfig

__all__ = [
    "Evoformer",
    "EvoformerBlock",
    "GatedAttention",
    "LocalAxes",
    "MSAColumnAttention",
    "MSARowAttentionWithPairBias",
    "OuterProductMean",
    "Transition",
    "TriangleAttention",
    "TriangleMultiplication",
    "check_chunk_size",
]

Gather = Callable[[torch.Tensor, int], torch.Tensor]


def check_chunk_size(chunk_size: int | None) -> None:
    """``ConfigError`` unless ``chunk_size`` is None (no chunking) or a positive int."""
    if chunk_size is not None and (
        isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size <= 0
    ):
        raise ConfigError(
            f"chunk_size must be a positive int (or None for no chunking), got {chunk_size!r}"
        )


def chunked(
    fn: Callable[..., torch.Tensor],
    xs: tuple[torch.Tensor, ...],
    dim: int,
    size: int | None,
    out_dim: int | None = None,
) -> torch.Tensor:
    """``fn(*xs)`` evaluated on slices of ``size`` along ``dim`` of every ``xs``, the results
    concatenated along ``out_dim`` (default ``dim``)."""
    n = xs[0].shape[dim]
    if size is None or size >= n:
        return fn(*xs)
    outs = [fn(*(x.narrow(dim, s, min(size, n - s)) for x in xs)) for s in range(0, n, size)]
    return torch.cat(outs, dim=dim if out_dim is None else out_dim)


class LocalAxes:
    """Single-process axes: every tensor is whole, so gathers and switches are identities."""

    def gather(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        return x

    def switch(self, x: torch.Tensor, from_dim: int, to_dim: int) -> torch.Tensor:
        return x

    def switch_start(
        self, x: torch.Tensor, from_dim: int, to_dim: int
    ) -> Callable[[], torch.Tensor]:
        return lambda: x

    def enter(self, m: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Whole m and z -> this rank's rows of each (checks the shapes first)."""
        return m, z

    def leave(self, m: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's rows of m and z -> whole m and z."""
        return m, z


class GatedAttention(nn.Module):
    """Gated multi-head self-attention over dim -2 of ``x`` (..., L, c) with an additive bias
    (..., H, L, L) (Algorithms 7, 8, 13, 14 share it); queries scaled by 1/sqrt(D)."""

    def __init__(self, c_in: int, num_heads: int, c_hidden: int):
        super().__init__()
        self.num_heads, self.c_hidden = num_heads, c_hidden
        hd = num_heads * c_hidden
        self.q = nn.Linear(c_in, hd, bias=False)
        self.k = nn.Linear(c_in, hd, bias=False)
        self.v = nn.Linear(c_in, hd, bias=False)
        self.gate = nn.Linear(c_in, hd)
        self.out = nn.Linear(hd, c_in)

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        *lead, L, _ = x.shape
        H, D = self.num_heads, self.c_hidden

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(*lead, L, H, D).transpose(-2, -3)  # (..., H, L, D)

        q = heads(self.q(x)) / math.sqrt(D)
        k, v = heads(self.k(x)), heads(self.v(x))
        logits = q @ k.transpose(-1, -2)  # (..., H, L, L)
        if bias is not None:
            logits = logits + bias
        o = torch.softmax(logits, dim=-1) @ v  # (..., H, L, D)
        o = o.transpose(-2, -3).reshape(*lead, L, H * D)
        return self.out(torch.sigmoid(self.gate(x)) * o)


class MSARowAttentionWithPairBias(nn.Module):
    """Algorithm 7: attention along residues within each MSA row, biased by the pair."""

    def __init__(self, cfg: EvoformerConfig):
        super().__init__()
        self.ln_m = nn.LayerNorm(cfg.c_m, eps=cfg.eps)
        self.ln_z = nn.LayerNorm(cfg.c_z, eps=cfg.eps)
        self.pair_bias = nn.Linear(cfg.c_z, cfg.msa_heads, bias=False)
        self.attn = GatedAttention(cfg.c_m, cfg.msa_heads, cfg.c_hidden_msa)

    def forward(
        self, m: torch.Tensor, z: torch.Tensor, gather: Gather, chunk_size: int | None = None
    ) -> torch.Tensor:
        b = gather(self.pair_bias(self.ln_z(z)), -3)  # (B, R, R, H): every residue pair
        b = b.permute(0, 3, 1, 2).unsqueeze(1)  # (B, 1, H, R, R), shared by the MSA rows
        return chunked(lambda x: self.attn(x, b), (self.ln_m(m),), -3, chunk_size)


class MSAColumnAttention(nn.Module):
    """Algorithm 8: attention along MSA sequences within each residue column."""

    def __init__(self, cfg: EvoformerConfig):
        super().__init__()
        self.ln = nn.LayerNorm(cfg.c_m, eps=cfg.eps)
        self.attn = GatedAttention(cfg.c_m, cfg.msa_heads, cfg.c_hidden_msa)

    def forward(self, m: torch.Tensor, chunk_size: int | None = None) -> torch.Tensor:
        x = self.ln(m).transpose(-2, -3)  # (B, R, S, c_m)
        return chunked(self.attn, (x,), -3, chunk_size).transpose(-2, -3)


class Transition(nn.Module):
    """Algorithms 9 and 15: LayerNorm, widen by ``n``, ReLU, project back."""

    def __init__(self, c: int, n: int, eps: float):
        super().__init__()
        self.ln = nn.LayerNorm(c, eps=eps)
        self.up = nn.Linear(c, n * c)
        self.down = nn.Linear(n * c, c)

    def forward(self, x: torch.Tensor, chunk_size: int | None = None) -> torch.Tensor:
        return chunked(lambda t: self.down(F.relu(self.up(self.ln(t)))), (x,), -3, chunk_size)


class OuterProductMean(nn.Module):
    """Algorithm 10: z_ij += Linear(flatten(mean_s a_si (x) b_sj)). ``m`` must hold every MSA
    sequence; its residues index ``i`` (the slice this rank owns) and ``gather`` gives all ``j``."""

    def __init__(self, cfg: EvoformerConfig):
        super().__init__()
        self.ln = nn.LayerNorm(cfg.c_m, eps=cfg.eps)
        self.a = nn.Linear(cfg.c_m, cfg.c_hidden_opm)
        self.b = nn.Linear(cfg.c_m, cfg.c_hidden_opm)
        self.out = nn.Linear(cfg.c_hidden_opm**2, cfg.c_z)

    def forward(self, m: torch.Tensor, gather: Gather, chunk_size: int | None = None):
        x = self.ln(m)
        a, b = self.a(x), gather(self.b(x), -2)  # (B, S, I, C), (B, S, J, C)
        n_seq = m.shape[-3]

        def outer(a_: torch.Tensor) -> torch.Tensor:
            o = torch.einsum("bsic,bsjd->bijcd", a_, b) / n_seq  # (B, I, J, C, C)
            return self.out(o.flatten(-2))

        return chunked(outer, (a,), -2, chunk_size, -3)  # slices of I -> (B, I, J, c_z)


class TriangleMultiplication(nn.Module):
    """Algorithms 11 (outgoing: z_ij += sum_k a_ik b_jk) and 12 (incoming: sum_k a_ki b_kj).

    Outgoing needs whole rows (k) and ``gather``s b over rows (j); incoming needs whole columns
    and ``gather``s a over columns (i). Chunked along i (outgoing) or j (incoming): each slice
    projects its own a (or b), contracts with the whole other projection, and gates its output."""

    def __init__(self, cfg: EvoformerConfig, *, outgoing: bool):
        super().__init__()
        cz, c = cfg.c_z, cfg.c_hidden_mul
        self.outgoing = outgoing
        self.ln_in = nn.LayerNorm(cz, eps=cfg.eps)
        self.a_proj, self.a_gate = nn.Linear(cz, c), nn.Linear(cz, c)
        self.b_proj, self.b_gate = nn.Linear(cz, c), nn.Linear(cz, c)
        self.gate = nn.Linear(cz, cz)
        self.ln_out = nn.LayerNorm(c, eps=cfg.eps)
        self.out = nn.Linear(c, cz)

    def _a(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.a_gate(x)) * self.a_proj(x)

    def _b(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.b_gate(x)) * self.b_proj(x)

    def forward(
        self, z: torch.Tensor, gather: Gather, chunk_size: int | None = None
    ) -> torch.Tensor:
        x = self.ln_in(z)

        def finish(x_: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
            return torch.sigmoid(self.gate(x_)) * self.out(self.ln_out(o))

        if self.outgoing:
            b = gather(self._b(x), -3)  # (B, J, K, C): every row j

            def rows(x_: torch.Tensor) -> torch.Tensor:  # x_: (B, i-slice, K, c_z)
                return finish(x_, torch.einsum("bikc,bjkc->bijc", self._a(x_), b))

            return chunked(rows, (x,), -3, chunk_size)
        a = gather(self._a(x), -2)  # (B, K, I, C): every column i

        def cols(x_: torch.Tensor) -> torch.Tensor:  # x_: (B, K, j-slice, c_z)
            return finish(x_, torch.einsum("bkic,bkjc->bijc", a, self._b(x_)))

        return chunked(cols, (x,), -2, chunk_size)


class TriangleAttention(nn.Module):
    """Algorithms 13 (starting node: row i attends over j, bias b_jk) and 14 (ending node:
    column j attends over i, bias b_ki), the latter as the former on the transposed pair."""

    def __init__(self, cfg: EvoformerConfig, *, starting: bool):
        super().__init__()
        self.starting = starting
        self.ln = nn.LayerNorm(cfg.c_z, eps=cfg.eps)
        self.pair_bias = nn.Linear(cfg.c_z, cfg.pair_heads, bias=False)
        self.attn = GatedAttention(cfg.c_z, cfg.pair_heads, cfg.c_hidden_pair)

    def forward(self, z: torch.Tensor, gather: Gather, chunk_size: int | None = None):
        x = self.ln(z if self.starting else z.transpose(-2, -3))  # rows of x are local
        b = gather(self.pair_bias(x), -3).permute(0, 3, 1, 2).unsqueeze(1)  # (B, 1, H, J, K)
        o = chunked(lambda t: self.attn(t, b), (x,), -3, chunk_size)
        return o if self.starting else o.transpose(-2, -3)


class EvoformerBlock(nn.Module):
    """Algorithm 6. ``axes`` says how m and z are laid out (see [Note: axial layout]); on entry
    and exit m is split along MSA rows (dim -3) and z along its first residue axis (dim -3)."""

    def __init__(self, cfg: EvoformerConfig):
        super().__init__()
        self.msa_row = MSARowAttentionWithPairBias(cfg)
        self.msa_col = MSAColumnAttention(cfg)
        self.msa_transition = Transition(cfg.c_m, cfg.transition_n, cfg.eps)
        self.outer_product_mean = OuterProductMean(cfg)
        self.tri_mul_out = TriangleMultiplication(cfg, outgoing=True)
        self.tri_mul_in = TriangleMultiplication(cfg, outgoing=False)
        self.tri_att_start = TriangleAttention(cfg, starting=True)
        self.tri_att_end = TriangleAttention(cfg, starting=False)
        self.pair_transition = Transition(cfg.c_z, cfg.transition_n, cfg.eps)
        self.axes: LocalAxes = LocalAxes()

    def forward(
        self, m: torch.Tensor, z: torch.Tensor, chunk_size: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        ax, c = self.axes, chunk_size
        # MSA stack. m: (B, S/p, R, c_m) rows, z: (B, R/p, R, c_z) rows.
        m = m + self.msa_row(m, z, ax.gather, c)
        m = ax.switch(m, -3, -2)  # (B, S, R/p, c_m): whole columns
        m = m + self.msa_col(m, c)
        m = m + self.msa_transition(m, c)
        z = z + self.outer_product_mean(m, ax.gather, c)
        # m goes back to rows while the pair stack runs (asynchronous where axes allow).
        m_rows = ax.switch_start(m, -2, -3)
        # Pair stack. Row-wise updates on (B, R/p, R, c_z), column-wise on (B, R, R/p, c_z).
        z = z + self.tri_mul_out(z, ax.gather, c)
        z = ax.switch(z, -3, -2)
        z = z + self.tri_mul_in(z, ax.gather, c)
        z = ax.switch(z, -2, -3)
        z = z + self.tri_att_start(z, ax.gather, c)
        z = ax.switch(z, -3, -2)
        z = z + self.tri_att_end(z, ax.gather, c)
        z = z + self.pair_transition(z, c)
        z = ax.switch(z, -2, -3)
        return m_rows(), z


class Evoformer(nn.Module):
    """The Evoformer stack: ``num_blocks`` blocks, then ``s = Linear(m[:, 0])`` when c_s > 0.

    ``forward(m, z, chunk_size=None)`` takes and returns whole tensors on every rank (also after
    ``parallelize_evoformer``) and returns ``(m, z, s)`` (``s`` None when c_s == 0).
    """

    def __init__(self, cfg: EvoformerConfig):
        super().__init__()
        self.config = cfg
        self.blocks = nn.ModuleList(EvoformerBlock(cfg) for _ in range(cfg.num_blocks))
        self.single = nn.Linear(cfg.c_m, cfg.c_s) if cfg.c_s else None
        self.axes: LocalAxes = LocalAxes()

    def forward(
        self, m: torch.Tensor, z: torch.Tensor, chunk_size: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        check_chunk_size(chunk_size)
        cfg = self.config
        if m.dim() != 4 or z.dim() != 4 or m.shape[-1] != cfg.c_m or z.shape[-1] != cfg.c_z:
            raise ConfigError(
                f"Evoformer takes m (B, S, R, {cfg.c_m}) and z (B, R, R, {cfg.c_z}), got "
                f"{tuple(m.shape)} and {tuple(z.shape)}"
            )
        if z.shape[1] != z.shape[2] or m.shape[2] != z.shape[1] or m.shape[0] != z.shape[0]:
            raise ConfigError(
                f"Evoformer: m {tuple(m.shape)} and z {tuple(z.shape)} disagree on batch or "
                "residue count; z must be (B, R, R, c_z) for m's (B, S, R, c_m)"
            )
        m, z = self.axes.enter(m, z)
        for block in self.blocks:
            m, z = block(m, z, chunk_size)
        m, z = self.axes.leave(m, z)
        s = self.single(m[:, 0]) if self.single is not None else None
        return m, z, s
