"""The plain PyTorch reference the Gemini integration tests compare against (the same model
trained with ``torch.optim.AdamW`` on unsharded layers), and the model and batches they share."""

from __future__ import annotations

import copy
from collections.abc import Iterable

import torch
from torch import nn

from colossal_models import GPT, GPTConfig


def nano_gpt() -> GPT:
    """GPT nano, initialized under seed 0."""
    torch.manual_seed(0)
    return GPT(GPTConfig.preset("nano"))


def token_batches(
    steps: int, batch: int, seq: int, *, seed: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``steps`` (input, target) pairs of ``batch`` x ``seq`` token ids below 256."""
    g = torch.Generator().manual_seed(seed)
    return [tuple(torch.randint(0, 256, (2, batch, seq), generator=g)) for _ in range(steps)]  # type: ignore[misc]


def adamw_losses_and_weights(
    model: nn.Module,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    lr: float,
    *,
    autocast: bool = False,
) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Train ``model`` (whose forward returns the loss) one AdamW step per batch, the forward
    under bf16 CPU autocast when ``autocast``; the losses and a copy of the final state dict."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for x, y in batches:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, copy.deepcopy(model.state_dict())
