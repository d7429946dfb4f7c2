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


def gathers_per_depth(
    config: GeminiConfig, depths: tuple[int, ...], steps: int, batch: int
) -> dict:
    """The same training with each ``gather_ahead`` depth: its losses and weights, and the
    all-gather collectives the last step started (torch profiler's ``c10d::`` gather operators)."""
    out = {}
    for depth in depths:
        model, opt = make(replace(config, gather_ahead=depth))
        losses = train(model, opt, steps - 1, batch)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            losses += train(model, opt, 1, batch, start=steps - 1)
        gathers = sum(
            e.count for e in prof.key_averages() if e.key.startswith("c10d::") and "gather" in e.key
        )
        out[depth] = {"losses": losses, "weights": model.full_state_dict(), "gathers": gathers}
    torch.distributed.barrier()
    return out
