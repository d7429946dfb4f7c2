"""Rank side of ``test_pipeline_forward.py``: ``run_pipeline_forward`` on the toy model of
``_checks_pipeline.py`` (its stages and single-rank reference)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from _checks_pipeline import B, L, Stage, W, _reference
from torch import nn

from colossal_parallel import (
    MeshConfig,
    ProcessMesh,
    partition_layers,
    run_pipeline_forward,
    stage_rank,
)


def run_forward(cases: list[tuple[int, int]]) -> list[dict]:
    """For each ``(microbatches, chunks per rank)``: the loss error against one rank, whether
    any gradient appeared, and the bytes sent against one activation per stage boundary."""
    p = dist.get_world_size()
    mesh = ProcessMesh(MeshConfig(pp=p))
    g = torch.Generator().manual_seed(0)
    weights = [torch.randn(W, W, generator=g) / W**0.5 for _ in range(L)]
    x, y = torch.randn(2, B, W, generator=g)
    ref_loss, _ = _reference(weights, x, y)
    out = []
    for m, v in cases:
        runs = partition_layers(L, p * v)
        mine = [s for s in range(p * v) if stage_rank(s, p)[0] == mesh.coord("pp")]
        holds_tied = any(runs[s][0] == 0 or runs[s][-1] == L - 1 for s in mine)
        tied = nn.Parameter(weights[0].clone()) if holds_tied else None
        chunks = [Stage(weights, runs[s], tied) for s in mine]
        mesh.comm.counter.reset()
        loss = run_pipeline_forward(
            chunks, mesh, x, y, num_microbatches=m, boundary_shape=(B // m, W)
        )
        grads = [q.grad for c in chunks for q in c.parameters()]
        sends = sum(s != p * v - 1 for s in mine)
        out.append(
            {
                "loss_err": abs(loss.item() - ref_loss) / ref_loss,
                "any_grad": any(gr is not None for gr in grads),
                "sent": mesh.comm.counter.bytes("pp", "send"),
                "formula": m * (B // m) * W * 4 * sends,
            }
        )
    mesh.close()
    return out
