"""One step's arithmetic in the training job: the optimizer's weight-decay groups, gradient
accumulation over micro-batches, losses averaged over the data-parallel ranks, and the
held-out evaluation."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..booster import Booster, HybridParallelPlugin, PipelineModule


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
    through the pipeline (``HybridParallelPlugin.evaluate_pipeline``)."""
    model.eval()
    losses = []
    for x, y in batches:
        x, y = booster.to_device((x, y))
        if isinstance(model, PipelineModule) and isinstance(booster.plugin, HybridParallelPlugin):
            losses.append(booster.plugin.evaluate_pipeline(x, y).item())
        else:
            with torch.no_grad():
                losses.append(model(x, y).item())
    model.train()
    return _mean_over_ranks(sum(losses) / len(losses), group)


def _accumulate(
    booster: Booster,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: tuple[torch.Tensor, torch.Tensor],
    *,
    n: int,
    group: Any,
    check: Callable[[float], None],
) -> float:
    """Forward and backward of the step's ``n`` micro-batches (rows of ``batch``), each loss
    scaled by ``1 / n`` so the gradients are the whole batch's; ``check`` sees each loss
    (averaged over ``group``, the data-parallel ranks) before its backward. The mean loss."""
    total = 0.0
    for x, y in zip(batch[0].chunk(n), batch[1].chunk(n), strict=True):
        loss = model(x, y)
        value = _mean_over_ranks(loss.item(), group)
        check(value)
        booster.backward(loss / n if n > 1 else loss, optimizer)
        total += value
    return total / n
