"""``grid_cross_entropy``: mean cross-entropy of logits whose vocabulary is split along a mesh axis.

The logits never leave their rank: the max, the sum of exponentials and the target's logit are
all-reduced along ``hidden_axis`` (one value per local row each), and the per-row losses are summed
over the row axes. The loss is then the same number on every rank of the tensor-parallel block;
each rank back-propagates it, so these all-reduces pass gradients through unchanged (the
consumer is replicated) and the logits' gradient is formed locally.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from colossal_contracts import ConfigError

from .._autograd import reduce_from_axis
from .._mesh import ProcessMesh
from ._layout import TpLayout

__all__ = ["grid_cross_entropy"]


def grid_cross_entropy(
    logits: torch.Tensor, targets: torch.Tensor, mesh: ProcessMesh, layout: TpLayout
) -> torch.Tensor:
    """Mean over every token of ``-log softmax(logits)[target]``; a scalar on every rank.

    ``logits``: local block ``(b, ..., V / size(hidden_axis))``; ``targets``: local ids
    ``(b, ...)`` split the same way (``split_to_layout(..., hidden=False)``).
    """
    if logits.shape[:-1] != targets.shape or targets.dtype not in (torch.int64, torch.int32):
        raise ConfigError(
            f"cross-entropy: targets must be integer ids shaped like logits without the last dim; "
            f"got logits {tuple(logits.shape)} and targets {targets.dtype} {tuple(targets.shape)}"
        )
    comm, axis = mesh.comm, layout.hidden_axis
    v_local = logits.shape[-1]
    start = mesh.coord(axis) * v_local
    with torch.no_grad():
        row_max = comm.all_reduce(
            logits.max(dim=-1, keepdim=True).values, axis, op=dist.ReduceOp.MAX
        )
    shifted = logits - row_max
    sum_exp = reduce_from_axis(shifted.exp().sum(-1), comm, axis)
    local = targets.long() - start
    inside = (local >= 0) & (local < v_local)
    picked = shifted.gather(-1, local.clamp(0, v_local - 1).unsqueeze(-1)).squeeze(-1)
    target_logit = reduce_from_axis(picked * inside.to(picked.dtype), comm, axis)
    total = (sum_exp.log() - target_logit).sum()
    count = targets.numel()
    for a in layout.row_axes:
        total = reduce_from_axis(total, comm, a)
        count *= mesh.size(a)
    return total / count
