"""Rank-side checks of the axis switch of dynamic axial parallelism (run inside a World)."""

from __future__ import annotations

import torch

from colossal_parallel import (
    MeshConfig,
    ProcessMesh,
    gather_along,
    split_along,
    switch_shard_dim,
    switch_shard_dim_async,
)

SHAPE = (2, 8, 12, 3)  # (B, rows, cols, C): rows and cols divisible by 2 and 4


def full_input() -> torch.Tensor:
    g = torch.Generator().manual_seed(7)
    return torch.randn(SHAPE, generator=g)


def weights() -> torch.Tensor:
    g = torch.Generator().manual_seed(8)
    return torch.randn(SHAPE, generator=g)


def switch_roundtrip(p: int, use_async: bool) -> dict:
    """Split rows, switch to cols, weight, switch back, gather; forward values, input gradient
    and counted bytes of each pass."""
    mesh = ProcessMesh(MeshConfig(tp=p))
    comm = mesh.comm
    x = full_input().requires_grad_(True)
    rows = split_along(x, comm, "tp", 1)  # (B, 8/p, 12, C)
    comm.counter.reset()
    if use_async:
        pending = switch_shard_dim_async(rows, comm, "tp", from_dim=1, to_dim=2)
        busy = torch.randn(64, 64) @ torch.randn(64, 64)  # compute while the transfer runs
        cols = pending.wait()
    else:
        busy = None
        cols = switch_shard_dim(rows, comm, "tp", from_dim=1, to_dim=2)  # (B, 8, 12/p, C)
    fwd_a2a = comm.counter.bytes(op="all_to_all")
    w_cols = weights().chunk(p, dim=2)[mesh.coord("tp")]
    y_cols = cols * w_cols  # column-wise work on the whole rows axis
    back = switch_shard_dim(y_cols, comm, "tp", from_dim=2, to_dim=1)
    y = gather_along(back, comm, "tp", 1, grad="split")
    mid = comm.counter.bytes(op="all_to_all")
    y.sum().backward()
    out = {
        "cols": cols.detach(),
        "coord": mesh.coord("tp"),
        "y": y.detach(),
        "grad": x.grad,
        "fwd_a2a": fwd_a2a,
        "both_a2a": mid,
        "bwd_a2a": comm.counter.bytes(op="all_to_all") - mid,
        "a2a_calls": comm.counter.calls(op="all_to_all"),
        "busy": busy is not None,
    }
    mesh.close()
    return out


def switch_errors(p: int) -> list[str]:
    """Bad dims and an indivisible target dim raise ConfigError before any collective."""
    mesh = ProcessMesh(MeshConfig(tp=p))
    msgs = []
    for kwargs, t in (
        ({"from_dim": 1, "to_dim": 1}, torch.zeros(4, 4)),
        ({"from_dim": 0, "to_dim": 5}, torch.zeros(4, 4)),
        ({"from_dim": 0, "to_dim": 1}, torch.zeros(4, p + 1)),
    ):
        for fn in (switch_shard_dim, switch_shard_dim_async):
            try:
                fn(t, mesh.comm, "tp", **kwargs)
            except Exception as e:
                msgs.append(f"{type(e).__name__}: {e}")
    msgs.append(f"calls={mesh.comm.counter.calls()}")
    mesh.close()
    return msgs


def _nodes(root: torch.autograd.graph.Node) -> dict[str, torch.autograd.graph.Node]:
    """Autograd nodes reachable from ``root``, by name (the last found of each name)."""
    found: dict[str, torch.autograd.graph.Node] = {}
    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        found[node.name()] = node
        stack.extend(n for n, _ in node.next_functions)
    return found


def async_backward_order(p: int) -> list[str]:
    """Names in the order backward ran them: the inverse all-to-all is started (finish node),
    the gradient of work done between start and wait is computed, then it is waited for."""
    mesh = ProcessMesh(MeshConfig(tp=p))
    comm = mesh.comm
    x = full_input().requires_grad_(True)
    w = torch.ones(3, requires_grad=True)
    log: list[str] = []
    w.register_hook(lambda g: log.append("work between") or g)
    pending = switch_shard_dim_async(
        split_along(x, comm, "tp", 1), comm, "tp", from_dim=1, to_dim=2
    )
    between = (x * w).sum()  # autograd nodes created after the start, before the wait
    cols = pending.wait()
    loss = cols.sum() + between
    nodes = _nodes(loss.grad_fn)
    for name in nodes:
        if name.endswith(("_StartBackward", "_FinishBackward")):
            nodes[name].register_hook(lambda gi, go, n=name: log.append(n) or None)
    loss.backward()
    mesh.close()
    return log
