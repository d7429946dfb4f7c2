"""The hybrid plugin's pipeline steps: one training step of this rank's stages through a schedule
(ZeRO's loss scale and tied gradients handled), and one forward-only evaluation."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from colossal_contracts import ConfigError
from colossal_models import PipelineStages
from colossal_parallel import ProcessMesh
from colossal_parallel.pipeline import PipelineSchedule, run_pipeline, run_pipeline_forward
from colossal_zero import LowLevelZeroOptimizer

from ._pp_zero2 import sum_tied_zero2_grads

__all__ = ["PipelineModule", "pipeline_loss", "pipeline_step"]


class PipelineModule(nn.Module):
    """This rank's pipeline chunks. Train it with ``Booster.execute_pipeline``, not a call."""

    def __init__(self, chunks: list[nn.Module]):
        super().__init__()
        self.chunks = nn.ModuleList(chunks)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise ConfigError(
            "a pipelined model runs whole steps: call booster.execute_pipeline(x, y, model, "
            "optimizer) instead of model(x, y)"
        )


def pipeline_step(
    stages: PipelineStages,
    mesh: ProcessMesh,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    optimizer: torch.optim.Optimizer,
    *,
    schedule: PipelineSchedule,
    boundary_dtype: torch.dtype,
    device: torch.device,
    sp: int,
    zero_stage: int,
) -> torch.Tensor:
    """Forward and backward of one batch (on ``device``) through ``schedule``; the batch's mean
    loss on every rank. The optimizer's gradients are complete after it (the tied embedding's
    first + last stage sum included)."""
    b, t = inputs.shape[0], inputs.shape[-1]
    m = schedule.num_microbatches
    if b % m:
        raise ConfigError(
            f"batch {b} cannot be split into {m} micro-batches; use a batch that is a multiple "
            "of microbatches"
        )
    # ZeRO-1's .grad are views into its flat buffer; the pipeline replaces the tied
    # gradient by the first+last sum, so that sum is copied back into the view
    views = [q.grad for q in stages.tied]
    zero = optimizer if isinstance(optimizer, LowLevelZeroOptimizer) else None
    zero2 = zero if zero is not None and zero_stage == 2 else None
    # ZeRO: fp16's loss scale, and times sp (ZeRO averages over dp x sp; sp must be summed)
    scale = zero.loss_scale * sp if zero is not None else 1.0
    res = run_pipeline(
        stages.chunks,
        mesh,
        schedule,
        inputs,
        targets,
        boundary_shape=stages.boundary_shape(b // m, t),
        boundary_dtype=boundary_dtype,
        tied=() if zero2 is not None else stages.tied,  # ZeRO-2: summed after its reduction
        device=device,
        loss_scale=scale,
    )
    if zero2 is not None:
        sum_tied_zero2_grads(zero2, stages.tied, mesh)
    with torch.no_grad():
        for q, view in zip(stages.tied, views):
            if view is not None and q.grad is not view:
                view.copy_(q.grad)
                q.grad = view
    return res.loss.detach()


def pipeline_loss(
    stages: PipelineStages,
    mesh: ProcessMesh,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    *,
    microbatches: int,
    boundary_dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor:
    """The batch's mean loss through the pipeline, forward only (``run_pipeline_forward``: no
    activations kept, gradients untouched); the same on every rank of the pipeline."""
    b, t = inputs.shape[0], inputs.shape[-1]
    m = microbatches if b % microbatches == 0 else 1
    return run_pipeline_forward(
        stages.chunks,
        mesh,
        inputs,
        targets,
        num_microbatches=m,
        boundary_shape=stages.boundary_shape(b // m, t),
        boundary_dtype=boundary_dtype,
        device=device,
    )
