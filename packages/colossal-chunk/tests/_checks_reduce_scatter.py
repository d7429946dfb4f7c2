"""Run on every rank by test_reduce_scatter.py ([Note: reduce-scatter on gloo])."""

import torch
import torch.distributed as dist
from _checks_gathered_cache import _kept_bytes

from colossal_chunk._gathered_cache import GatheredCache
from colossal_chunk._reduce_scatter import SummedAllToAll, _native, launch_reduce_scatter


def against_native(dtype: torch.dtype, integers: bool) -> dict[str, object]:
    """This rank's slice from the all-to-all path and from gloo's reduce_scatter of one buffer."""
    rank, ws = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(rank)
    n = 1000 * ws
    if integers:  # sums of small integers are exact in any order and dtype
        full = torch.randint(-8, 8, (n,), generator=g).to(dtype)
    else:
        full = torch.randn(n, generator=g).to(dtype)
    ours, native = torch.empty(n // ws, dtype=dtype), torch.empty(n // ws, dtype=dtype)
    work = launch_reduce_scatter(ours, full, None)
    kind = type(work).__name__
    assert work.wait() and work.wait()  # a second wait does nothing
    _native(native, full, group=None, async_op=True).wait()
    every = [torch.empty_like(full) for _ in range(ws)]
    dist.all_gather(every, full)
    expected = torch.stack([e.double() for e in every]).sum(0)[
        rank * (n // ws) : (rank + 1) * (n // ws)
    ]
    return {
        "kind": kind,
        "equal": torch.equal(ours, native),
        "exact": torch.equal(ours.double(), expected) if integers else None,
        "err": (ours.double() - expected).abs().max().item(),
        "native err": (native.double() - expected).abs().max().item(),
    }


def refuses_a_buffer_of_the_wrong_size() -> str:
    try:
        SummedAllToAll(torch.empty(3), torch.empty(7), None)
    except ValueError as e:
        return str(e)
    return ""


def unseen_by_dispatch_modes() -> list[str]:
    """The operators a dispatch mode (a tracer of live tensors is one) sees while a chunk-sized
    reduce-scatter starts and finishes: the receive buffer is workspace, made unseen."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Seen(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    ws = dist.get_world_size()
    full, out = torch.ones(8 * ws), torch.empty(8)
    workspace = GatheredCache(True)  # twice: a new receive buffer, then the kept one
    with Seen() as seen:
        launch_reduce_scatter(out, full, None).wait()
        for _ in range(2):
            launch_reduce_scatter(out, full, None, workspace=workspace).wait()
    assert torch.equal(out, torch.full_like(out, float(ws)))
    assert _kept_bytes(workspace, full.nbytes) == full.nbytes  # kept
    return seen.ops
