"""ZeRO-1/2 runs executed on every rank of a ``World`` (or on one process)."""

from __future__ import annotations

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
