"""``CausalAttention``: the attention core a model's attention layer calls on its heads.

The models compute ``q, k, v`` of shape ``(B, H, T, D)`` and hand them to ``attn.core``; this
default is plain causal ``scaled_dot_product_attention`` over the sequence the rank holds. A
long-sequence plan (``apply_sequence_parallel``) swaps it for ring attention or Ulysses, which
see only a slice of the sequence per rank. It owns no parameters, so swapping it never changes a
state dict.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["CausalAttention"]


class CausalAttention(nn.Module):
    """Causal softmax attention of ``q, k, v (B, H, T, D)``; ``dropout_p`` on the weights."""

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float = 0.0
    ) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
