"""Ulysses: attention over a sequence split across ``sp`` ranks by switching to a head split.

[Note: Ulysses] Queries, keys and values arrive split along the sequence, ``(B, H, T/sp, D)``
per rank (contiguous layout). One all-to-all per tensor trades that for a split along the heads,
``(B, H/sp, T, D)``: each rank then runs ordinary causal attention over the whole sequence for
its heads, and one more all-to-all brings the output back to the sequence split. Backward is the
same all-to-alls reversed. Per rank and call, forward counts four all-to-alls of ``B*H*T/sp*D``
elements (q, k, v, output) and backward four more; the heads must divide by ``sp``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from colossal_contracts import ConfigError

from .._comm import CountedComm
from ._layout import check_sequence

__all__ = ["all_to_all_along", "ulysses_attention", "ulysses_comm_bytes"]

HEADS, SEQ = 1, 2  # dims of (B, H, T, D)


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x, comm: CountedComm, axis: str, split_dim: int, cat_dim: int):
        ctx.args = (comm, axis, split_dim, cat_dim)
        return comm.all_to_all(x, axis, split_dim=split_dim, cat_dim=cat_dim)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor):
        comm, axis, split_dim, cat_dim = ctx.args
        return (
            comm.all_to_all(g, axis, split_dim=cat_dim, cat_dim=split_dim),
            None,
            None,
            None,
            None,
        )


def all_to_all_along(
    x: torch.Tensor, comm: CountedComm, axis: str, *, split_dim: int, cat_dim: int
) -> torch.Tensor:
    """All-to-all forward (split ``split_dim``, concatenate ``cat_dim``); the reverse backward."""
    return _AllToAll.apply(x, comm, axis, split_dim, cat_dim)


def ulysses_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    comm: CountedComm,
    *,
    axis: str = "sp",
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """Causal attention of sequence-split ``q, k, v (B, H, T/sp, D)`` ([Note: Ulysses]).

    ``ConfigError`` (before any collective) unless ``sp`` divides the heads and the sequence.
    """
    p = comm.size(axis)
    if q.dim() != 4 or k.shape != q.shape or v.shape != q.shape:
        raise ConfigError(
            f"ulysses_attention needs q, k, v of one shape (B, H, L, D); got {tuple(q.shape)}, "
            f"{tuple(k.shape)}, {tuple(v.shape)} (repeat shared key/value heads first)"
        )
    if q.shape[HEADS] % p:
        raise ConfigError(
            f"Ulysses splits the {q.shape[HEADS]} attention heads over sp={p} ranks; use a head "
            f"count that is a multiple of {p}, a smaller sp, or ring attention"
        )
    check_sequence(q.shape[SEQ] * p, p, "contiguous")
    q, k, v = (all_to_all_along(t, comm, axis, split_dim=HEADS, cat_dim=SEQ) for t in (q, k, v))
    y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
    return all_to_all_along(y, comm, axis, split_dim=SEQ, cat_dim=HEADS)  # (B, H, T/sp, D)


def ulysses_comm_bytes(
    batch: int, heads: int, seq_len: int, head_dim: int, sp: int, *, elem_bytes: int = 4
) -> tuple[int, int]:
    """Counted all-to-all bytes per Ulysses call on one rank: ``(forward, backward)``, each
    ``4 * B * H * (T/sp) * D`` elements (see [Note: counted bytes]: all-to-all counts its input)."""
    if sp == 1:
        return 0, 0
    n = 4 * batch * heads * (seq_len // sp) * head_dim * elem_bytes
    return n, n
