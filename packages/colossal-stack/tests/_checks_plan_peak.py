"""Rank-side runs for test_plan_peak: the live-tensor peak of one training step per rank.

[Note: measured peak] On a CPU-only machine the accelerator is emulated and torch's CPU allocator
keeps no peak, so "measured" is colossal-memtrace's ``LiveTensorTracker``: the bytes of live
tensor storages, entered before the model is built (every storage the run makes is counted,
including ones only C++ holds, such as DDP's buckets and autograd's saved tensors). The figure is
the highest total over a step after the first (which creates the optimizer states), split into
what lives at rest between steps (parameters, optimizer states, persistent buffers) and the rise
over it during the step (activations, gradients, temporaries). Dropout is 0: with dropout the CPU
``scaled_dot_product_attention`` falls back to its unfused fp32 path, which a GPU run never takes.

Gloo's ``reduce_scatter_tensor`` works in a scratch copy of its input that only its ``Work`` holds,
and the backend's worker thread drops its reference to that ``Work`` a moment after ``wait()``
returns. When the worker is descheduled (four ranks on two cores), the scratch is still alive at
the caller's next allocation, and that step's peak rises by a scratch buffer that NCCL never
allocates from torch's memory (seen in about one rank's step in fifteen on a 2D mesh). The steps
after the first do the same work, so the figure is the lowest of ``_MEASURED_STEPS`` step peaks:
that timing can only add to a step's peak, never take away from it. The bytes at rest are the
lowest after each step from the second on, for the same reason (a ZeRO-1 all-gather's output
was seen alive at rest on one rank of two).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from colossal import Booster, DDPPlugin, GeminiPlugin, HybridParallelPlugin, LowLevelZeroPlugin
from colossal_contracts import TierName
from colossal_memtrace import LiveTensorTracker
from colossal_models import GPT, GPTConfig, PaLM, PaLMConfig

_ACC = TierName.ACCELERATOR
_MEASURED_STEPS = 3  # after the first; see the note on gloo's scratch


def _plugin(kind: str, settings: dict[str, Any]) -> Any:
    return {
        "ddp": DDPPlugin,
        "zero": LowLevelZeroPlugin,
        "gemini": GeminiPlugin,
        "hybrid": HybridParallelPlugin,
    }[kind](**settings)


def step_peak(
    kind: str, settings: dict[str, Any], cfg: GPTConfig | PaLMConfig, batch: int
) -> dict[str, int]:
    """Peak live bytes of this rank in a step of ``kind`` with ``settings`` on a GPT or PaLM of
    ``cfg`` (``batch`` samples per data-parallel rank, ``cfg.max_seq_len`` tokens each), and the
    bytes at rest before it; see [Note: measured peak]."""
    tracker = LiveTensorTracker("cpu")
    with tracker:
        torch.manual_seed(0)
        plugin = _plugin(kind, settings)
        model = GPT(cfg) if isinstance(cfg, GPTConfig) else PaLM(cfg)
        booster = Booster(plugin)
        model, opt = booster.boost(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
        g = torch.Generator().manual_seed(dist.get_rank() if dist.is_initialized() else 0)
        x, y = torch.randint(0, cfg.vocab_size, (2, batch, cfg.max_seq_len), generator=g)
        rests, peaks = [], []
        for _ in range(1 + _MEASURED_STEPS):
            peaks.append(tracker.cut()[_ACC].total)
            rests.append(tracker.used_bytes(_ACC))
            booster.execute_pipeline(x, y, model, opt)
            opt.step()
            opt.zero_grad()
        peaks.append(tracker.cut()[_ACC].total)
        peak = min(peaks[2:])  # peaks[1] is the first step's
        rest = min(rests[2:])  # after the second step and later ones: the same timing can
        # leave a collective's buffer alive at rest (ZeRO-1's all-gather, on one rank of two)
        close = getattr(plugin, "close", None)
        if close is not None:
            close()
    return {"rest": rest, "peak": peak}
