"""Rank-side checks for the mesh and counted collectives (run inside a colossal_testing World)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from colossal_parallel import (
    CommStat,
    MeshConfig,
    ProcessMesh,
    copy_to_axis,
    gather_along,
    reduce_from_axis,
    reduce_scatter_along,
    release_shared_groups,
    split_along,
)
from colossal_parallel._group_cache import shared_group_stats


def describe_mesh(cfg: MeshConfig) -> dict:
    """Sizes, coordinates and group members of every axis, plus a sum over each group."""
    mesh = ProcessMesh(cfg)
    out = {"rank": mesh.rank, "world_size": mesh.world_size}
    for axis in mesh.axes:
        # the group really contains the listed ranks: an all_gather of global ranks says so
        got = mesh.comm.all_gather(torch.tensor([float(mesh.rank)]), axis)
        out[axis] = {
            "size": mesh.size(axis),
            "coord": mesh.coord(axis),
            "ranks": mesh.ranks(axis),
            "gathered": [int(v) for v in got.tolist()],
            "group_rank": dist.get_rank(mesh.group(axis)),
        }
    mesh.close()
    return out


def collectives(cfg: MeshConfig, axis: str) -> dict:
    """Run each collective once along ``axis`` and return the results and the counter."""
    mesh = ProcessMesh(cfg)
    comm = mesh.comm
    r = float(mesh.rank)
    c = mesh.coord(axis)
    p = mesh.size(axis)
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3) + 10 * r  # (2, 3)
    res = {"coord": c, "size": p, "ranks": mesh.ranks(axis)}
    res["all_reduce"] = comm.all_reduce(t, axis)
    res["all_reduce_max"] = comm.all_reduce(t, axis, op=dist.ReduceOp.MAX)
    res["all_gather0"] = comm.all_gather(t, axis, dim=0)
    res["all_gather1"] = comm.all_gather(t, axis, dim=1)
    big = torch.arange(4.0 * p * 3).reshape(4 * p, 3) + r  # (4p, 3)
    res["reduce_scatter0"] = comm.reduce_scatter(big, axis, dim=0)
    res["reduce_scatter1"] = comm.reduce_scatter(big.t().contiguous(), axis, dim=1)
    res["broadcast"] = comm.broadcast(t, axis, src=p - 1)
    res["reduce"] = comm.reduce(t, axis, dst=0)
    a2a = torch.arange(2.0 * p * 5).reshape(2 * p, 5) + 100 * r  # (2p, 5)
    res["all_to_all"] = comm.all_to_all(a2a, axis, split_dim=0, cat_dim=1)
    res["input_untouched"] = torch.equal(t, torch.arange(6.0).reshape(2, 3) + 10 * r)
    res["counter"] = comm.counter.snapshot()
    res["total_bytes"] = comm.counter.bytes()
    res["axis_bytes"] = comm.counter.bytes(axis=axis)
    res["calls"] = comm.counter.calls()
    comm.counter.reset()
    res["after_reset"] = comm.counter.bytes()
    mesh.close()
    return res


def autograd_ops(cfg: MeshConfig, axis: str) -> dict:
    """Forward and backward of each autograd collective, with the bytes each pass counted."""
    mesh = ProcessMesh(cfg)
    comm = mesh.comm
    p, c, r = mesh.size(axis), mesh.coord(axis), float(mesh.rank)
    out: dict = {}
    for name, fn in {
        "copy": lambda x: copy_to_axis(x, comm, axis),
        "reduce": lambda x: reduce_from_axis(x, comm, axis),
        "split": lambda x: split_along(x, comm, axis, 1),
        "gather": lambda x: gather_along(x, comm, axis, 1),
        "gather_rs": lambda x: gather_along(x, comm, axis, 1, grad="reduce_scatter"),
        "rs": lambda x: reduce_scatter_along(x, comm, axis, 1),
    }.items():
        x = (torch.arange(2.0 * 2 * p).reshape(2, 2 * p) + r).requires_grad_(True)  # (2, 2p)
        comm.counter.reset()
        y = fn(x)
        fwd = comm.counter.snapshot()
        w = torch.arange(y.numel(), dtype=torch.float32).reshape(y.shape) + 1 + c
        (y * w).sum().backward()
        out[name] = {
            "y": y.detach(),
            "w": w,
            "grad": x.grad,
            "fwd": fwd,
            "total": comm.counter.snapshot(),
        }
    out["coord"], out["size"] = c, p
    mesh.close()
    return out


def bad_config_then_collective(cfg: MeshConfig) -> str:
    """A bad config raises before any collective: the world is still usable afterwards."""
    try:
        ProcessMesh(cfg)
    except ValueError as e:
        msg = str(e)
    else:
        msg = ""
    t = torch.ones(1)
    dist.all_reduce(t)  # proves no rank is stuck inside a half-built mesh
    return f"{int(t.item())}|{msg}"


def stat_type() -> str:
    return CommStat.__name__


def shared_groups_across_meshes() -> dict:
    """Two meshes asking for the same rank sets share their groups; a closed mesh's groups
    still carry a collective; ``release_shared_groups`` destroys them and starts the counts
    again. (Starts from a released cache: other checks of the world built meshes before.)"""
    release_shared_groups()
    a = ProcessMesh(MeshConfig(dp=2, tp=2))
    after_a = shared_group_stats()
    b = ProcessMesh(MeshConfig(dp=2, pp=2))
    after_b = shared_group_stats()
    shared = a.group("dp") is b.group("pp") and a.group("tp") is b.group("dp")
    a.close()
    total = b.comm.all_reduce(torch.tensor([1.0]), "pp")  # a's close left a's dp group alive
    b.close()
    destroyed = release_shared_groups()
    c = ProcessMesh(MeshConfig(dp=2, tp=2))  # created afresh after the release
    after_c = shared_group_stats()
    summed = c.comm.all_reduce(torch.tensor([float(c.rank)]), "tp")
    c.close()
    release_shared_groups()
    return {
        "after_a": after_a,
        "after_b": after_b,
        "shared": shared,
        "pp_sum": float(total[0]),
        "destroyed": destroyed,
        "after_c": after_c,
        "tp_sum": float(summed[0]),
    }
