"""``gather_full_state_dict``: the unsharded state dict of a model that ``parallelize`` sharded.

[Note: index model] Sharding is a pure function of the weights, and it only selects and copies
elements (never adds or scales them). So parallelizing a copy of the unsharded model whose every
parameter element holds its own global index (in float64, exact up to 2**53) tells each rank, for
every element of every shard it holds, where that element lives in the unsharded model. The
ranks of the tensor-parallel block all-gather their shards and those indices, and every rank
writes the values to their places. Elements stored on several ranks (replicated vectors) are
written several times with the same value. Index 0 is never used, so a sharded parameter that has
no unsharded counterpart (the frozen zero bias a bias-free LayerNorm gets on the grid modes)
is recognised and skipped.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.distributed as dist
from torch import nn

from colossal_contracts import ConfigError
from colossal_parallel import ProcessMesh

from ._parallelize import parallelize

__all__ = ["gather_full_state_dict"]


@torch.no_grad()
def gather_full_state_dict(
    model: nn.Module, mesh: ProcessMesh, *, values: Mapping[str, torch.Tensor] | None = None
) -> dict[str, torch.Tensor]:
    """Full tensors, under the unsharded model's names, on every rank (collective over ``tp``).

    ``model`` is a ``GPT`` or ``PaLM`` that ``parallelize(model, mesh, ...)`` sharded.
    ``values``: this rank's shard of each parameter by name, when the module's parameters do not
    hold them (Gemini keeps them in chunks: pass its ``full_state_dict()``). Builds a
    float64 index copy of the unsharded model (see [Note: index model]): memory of the order of
    twice the unsharded parameters, so use it for export, not every step.
    """
    config = getattr(model, "config", None)
    if config is None:
        raise ConfigError(f"gather_full_state_dict needs a GPT or PaLM, got {type(model).__name__}")
    index = type(model)(config).to(torch.float64)
    shapes: dict[str, tuple[torch.Size, int]] = {}
    total = 1  # index 0 marks "no unsharded counterpart"
    for name, p in index.named_parameters():
        p.copy_(torch.arange(total, total + p.numel(), dtype=torch.float64).view_as(p))
        shapes[name] = (p.shape, total)
        total += p.numel()
    parallelize(index, mesh, mesh.config.tp_mode)
    where = dict(index.named_parameters())

    group, n = mesh.group("tp"), mesh.size("tp")
    flat: torch.Tensor | None = None
    filled = torch.zeros(total, dtype=torch.bool)
    for name, p in model.named_parameters():
        idx = where[name].detach().reshape(-1).to(torch.long)
        shard = p if values is None else values[name]
        local = shard.detach().reshape(-1).contiguous()
        if flat is None:
            flat = torch.empty(total, dtype=local.dtype)
        idx_all = [torch.empty_like(idx) for _ in range(n)]
        val_all = [torch.empty_like(local) for _ in range(n)]
        dist.all_gather(idx_all, idx, group=group)
        dist.all_gather(val_all, local, group=group)
        idx_cat, val_cat = torch.cat(idx_all), torch.cat(val_all)
        real = idx_cat > 0
        flat[idx_cat[real]] = val_cat[real].to(flat.dtype)
        filled[idx_cat[real]] = True
    if flat is None or not bool(filled[1:].all()):
        raise ConfigError(
            "gather_full_state_dict: the shards do not cover the unsharded model; pass the model "
            "that parallelize(model, mesh) returned, with the same mesh"
        )
    return {
        name: flat[start : start + shape.numel()].view(shape).clone()
        for name, (shape, start) in shapes.items()
    }
