"""What a training job returns (``TrainResult``) and the summary table it prints at the end."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import psutil

from ._config import TrainConfig

__all__ = ["TrainResult"]


@dataclass(frozen=True)
class TrainResult:
    """What a run achieved. Losses are averaged over ranks."""

    losses: list[float]
    val_loss: float
    tokens_per_s: float
    num_params: int
    checkpoint: Path | None
    out: Path


def _summary(
    result: TrainResult,
    cfg: TrainConfig,
    label: str,
    ranks: tuple[int, int],
    proc: psutil.Process,
) -> dict:
    first, last = (result.losses[0], result.losses[-1]) if result.losses else (float("nan"),) * 2
    (world, dp), shape = ranks, f"{cfg.data.batch_size} x {cfg.data.seq_len}"
    global_batch = {} if dp == world else {"global batch (dp x batch x seq)": f"{dp} x {shape}"}
    layout = {} if cfg.parallel.layout is None else {"layout": cfg.parallel.layout}
    return {
        "model": f"{label} ({result.num_params:,} params)",
        **layout,
        "ranks x batch x seq": f"{world} x {shape}",
        **global_batch,
        "steps run": len(result.losses),
        "first loss": first,
        "last loss": last,
        "validation loss": result.val_loss,
        "tokens/s": result.tokens_per_s,
        "host RSS": f"{proc.memory_info().rss / 2**20:,.0f} MiB",
        "checkpoint": str(result.checkpoint) if result.checkpoint else "-",
        "metrics": str(cfg.checkpoint.out / "metrics.jsonl"),
    }
