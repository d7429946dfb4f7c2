"""``LMIO``: what happens where tokens enter a language model and where logits leave it.

A model calls its ``io`` three times per forward: ``tokens`` on the ids and targets (a
tensor-parallel plan keeps this rank's batch chunk, a long-sequence plan its sequence slice, whose
``positions`` the model then asks for), ``enter`` on the embedded input (sequence
parallelism keeps this rank's sequence chunk) and ``forward`` on the final hidden state with the
output matrix (vocabulary-parallel plans compute split logits and their loss without gathering
them). ``LMIO`` itself is the unsharded behaviour. It owns no parameters, so swapping it never
changes a state dict.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["LMIO", "at_least_fp32"]


def at_least_fp32(t: torch.Tensor) -> torch.Tensor:
    """``t`` in float32 when it is of lower precision (losses are computed in fp32 at least;
    a float64 model keeps float64 throughout)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


class LMIO(nn.Module):
    """Unsharded boundary: ids pass through; logits ``h W^T``; mean cross-entropy with targets."""

    def tokens(
        self, idx: torch.Tensor, targets: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The ids (and targets) this rank computes on; ``(B, T)`` each."""
        return idx, targets

    def positions(self, seq_len: int, device: torch.device) -> torch.Tensor:
        """The positions (of ``0..seq_len-1``) of the tokens this rank holds, in its order."""
        return torch.arange(seq_len, device=device)

    def enter(self, x: torch.Tensor) -> torch.Tensor:
        """The embedded input ``(B, T, C)`` as the first block consumes it."""
        return x

    def forward(
        self, h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor | None
    ) -> torch.Tensor:
        """Logits ``(B, T, V)`` from ``h (B, T, C)`` and ``weight (V, C)``, or the mean loss."""
        logits = F.linear(h, weight)
        if targets is None:
            return logits
        return F.cross_entropy(at_least_fp32(logits.flatten(0, 1)), targets.flatten())
