"""Rank-side checks of ``run_pipeline`` on a toy model (run inside a colossal_testing World).

The model is ``L`` layers ``x -> tanh(x W_i)`` with the first layer's matrix reused, transposed,
by the last (a tied pair, like an embedding and its head); the loss is the mean squared error.
Every rank builds the same model, keeps its virtual stages, and compares the pipeline's loss and
gradients with the whole model on one rank.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from colossal_parallel import MeshConfig, ProcessMesh
from colossal_parallel.pipeline import PipelineSchedule, partition_layers, run_pipeline, stage_rank

W, L, B = 8, 8, 8  # width, layers, batch


class Stage(nn.Module):
    """Layers ``layers`` of the toy model; ``tied`` is the first layer's matrix where used."""

    def __init__(self, weights: list[torch.Tensor], layers: range, tied: nn.Parameter | None):
        super().__init__()
        self.layers = layers
        self.first, self.last = layers[0] == 0, layers[-1] == L - 1
        self.w = nn.ParameterDict(
            {str(i): nn.Parameter(weights[i].clone()) for i in layers if 0 < i < L - 1}
        )
        self.tied = tied

    def forward(self, x, targets=None):
        for i in self.layers:
            if i == 0:
                x = torch.tanh(x @ self.tied)
            elif i == L - 1:
                x = torch.tanh(x @ self.tied.t())
            else:
                x = torch.tanh(x @ self.w[str(i)])
        return (x - targets).pow(2).mean() if targets is not None else x


def _reference(weights, x, y):
    params = [nn.Parameter(w.clone()) for w in weights[: L - 1]]
    h = x
    for i in range(L):
        h = torch.tanh(h @ (params[0].t() if i == L - 1 else params[i]))
    loss = (h - y).pow(2).mean()
    loss.backward()
    return loss.item(), {i: params[i].grad for i in range(L - 1)}


def setup(p: int) -> tuple[ProcessMesh, list[torch.Tensor], torch.Tensor, torch.Tensor]:
    """A ``pp=p`` mesh, the toy model's weights and one batch (the same on every rank)."""
    mesh = ProcessMesh(MeshConfig(pp=p))
    g = torch.Generator().manual_seed(0)
    weights = [torch.randn(W, W, generator=g) / W**0.5 for _ in range(L)]
    x, y = torch.randn(2, B, W, generator=g)
    return mesh, weights, x, y


def my_stages(
    mesh: ProcessMesh, weights: list[torch.Tensor], p: int, v: int
) -> tuple[list[int], list[Stage], nn.Parameter | None]:
    """This rank's virtual stages of ``p * v``, their modules, and the tied matrix if held."""
    runs = partition_layers(L, p * v)
    mine = [s for s in range(p * v) if stage_rank(s, p)[0] == mesh.coord("pp")]
    holds_tied = any(runs[s][0] == 0 or runs[s][-1] == L - 1 for s in mine)
    tied = nn.Parameter(weights[0].clone()) if holds_tied else None
    return mine, [Stage(weights, runs[s], tied) for s in mine], tied


def run_schedules(cases: list[tuple[str, int, int]]) -> list[dict]:
    """For each ``(kind, m, v)``: loss and gradient errors against one rank, and sent bytes."""
    p = dist.get_world_size()
    mesh, weights, x, y = setup(p)
    ref_loss, ref_grads = _reference(weights, x, y)
    out = []
    for kind, m, v in cases:
        mine, chunks, tied = my_stages(mesh, weights, p, v)
        mesh.comm.counter.reset()
        res = run_pipeline(
            chunks,
            mesh,
            PipelineSchedule(kind, m, v),
            x,
            y,
            boundary_shape=(B // m, W),
            tied=[tied] if tied is not None and p > 1 else [],
        )
        err = 0.0
        for c in chunks:
            for name, q in c.w.items():
                want = ref_grads[int(name)]
                err = max(err, float((q.grad - want).abs().max() / want.abs().max()))
        if tied is not None:
            want = ref_grads[0]
            err = max(err, float((tied.grad - want).abs().max() / want.abs().max()))
        sends = sum(s != p * v - 1 for s in mine) + sum(s != 0 for s in mine)
        out.append(
            {
                "loss_err": abs(res.loss.item() - ref_loss) / ref_loss,
                "grad_err": err,
                "sent": mesh.comm.counter.bytes("pp", "send"),
                "formula": m * (B // m) * W * 4 * sends
                + (W * W * 4 if tied is not None and p > 1 else 0),
                "timeline": len(res.timeline),
                "tied": None if tied is None else tied.grad.clone(),
            }
        )
    mesh.close()
    return out
