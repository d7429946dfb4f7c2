"""Rotary position embeddings (Su et al., 2021) in the "rotate half" layout used by GPT-NeoX and
Hugging Face Llama: dimension ``i`` of a head is paired with ``i + D/2`` (not with ``i + 1``), so
weights converted from Hugging Face need no permutation.
"""

from __future__ import annotations

import torch

__all__ = ["apply_rotary", "rotary_tables"]


def rotary_tables(
    seq_len: int, head_dim: int, *, theta: float, device: torch.device, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos`` and ``sin`` tables of shape ``(T, D)`` for positions ``0..seq_len-1``.

    Computed in fp32 and cast to ``dtype`` last, as Hugging Face does, so fp32 logits agree.
    """
    inv_freq = 1.0 / (
        theta ** (torch.arange(0, head_dim, 2, dtype=torch.float, device=device) / head_dim)
    )  # (D/2,)
    pos = torch.arange(seq_len, device=device, dtype=torch.float)
    freqs = pos[:, None] * inv_freq[None, :]  # (T, D/2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (T, D)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` of shape ``(B, H, T, D)`` by the tables ``(T, D)`` of ``rotary_tables``."""
    return x * cos + _rotate_half(x) * sin
