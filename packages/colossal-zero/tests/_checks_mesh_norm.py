"""Checks of ``mesh_grad_norm`` run on every rank of a 4-rank world (dp 2 x tp 2)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from colossal_contracts import ParamSharding, ShardAxis
from colossal_zero import mesh_grad_norm


def split_value(rank: int) -> float:
    return 1.0 + rank


def norm_on_grid() -> tuple[float, bool]:
    """Ranks 0,1 and 2,3 are tp groups; 0,2 and 1,3 dp groups. Each rank holds 3 elements of a
    split parameter and (its dp half of) 5 elements of a parameter replicated over tp."""
    rank = dist.get_rank()
    tp_groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    dp_groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    tp, dp = tp_groups[rank // 2], dp_groups[rank % 2]
    axis = ShardAxis("tp", tp, 2, rank % 2)
    shardings = {"w": ParamSharding(split=(axis,)), "ln": ParamSharding(replicated=(axis,))}
    w = torch.full((3,), split_value(rank))
    ln = torch.full((5,), 1.5)  # each dp rank holds a different half of it; same on tp replicas
    clean = mesh_grad_norm(
        [(w, shardings["w"]), (ln, shardings["ln"])], group=dp, shardings=shardings
    )
    ln_bad = ln.clone()
    if rank == 3:  # a replica that does not count in the norm overflows
        ln_bad[0] = float("inf")
    bad = mesh_grad_norm(
        [(w, shardings["w"]), (ln_bad, shardings["ln"])], group=dp, shardings=shardings
    )
    return clean.norm, bad.overflow
