"""Learning-rate schedule: linear warmup, then cosine decay to a floor."""

from __future__ import annotations

import math

__all__ = ["warmup_cosine"]


def warmup_cosine(step: int, total: int, *, warmup_frac: float = 0.1, floor: float = 0.1) -> float:
    """Multiplier of the peak learning rate at 0-based ``step`` of ``total``; in (0, 1]."""
    warmup = max(1, int(total * warmup_frac))
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
