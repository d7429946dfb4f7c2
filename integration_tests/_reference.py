"""The plain PyTorch reference the Gemini integration tests compare against: the same model
trained with ``torch.optim.AdamW`` on unsharded layers."""

from __future__ import annotations

import copy
from collections.abc import Iterable

import torch
from torch import nn


def adamw_losses_and_weights(
    model: nn.Module, batches: Iterable[tuple[torch.Tensor, torch.Tensor]], lr: float
) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Train ``model`` (whose forward returns the loss) one AdamW step per batch; the losses and
    a copy of the final state dict."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for x, y in batches:
        loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, copy.deepcopy(model.state_dict())
