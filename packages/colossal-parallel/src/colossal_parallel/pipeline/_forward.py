"""``run_pipeline_forward``: a batch's mean loss through the pipeline, forward only (no
activations kept, no gradient sent back): evaluation of a pipelined model.

[Note: forward-only order] Every rank runs its (micro-batch, chunk) forwards in micro-batch
order and, within one, in chunk order. Virtual stage ``c * pp + r`` waits only for stage
``c * pp + r - 1`` of the same micro-batch, which every rank reaches earlier in that same order,
and sends never block ([Note: pipeline messages]), so the order cannot deadlock. Message tags
are those of ``run_pipeline``'s activations.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from colossal_contracts import ConfigError

from .._mesh import ProcessMesh
from ._partition import stage_rank
from ._runtime import AXIS, _device_of, _Mailbox

__all__ = ["run_pipeline_forward"]


@torch.no_grad()
def run_pipeline_forward(
    chunks: Sequence[nn.Module],
    mesh: ProcessMesh,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    *,
    num_microbatches: int,
    boundary_shape: Sequence[int],
    boundary_dtype: torch.dtype = torch.float32,
    device: torch.device | None = None,
) -> torch.Tensor:
    """The mean loss of the batch (0-dim, the same on every ``pp`` rank), computed forward only
    in ``num_microbatches`` equal micro-batches; ``chunks``, the stage calls and ``device`` as
    in ``run_pipeline``. Gradients are untouched."""
    m = num_microbatches
    if m < 1 or inputs.shape[0] % m or targets.shape[:1] != inputs.shape[:1]:
        raise ConfigError(
            f"a batch of {inputs.shape[0]} rows (targets {tuple(targets.shape)}) cannot be split "
            f"into {m} equal micro-batches; use a multiple of the micro-batch count"
        )
    p, me, v = mesh.size(AXIS), mesh.coord(AXIS), len(chunks)
    num_stages, shape, last = p * v, tuple(boundary_shape), p * v - 1
    dev = device if device is not None else _device_of(chunks, inputs)
    xs, ts = inputs.to(dev).chunk(m), targets.to(dev).chunk(m)
    box = _Mailbox(mesh, dev)
    loss_sum = torch.zeros((), dtype=torch.promote_types(boundary_dtype, torch.float32), device=dev)
    for mb in range(m):  # [Note: forward-only order]
        for c in range(v):
            stage = c * p + me
            tag = 2 * (mb * num_stages + stage)
            if stage == 0:
                x = xs[mb]
            else:
                x = box.recv(shape, boundary_dtype, stage_rank(stage - 1, p)[0], tag)
            with torch.profiler.record_function("pipeline::forward_only"):
                out = chunks[c](x, ts[mb]) if stage == last else chunks[c](x)
            if stage == last:
                loss_sum += out.to(loss_sum.dtype)
            else:
                box.send(out, stage_rank(stage + 1, p)[0], tag + 2)
    box.flush()
    return mesh.comm.broadcast(loss_sum / m, AXIS, src=stage_rank(last, p)[0])
