"""One step's arithmetic in the training job: the optimizer's weight-decay groups, losses
averaged over the data-parallel ranks and checked (the plugin's ``train_step`` accumulates the
micro-batches), and the held-out evaluation."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..booster import Booster
from ._guard import FiniteGuard


def _param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Decay on matrices (embeddings, Linear weights), none on biases and norm weights."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    other = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": other, "weight_decay": 0.0}]


def _mean_over_ranks(value: float, group: Any = None) -> float:
    """Mean of ``value`` over ``group`` (None: every rank). Over the data-parallel group each
    replica counts once, whatever its tensor, pipeline and sequence ranks."""
    if not (dist.is_available() and dist.is_initialized()):
        return value
    nccl = dist.get_backend(group) == "nccl"  # NCCL reduces CUDA tensors only
    t = torch.tensor([value], dtype=torch.float64, device="cuda" if nccl else "cpu")
    dist.all_reduce(t, group=group)
    return float(t.item()) / dist.get_world_size(group)


def _evaluate(
    booster: Booster,
    model: nn.Module,
    batches: list[tuple[torch.Tensor, torch.Tensor]],
    group: Any,
) -> float:
    """Mean loss of ``batches`` (the same on every rank); forward only, a pipelined model
    through the pipeline (the plugin's ``evaluate``)."""
    model.eval()
    losses = []
    for x, y in batches:
        x, y = booster.to_device((x, y))
        losses.append(booster.evaluate(x, y, model).item())
    model.train()
    return _mean_over_ranks(sum(losses) / len(losses), group)


def _checked_loss(guard: FiniteGuard, step: int, loss: torch.Tensor, group: Any) -> float:
    """One micro-batch's loss averaged over ``group`` (the data-parallel ranks), stopped by
    ``guard`` when it is nan/inf: the job's ``on_loss`` of ``Booster.train_step``, which runs
    the step's gradient accumulation (or pipeline schedule) before its backward."""
    value = _mean_over_ranks(loss.item(), group)
    guard.check_loss(step, value)
    return value
