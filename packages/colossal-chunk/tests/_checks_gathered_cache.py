"""Run on every rank by test_gathered_cache.py ([Note: gathered buffer cache] in ``_spare.py``)."""

import time

import torch
import torch.distributed as dist

from colossal_chunk import AutoPolicy, ChunkConfig, ChunkManager
from colossal_chunk._gathered_cache import GatheredCache
from colossal_contracts import TensorState, TierName

ACC = TierName.ACCELERATOR
N = 64  # elements per parameter and per chunk


def _manager(
    budget: int | None,
) -> tuple[ChunkManager, list[torch.Tensor], list[torch.nn.Parameter]]:
    """Two one-parameter chunks on the world's ranks, on the CPU (an emulated accelerator)."""
    config = ChunkConfig(chunk_numel=N, accelerator_bytes=budget, disk_bytes=0, device="cpu")
    m = ChunkManager(config, policy=AutoPolicy(), group=dist.group.WORLD)
    values = [torch.arange(N, dtype=torch.float32) + 1000 * i for i in range(2)]
    params = [torch.nn.Parameter(v.clone()) for v in values]
    m.register([(f"p{i}", p) for i, p in enumerate(params)])
    return m, values, params


def _kept_bytes(cache: GatheredCache, expected: int) -> int:
    """The bytes ``cache`` keeps, once ``expected`` (or after 5 s): gloo's worker thread lets go
    of a finished collective's buffer a moment after ``wait()`` returns, and the cache counts a
    buffer only once nothing else holds it."""
    deadline = time.monotonic() + 5.0
    while cache.nbytes != expected and time.monotonic() < deadline:
        time.sleep(0.001)
    return cache.nbytes


def gathers_reuse_a_released_buffer(budget: int | None) -> dict[str, object]:
    """Gather p0, release it, gather p1: whether p1's buffer is p0's, what the books count as
    model data meanwhile, and the values seen."""
    m, values, params = _manager(budget)
    full = 4 * N  # fp32 bytes of a gathered buffer
    out: dict[str, object] = {}
    m.access(["p0"])
    first = params[0].data.untyped_storage().data_ptr()
    out["p0 equal"] = torch.equal(params[0].data, values[0])
    m.release(["p0"])
    out["kept bytes"] = _kept_bytes(m._placement.gathered, 0 if budget else full)
    out["model bytes over used"] = m.books.model_data_bytes(ACC) - m.books.tiers[ACC].used_bytes
    out["kept among model tensors"] = any(
        t.untyped_storage().data_ptr() == first for t in m.books.model_tensors()
    )
    m.access(["p1"])
    out["reused"] = params[1].data.untyped_storage().data_ptr() == first
    out["p1 equal"] = torch.equal(params[1].data, values[1])
    m.release(["p1"])
    out["full"] = full
    m.close()
    out["kept after close"] = m._placement.gathered.nbytes
    return out


def a_buffer_still_viewed_is_not_reused() -> dict[str, object]:
    """Release p0 while something (a tensor autograd saved, say) still views its gathered
    buffer, then gather p1: the view keeps p0's values and p1 gets a buffer of its own."""
    m, values, params = _manager(None)
    m.access(["p0"])
    held = params[0].data[: N // 2]
    first = held.untyped_storage().data_ptr()
    m.release(["p0"])
    out: dict[str, object] = {"kept bytes": _kept_bytes(m._placement.gathered, 0)}
    m.access(["p1"])
    out["reused"] = params[1].data.untyped_storage().data_ptr() == first
    out["p1 equal"] = torch.equal(params[1].data, values[1])
    out["held equal"] = torch.equal(held, values[0][: N // 2])
    m.release(["p1"])
    del held  # p0's buffer is viewed no more: the cache takes it, beside p1's
    out["kept once unviewed"] = _kept_bytes(m._placement.gathered, 2 * 4 * N)
    m.access(["p0"])
    out["p0 equal"] = torch.equal(params[0].data, values[0])
    m.release(["p0"])
    m.close()
    return out


def reduce_scatters_reuse_their_receive_buffer() -> dict[str, object]:
    """Reduce p0's chunk twice (each rank writes rank + 1 + i into it): the receive buffer of
    the first is the second's, and both results are the mean over ranks."""
    m, _, params = _manager(None)
    rank, world = dist.get_rank(), dist.get_world_size()
    c0 = m.chunk_of("p0")
    out: dict[str, object] = {"means": [], "expected": [], "receive buffers": [], "kept": []}
    workspace = m._placement.workspace
    allocate = workspace.allocate

    def recorded(numel: int, dtype: torch.dtype) -> torch.Tensor | None:
        buf = allocate(numel, dtype)
        if buf is not None:
            out["receive buffers"][-1].append(buf.data_ptr())  # type: ignore[index]
        return buf

    workspace.allocate = recorded  # type: ignore[method-assign]
    for i in range(2):
        m.access(["p0"])
        params[0].data.fill_(rank + 1.0 + i)
        m.release(["p0"], state=TensorState.READY_FOR_REDUCE, reshard=False)
        out["receive buffers"].append([])  # type: ignore[attr-defined]
        m.reduce(c0)
        out["kept"].append(_kept_bytes(workspace, 4 * N))  # type: ignore[attr-defined]
        out["means"].append(c0.shard.tolist())  # type: ignore[union-attr]
        out["expected"].append(sum(r + 1.0 + i for r in range(world)) / world)
    m.close()
    return out
