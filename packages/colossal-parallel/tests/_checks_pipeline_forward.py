"""Rank side of ``test_pipeline_forward.py``: ``run_pipeline_forward`` on the toy model of
``_checks_pipeline.py`` (its stages and single-rank reference)."""

from __future__ import annotations

import torch.distributed as dist
from _checks_pipeline import B, W, _reference, my_stages, setup

from colossal_parallel.pipeline import run_pipeline_forward


def run_forward(cases: list[tuple[int, int]]) -> list[dict]:
    """For each ``(microbatches, chunks per rank)``: the loss error against one rank, whether
    any gradient appeared, and the bytes sent against one activation per stage boundary."""
    p = dist.get_world_size()
    mesh, weights, x, y = setup(p)
    ref_loss, _ = _reference(weights, x, y)
    out = []
    for m, v in cases:
        mine, chunks, _ = my_stages(mesh, weights, p, v)
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
