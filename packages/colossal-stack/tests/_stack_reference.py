"""The plain PyTorch reference the stack's tests compare against: the model trained in one
process on unsharded layers, one ``torch.optim.AdamW`` step per global batch (also imported by
the ranks' check modules)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import nn

Batch = tuple[torch.Tensor, torch.Tensor]


def adamw_losses(
    model: nn.Module,
    batches: Iterable[Batch],
    opt: torch.optim.Optimizer | float,
    *,
    clip: float | None = None,
    microbatches: int = 1,
    loss_of: Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    lr_at: Callable[[int], float] | None = None,
) -> list[float]:
    """Train ``model`` one step of ``opt`` (an optimizer, or AdamW's learning rate) per batch
    and return each step's loss.

    A batch is split into ``microbatches`` equal parts whose losses, each divided by their
    number, are backpropagated one after the other and summed (as a pipeline sums them); the
    gradients' total norm is clipped at ``clip`` when given, and the learning rate set to
    ``lr_at(step)`` before each step when given. ``loss_of(model, x, y)`` computes a loss
    (default: the model's forward returns it)."""
    if not isinstance(opt, torch.optim.Optimizer):
        opt = torch.optim.AdamW(model.parameters(), lr=opt)
    losses = []
    for step, (x, y) in enumerate(batches):
        if lr_at is not None:
            for group in opt.param_groups:
                group["lr"] = lr_at(step)
        total = 0.0
        for xm, ym in zip(x.chunk(microbatches), y.chunk(microbatches), strict=True):
            loss = model(xm, ym) if loss_of is None else loss_of(model, xm, ym)
            loss = loss / microbatches if microbatches > 1 else loss
            loss.backward()
            total += loss.item()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        opt.zero_grad()
        losses.append(total)
    return losses
