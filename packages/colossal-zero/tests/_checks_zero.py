"""Module-level functions that colossal-zero's tests run on every rank of a ``World``."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
from _zero_model import batches, build, param_groups

from colossal_zero import GeminiConfig, GeminiOptimizer, apply_gemini


def rank_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def make(config: GeminiConfig, *, lr: float = 1e-2, clip: float = 0.0, **kw: object):  # type: ignore[no-untyped-def]
    plain = build(**kw)
    groups = param_groups(plain)  # before apply_gemini: sharded parameters show no shape after
    model = apply_gemini(plain, config)
    opt = GeminiOptimizer(model, groups, lr=lr, max_grad_norm=clip)
    return model, opt


def train(
    model,  # type: ignore[no-untyped-def]
    opt,
    steps: int,
    batch: int,
    *,
    accum: int = 1,
    start: int = 0,
    stats: list | None = None,
) -> list[float]:
    """Train on this rank's rows of the global batch; return the global mean loss per micro-step."""
    rank, world = rank_world()
    per = batch // world
    losses = []
    data = batches((start + steps) * accum, batch)[start * accum :]
    for i, (x, y) in enumerate(data):
        loss = model(x[rank * per : (rank + 1) * per], y[rank * per : (rank + 1) * per]) / accum
        opt.backward(loss)
        t = torch.tensor([loss.item() * accum])
        if world > 1:
            dist.all_reduce(t)
        losses.append(float(t) / world)
        if (i + 1) % accum == 0:
            opt.step()
            opt.zero_grad()
            if stats is not None:
                stats.append(model.memory_stats())
    return losses


def run_gemini(
    config: GeminiConfig,
    steps: int,
    batch: int,
    *,
    accum: int = 1,
    clip: float = 0.0,
    **kw: object,
) -> tuple[list[float], dict[str, torch.Tensor], list[int]]:
    """Losses, final full weights and bytes moved per step of a Gemini run."""
    model, opt = make(config, clip=clip, **kw)
    stats: list = []
    losses = train(model, opt, steps, batch, accum=accum, stats=stats)
    moved = [s.bytes_moved for s in stats]
    moved = [b - a for a, b in zip([0, *moved], moved, strict=False)]
    return losses, model.full_state_dict(), moved


def save_and_continue(
    config: GeminiConfig, directory: str, steps: int, batch: int, save_at: int
) -> list[float]:
    """Train ``save_at`` steps, save, train on to ``steps``; return the losses after saving."""
    from colossal_zero import save_sharded

    model, opt = make(config)
    train(model, opt, save_at, batch)
    save_sharded(model, opt, Path(directory))
    dist.barrier() if rank_world()[1] > 1 else None
    return train(model, opt, steps - save_at, batch, start=save_at)


def load_and_continue(
    config: GeminiConfig, directory: str, steps: int, batch: int, save_at: int
) -> list[float]:
    from colossal_zero import load_sharded

    model, opt = make(config, seed=123)  # different init: everything must come from the files
    load_sharded(model, opt, Path(directory))
    return train(model, opt, steps - save_at, batch, start=save_at)


def diverging_forward(config: GeminiConfig, batch: int) -> str:
    """Rank 1 skips the second block's forward (so its parameters): returns the error each rank
    raised in its first step (issue: such ranks used to hang until the gloo timeout)."""
    from colossal_contracts import DistributedError

    model, opt = make(config)
    if rank_world()[0] == 1:
        model.module.blocks[1].forward = lambda x: x  # type: ignore[method-assign]
    try:
        train(model, opt, 1, batch)
    except DistributedError as err:
        return str(err)
    return "no error"
