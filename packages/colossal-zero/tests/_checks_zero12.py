"""ZeRO-1/2 runs executed on every rank of a ``World`` (or on one process)."""

from __future__ import annotations

from pathlib import Path

import torch
from _checks_zero import train
from _zero_model import build, param_groups

from colossal_zero import LowLevelZeroOptimizer, ZeroConfig


def make(config: ZeroConfig, *, lr: float = 1e-2, clip: float = 0.0, freeze: tuple = (), **kw):  # type: ignore[no-untyped-def]
    model = build(**kw)
    for n, p in model.named_parameters():
        if n.startswith(freeze):
            p.requires_grad_(False)
    opt = LowLevelZeroOptimizer(
        model, param_groups(model), lr=lr, config=config, max_grad_norm=clip
    )
    return model, opt


def run_zero(
    config: ZeroConfig,
    steps: int,
    batch: int,
    *,
    accum: int = 1,
    clip: float = 0.0,
    freeze: tuple[str, ...] = (),
    **kw: object,
) -> tuple[list[float], dict[str, torch.Tensor], dict[str, int]]:
    """Losses per micro-step, final weights (fp32) and model-state bytes of a ZeRO run."""
    model, opt = make(config, clip=clip, freeze=freeze, **kw)
    losses = train(model, opt, steps, batch, accum=accum)
    weights = {k: v.float() for k, v in opt.full_state_dict().items()}
    return losses, weights, opt.model_state_bytes()


def save_and_continue(config: ZeroConfig, directory: str, steps: int, batch: int, save_at: int):  # type: ignore[no-untyped-def]
    """Train ``save_at`` steps, save, train on to ``steps``; the losses after saving."""
    import torch.distributed as dist
    from _checks_zero import rank_world

    from colossal_zero import save_zero_sharded

    model, opt = make(config, freeze=("blocks.0.ln",))
    train(model, opt, save_at, batch)
    save_zero_sharded(opt, Path(directory))
    if rank_world()[1] > 1:
        dist.barrier()
    return train(model, opt, steps - save_at, batch, start=save_at)


def load_and_continue(config: ZeroConfig, directory: str, steps: int, batch: int, save_at: int):  # type: ignore[no-untyped-def]
    """A fresh model (another seed) loads the checkpoint and trains on: the losses."""
    from colossal_zero import load_zero_sharded

    model, opt = make(config, seed=123, freeze=("blocks.0.ln",))
    load_zero_sharded(opt, Path(directory))
    return train(model, opt, steps - save_at, batch, start=save_at)
