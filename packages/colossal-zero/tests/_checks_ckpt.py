"""Module-level functions of the streaming-checkpoint tests, run on every rank of a ``World``."""

from __future__ import annotations

import time
import weakref
from pathlib import Path

import torch
import torch.distributed as dist
from _checks_zero import make, rank_world, train

from colossal_zero import GeminiConfig, load_sharded, save_sharded
from colossal_zero.checkpoint import iter_full_state


def _barrier() -> None:
    if rank_world()[1] > 1:
        dist.barrier()


def _alive(bases: list[weakref.ref]) -> int:
    """How many of ``bases`` Python code still holds. gloo's worker thread drops its reference to
    a collective's output a moment after the collective returns (seen in a loaded CI run), so a count above one is read again until that thread lets go (for at most 2 s)."""
    for _ in range(200):
        alive = len({id(b()) for b in bases if b() is not None})
        if alive <= 1:
            return alive
        time.sleep(0.01)
    return alive


def train_and_save(
    config: GeminiConfig, directory: str, steps: int, batch: int
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], int, int]:
    """Train, save; the gathered ``full_state_dict``, the streamed ``iter_full_state`` (each
    tensor copied as it comes), the most gathered buffers the stream kept alive at once (each
    tensor's base, tracked by weak reference) and the number of chunks."""
    model, opt = make(config)
    train(model, opt, steps, batch)
    save_sharded(model, opt, Path(directory))
    _barrier()
    streamed: dict[str, torch.Tensor] = {}
    bases: list[weakref.ref] = []
    most = 0
    for name, t in iter_full_state(model):
        streamed[name] = t.clone()
        bases.append(weakref.ref(t if t._base is None else t._base))
        del t
        most = max(most, _alive(bases))
    chunks = len(model.runtime.manager.registry.param_chunks())
    return model.full_state_dict(), streamed, most, chunks


def load_and_save(config: GeminiConfig, src: str, dst: str) -> tuple[dict[str, torch.Tensor], int]:
    """A differently initialised model loads ``src`` and saves it again into ``dst``; its full
    state and the bytes of chunks its disk tier held meanwhile."""
    model, opt = make(config, seed=123)
    load_sharded(model, opt, Path(src))
    save_sharded(model, opt, Path(dst))
    _barrier()
    disk = model.memory_stats().tiers.get("disk")
    return model.full_state_dict(), 0 if disk is None else disk.used_bytes
