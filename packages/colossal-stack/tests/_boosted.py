"""The Booster side of the plugin tests: GPT nano boosted by a plugin, and trained on batches
made from one fixed batch (so the loss must fall)."""

from __future__ import annotations

from typing import Any

import torch

from colossal import Booster
from colossal_models import GPT, GPTConfig

LR = 3e-3


def boost_nano(plugin: Any, seed: int = 0) -> tuple[Booster, Any, Any]:
    """A booster of ``plugin`` and GPT nano (initialized under ``seed``) with AdamW at ``LR``,
    boosted."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig.preset("nano"))
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    booster = Booster(plugin)
    model, opt = booster.boost(model, opt)
    return booster, model, opt


def fixed_batches(n: int, start: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Batches ``start`` to ``start + n`` of one fixed 4 x 32 batch, every other one shifted by
    one token id."""
    g = torch.Generator().manual_seed(7)
    fixed = torch.randint(0, 256, (2, 4, 32), generator=g)
    return [tuple(fixed + i % 2) for i in range(start + n)][start:]  # type: ignore[misc]


def boosted_losses(booster: Booster, model: Any, opt: Any, n: int, start: int = 0) -> list[float]:
    """Train ``n`` steps on ``fixed_batches(n, start)`` through the booster; each step's loss."""
    losses = []
    for x, y in fixed_batches(n, start):
        loss = model(x, y)
        booster.backward(loss, opt)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses
