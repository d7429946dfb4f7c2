"""Peak live accelerator bytes of Gemini steps, as the planner tests measure them."""

from __future__ import annotations

from typing import Any

import torch

from colossal_contracts import TierName
from colossal_memtrace import LiveTensorTracker


def step_peaks(
    tracker: LiveTensorTracker,
    model: torch.nn.Module,
    opt: Any,
    x: torch.Tensor,
    y: torch.Tensor,
    steps: int = 3,
) -> list[int]:
    """Each of ``steps`` Gemini steps' peak live accelerator bytes (``tracker`` entered)."""
    peaks = []
    for _ in range(steps):
        tracker.cut()
        opt.backward(model(x, y))
        opt.step()
        opt.zero_grad()
        peaks.append(tracker.cut()[TierName.ACCELERATOR].total)
    return peaks
