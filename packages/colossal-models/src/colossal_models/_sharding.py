"""``describe_sharding``: for every parameter of a model that ``parallelize`` sharded, the mesh
axes it is split along and those it is replicated over (colossal-contracts' ``ParamSharding``),
which optimizers use to agree on gradient norms and overflow over the whole mesh.

[Note: sharding from the plan] As in [Note: index model], a float64 copy of the unsharded model
whose elements hold their global indices is parallelized with the same plan. For each
tensor-parallel sub-axis, the ranks along it compare a fingerprint of each parameter's indices
(sum, sum of squares, min, max, numel): equal on every rank means the same elements, so the
parameter is replicated along that axis; otherwise each rank holds other elements and it is
split. This reads the plan itself, so every mode (1d, 2d, 2.5d, 3d) is described the same way.
Axes of size 1 are left out. Pipeline stages are not described (not yet handled here).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from colossal_contracts import ConfigError, ParamSharding, ShardAxis
from colossal_parallel import ProcessMesh

from ._gather import _comm_device
from ._parallelize import parallelize

__all__ = ["describe_sharding"]


@torch.no_grad()
def describe_sharding(model: nn.Module, mesh: ProcessMesh) -> dict[str, ParamSharding]:
    """Name -> ``ParamSharding`` for every parameter of ``model`` (a ``GPT`` or ``PaLM`` that
    ``parallelize(model, mesh)`` sharded). Collective over the tensor-parallel axes; builds a
    float64 copy of the unsharded model once (setup cost, see [Note: sharding from the plan])."""
    config = getattr(model, "config", None)
    if config is None:
        raise ConfigError(f"describe_sharding needs a GPT or PaLM, got {type(model).__name__}")
    index = type(model)(config).to(torch.float64)
    total = 1
    for p in index.parameters():
        p.copy_(torch.arange(total, total + p.numel(), dtype=torch.float64).view_as(p))
        total += p.numel()
    parallelize(index, mesh, mesh.config.tp_mode)
    where = dict(index.named_parameters())
    names = [n for n, _ in model.named_parameters()]
    missing = [n for n in names if n not in where]
    if missing:
        raise ConfigError(
            f"describe_sharding: {missing[:3]} are not parameters of the parallelized plan; pass "
            "the model that parallelize(model, mesh) returned, with the same mesh"
        )
    prints = torch.stack([_fingerprint(where[n]) for n in names])  # (P, 5)
    split: dict[str, list[ShardAxis]] = {n: [] for n in names}
    replicated: dict[str, list[ShardAxis]] = {n: [] for n in names}
    for name in mesh.config.tp_axes:
        size = mesh.size(name)
        if size == 1:
            continue
        axis = ShardAxis(name, mesh.group(name), size, mesh.coord(name))
        mine = prints.to(_comm_device(axis.group))  # NCCL gathers CUDA tensors only
        every = [torch.empty_like(mine) for _ in range(size)]
        dist.all_gather(every, mine, group=axis.group)
        every = [e.cpu() for e in every]
        same = torch.stack([(e == prints).all(dim=1) for e in every]).all(dim=0)
        for n, s in zip(names, same.tolist(), strict=True):
            (replicated if s else split)[n].append(axis)
    return {n: ParamSharding(tuple(split[n]), tuple(replicated[n])) for n in names}


def _fingerprint(p: torch.Tensor) -> torch.Tensor:
    idx = p.detach().reshape(-1)
    if idx.numel() == 0:
        return torch.zeros(5, dtype=torch.float64)
    return torch.stack(
        [idx.sum(), idx.square().sum(), idx.min(), idx.max(), torch.tensor(float(idx.numel()))]
    ).to(torch.float64)
