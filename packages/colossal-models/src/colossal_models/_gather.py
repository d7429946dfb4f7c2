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

[Note: streamed tp gather] ``gather_full_state_dict`` holds the whole model (and its index copy)
on every rank. The streamed path (``stream_full_state``) takes the shards one at a time, in an
order every tp rank shares (Gemini's chunk order: each rank's chunks hold the same parameters in
the same order, only their sizes differ), and assembles each unsharded tensor on the group's
first rank alone from ``shard_map``'s boxes of every peer (``all_shard_maps``, computed once).
A peer sends its shard only when its boxes add elements that rank and lower ones lack, so a
tensor replicated over tp moves nothing. The first rank holds one full tensor plus one shard
beyond the caller's own buffers; the others hold nothing new. Each tensor's name is checked
across the group first (one 8-byte all-gather), so a different order fails loudly instead of
mixing tensors.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence

import torch
import torch.distributed as dist
from torch import nn

from colossal_contracts import ConfigError
from colossal_parallel import ProcessMesh

from ._parallelize import parallelize
from ._shard_map import Box, ShardMap, shard_map

__all__ = ["all_shard_maps", "gather_full_state_dict", "gather_full_tensor", "stream_full_state"]


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


def all_shard_maps(model: nn.Module, mesh: ProcessMesh) -> list[dict[str, ShardMap]]:
    """``shard_map(model, mesh)`` of every rank of the tp group, by group rank: what each
    tensor-parallel peer holds of every parameter (see [Note: streamed tp gather]). Collective
    over ``tp``; builds a float64 index copy of the unsharded model once, so compute it at
    setup and keep it (the maps themselves are a few boxes per parameter)."""
    mine = shard_map(model, mesh)
    every: list[dict[str, ShardMap] | None] = [None] * mesh.size("tp")
    dist.all_gather_object(every, mine, group=mesh.group("tp"))
    return [m for m in every if m is not None]


def stream_full_state(
    model: nn.Module,
    mesh: ProcessMesh,
    values: Iterable[tuple[str, torch.Tensor]],
    maps: Sequence[Mapping[str, ShardMap]],
    *,
    gather: bool = True,
) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` of the unsharded state from this rank's ``values`` (its shard of every
    parameter, tied names possibly repeated, then buffers): each parameter once under its
    unsharded name, then the buffers as given, yielded on the tp group's first rank only.
    ``maps``: ``all_shard_maps(model, mesh)``. Collective over ``tp`` unless ``gather`` is
    False (a group whose result nobody writes: it drains ``values`` and yields nothing).
    Every rank iterates to the end; see [Note: streamed tp gather]."""
    group = mesh.group("tp")
    me = dist.get_rank(group)
    params = {n for n, _ in model.named_parameters(remove_duplicate=False)}
    for name, shard in values:
        if not gather:
            continue
        if name not in params:  # a buffer: the same on every tp rank
            if me == 0:
                yield name, shard
            continue
        if name not in maps[me]:
            continue  # a tied alias: the parameter is written under its first name
        _check_same_name(name, group)
        per = [m[name] for m in maps]
        if not any(m.pieces for m in per):
            continue  # no unsharded counterpart (index 0, see [Note: index model])
        full = gather_full_tensor(shard, per, group)
        if full is not None:
            yield per[0].name, full


def _check_same_name(name: str, group: dist.ProcessGroup) -> None:
    code = torch.tensor([zlib.crc32(name.encode())], dtype=torch.int64, device=_comm_device(group))
    every = [torch.empty_like(code) for _ in range(dist.get_world_size(group))]
    dist.all_gather(every, code, group=group)
    if any(int(e) != int(code) for e in every):
        raise ConfigError(
            f"stream_full_state: the tp ranks reached different parameters at {name!r}; every "
            "rank must iterate its shards in the same order (the model's parameter order)"
        )


@torch.no_grad()
def gather_full_tensor(
    shard: torch.Tensor, maps: Sequence[ShardMap], group: dist.ProcessGroup, *, dst: int = 0
) -> torch.Tensor | None:
    """The unsharded tensor of one parameter on group rank ``dst`` (None on the others), from
    every rank's ``shard`` of it; ``maps[r]`` is group rank ``r``'s ``ShardMap`` of it.
    Collective over ``group``: the ranks whose pieces add elements not held by ``dst`` or a
    lower rank send their shard to ``dst``, one after the other, so ``dst`` holds the full
    tensor plus one shard and the others nothing new ([Note: streamed tp gather])."""
    senders = _senders(maps, dst)
    me = dist.get_rank(group)
    dev = _comm_device(group)
    if me != dst:
        if me in senders:
            dist.send(shard.detach().reshape(-1).contiguous().to(dev), group_dst=dst, group=group)
        return None
    full = torch.empty(maps[dst].shape, dtype=shard.dtype)
    _place(full, shard.detach().cpu(), maps[dst])
    for r in senders:
        if r == dst:
            continue
        shape = _local_shape(maps[r])
        buf = torch.empty(math.prod(shape), dtype=shard.dtype, device=dev)
        dist.recv(buf, group_src=r, group=group)
        _place(full, buf.cpu().view(shape), maps[r])
        del buf
    return full


def _senders(maps: Sequence[ShardMap], dst: int) -> list[int]:
    """The group ranks (``dst`` first) whose pieces cover some element no earlier one holds;
    ``ConfigError`` when they do not cover the unsharded tensor, or name different ones."""
    first = maps[dst]
    if any(m.name != first.name or m.shape != first.shape for m in maps):
        names = sorted({(m.name, m.shape) for m in maps})
        raise ConfigError(
            f"gather_full_tensor: the tp ranks' shards are of different tensors {names}"
        )
    left = [Box((0,) * len(first.shape), tuple(first.shape))]
    out = []
    for r in [dst, *(r for r in range(len(maps)) if r != dst)]:
        boxes = [p.to_global(p.local) for p in maps[r].pieces]
        rest = left
        for b in boxes:
            rest = [piece for box in rest for piece in box.subtract(b)]
        if sum(b.numel for b in rest) < sum(b.numel for b in left):
            out.append(r)
            left = rest
    if sum(b.numel for b in left):
        raise ConfigError(
            f"gather_full_tensor: the shards of {first.name!r} do not cover it; pass every tp "
            "rank's shard_map of the model that parallelize(model, mesh) returned"
        )
    return out


def _local_shape(m: ShardMap) -> tuple[int, ...]:
    """The local shard's shape: the pieces cover it (see ``ShardMap``)."""
    ndim = len(m.shape)
    return tuple(max(p.local.offsets[d] + p.local.sizes[d] for p in m.pieces) for d in range(ndim))


def _place(full: torch.Tensor, local: torch.Tensor, m: ShardMap) -> None:
    for p in m.pieces:
        full[p.to_global(p.local).slices()] = p.global_view(local[p.local.slices()])


def _comm_device(group: dist.ProcessGroup) -> torch.device:
    """Where tensors must be for point-to-point sends on ``group``: the current CUDA device
    under NCCL (not run on the CPU-only test machines), else the CPU."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
