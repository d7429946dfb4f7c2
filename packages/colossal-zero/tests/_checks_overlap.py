"""Rank-side functions of test_gemini_overlap: one run with collectives overlapped and one
waiting for each, and what was in flight while operators computed."""

from __future__ import annotations

from dataclasses import replace

import torch
from _checks_zero import make, train
from torch import nn

from colossal_zero import GeminiConfig


def _run(config: GeminiConfig, steps: int, batch: int, accum: int, clip: float):  # type: ignore[no-untyped-def]
    model, opt = make(config, clip=clip)
    manager = model.runtime.manager
    seen: list[int] = []  # collectives in flight right after each Linear computed

    def look(*_: object) -> None:
        seen.append(len(manager.in_flight))

    for m in model.module.modules():
        if isinstance(m, nn.Linear):
            m.register_forward_hook(look)
    stats: list = []
    losses = train(model, opt, steps, batch, accum=accum, stats=stats)
    return {
        "losses": losses,
        "weights": model.full_state_dict(),
        "moved": stats[-1].bytes_moved,
        "seen": max(seen),
        "most": manager.in_flight.most,
    }


def overlap_and_sync(
    config: GeminiConfig, steps: int, batch: int, accum: int = 1, clip: float = 0.0
) -> tuple[dict, dict]:
    """The same training with ``overlap_comm`` on and off (same seed and batches)."""
    on = _run(replace(config, overlap_comm=True), steps, batch, accum, clip)
    off = _run(replace(config, overlap_comm=False), steps, batch, accum, clip)
    torch.distributed.barrier()
    return on, off
