"""Module-level functions of the streaming-checkpoint tests, run on every rank of a ``World``."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
from _checks_zero import make, rank_world, train

from colossal_zero import GeminiConfig, iter_full_state, load_sharded, save_sharded


def _barrier() -> None:
    if rank_world()[1] > 1:
        dist.barrier()


def train_and_save(
    config: GeminiConfig, directory: str, steps: int, batch: int
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Train, save; the gathered ``full_state_dict`` and the streamed ``iter_full_state``
    (each tensor copied as it comes: the stream's views last until the next chunk)."""
    model, opt = make(config)
    train(model, opt, steps, batch)
    save_sharded(model, opt, Path(directory))
    _barrier()
    streamed = {n: t.clone() for n, t in iter_full_state(model)}
    return model.full_state_dict(), streamed


def load_and_save(config: GeminiConfig, src: str, dst: str) -> tuple[dict[str, torch.Tensor], int]:
    """A differently initialised model loads ``src`` and saves it again into ``dst``; its full
    state and the bytes of chunks its disk tier held meanwhile."""
    model, opt = make(config, seed=123)
    load_sharded(model, opt, Path(src))
    save_sharded(model, opt, Path(dst))
    _barrier()
    disk = model.memory_stats().tiers.get("disk")
    return model.full_state_dict(), 0 if disk is None else disk.used_bytes
