"""A GPT-nano boosted under a plugin and stepped once: the subject of the checkpoint-safety tests."""

from __future__ import annotations

import torch

from colossal import Booster, DDPPlugin
from colossal_models import GPT, GPTConfig


def boosted_one_step(plugin=None, seed: int = 0):  # type: ignore[no-untyped-def]
    """``(booster, model, optimizer)`` after one AdamW step on a fixed batch (DDP by default)."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig.preset("nano"))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    booster = Booster(plugin or DDPPlugin())
    model, opt = booster.boost(model, opt)
    x = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(seed))
    booster.backward(model(x, x), opt)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return booster, model, opt


def weights(model) -> dict[str, torch.Tensor]:  # type: ignore[no-untyped-def]
    """A detached copy of the model's state dict."""
    return {k: v.detach().clone() for k, v in model.state_dict().items()}
