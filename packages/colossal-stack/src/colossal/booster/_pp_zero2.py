"""Pipelines with ZeRO-2: the tied embedding's gradient summed after ZeRO reduced it.

[Note: pipeline with ZeRO-2] ZeRO-2 reduce-scatters gradients over dp while backward runs, one
backward (micro-batch) at a time, and keeps only this rank's averaged shard; so when the pipeline
ends, the first and last stage each hold ``avg_dp(g_first)`` and ``avg_dp(g_last)`` of the tied
embedding, in shards whose element ranges differ (the two stages' buckets hold other
parameters). Averaging is linear, so the sum the pipeline needs is ``avg_dp(g_first) +
avg_dp(g_last)``: each rank rebuilds the tied parameter's averaged gradient from the dp shards
(an all-reduce of disjoint ranges), swaps it with the other stage's rank of the same dp (and tp)
coordinate, and keeps its own range of ``first + last`` (the same bits on both).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from colossal_parallel import ProcessMesh, exchange
from colossal_zero import LowLevelZeroOptimizer

__all__ = ["sum_tied_zero2_grads"]

_TAG = (1 << 24) + (1 << 20)  # above the pipeline's activation, gradient and tied tags


@torch.no_grad()
def sum_tied_zero2_grads(
    optimizer: LowLevelZeroOptimizer, tied: list[nn.Parameter], mesh: ProcessMesh
) -> None:
    """See [Note: pipeline with ZeRO-2]; a no-op off the first and last stage."""
    p, me = mesh.size("pp"), mesh.coord("pp")
    if p == 1 or not tied or me not in (0, p - 1):
        return
    peer = p - 1 - me
    for i, q in enumerate(tied):
        name = optimizer.canonical_names[id(q)]
        bucket = next(b for b in optimizer.buckets if name in b.params)
        part = bucket.grad.shard_view(name)
        mine = torch.zeros(q.numel(), dtype=bucket.grad.dtype, device=q.device)
        if part is not None:
            view, lo, hi = part
            mine[lo:hi] = view
        if optimizer.world > 1:  # the shards are disjoint: their sum is the whole gradient
            dist.all_reduce(mine, group=optimizer.group)
        theirs = torch.empty_like(mine)
        works = exchange(
            mesh.comm, "pp", sends=[(mine, peer, _TAG + i)], recvs=[(theirs, peer, _TAG + i)]
        )
        for w in works:
            w.wait()
        total = mine + theirs if me == 0 else theirs + mine  # first + last on both ranks
        if part is not None:
            view.copy_(total[lo:hi])
