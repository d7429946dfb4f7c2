"""Run on every rank by test_gathers_ahead.py: ``gather_ahead`` under a budget
([Note: gathers ahead])."""

import torch
import torch.distributed as dist

from colossal_chunk import AutoPolicy, ChunkConfig, ChunkManager
from colossal_contracts import TensorState, TierName

ACC, HOST = TierName.ACCELERATOR, TierName.HOST
N = 64  # elements per parameter and per chunk


def gathers_ahead_evict_only_later_chunks() -> dict[str, object]:
    """Three one-parameter chunks on 2 ranks, a budget of two gathered buffers and a shard, the compute
    order c0, c1, c0, c2. What ``gather_ahead`` did at moments 0 and 1, the bytes it moved, and
    the values seen."""
    world = dist.get_world_size()
    shard, full = 4 * N // world, 4 * N  # fp32 bytes
    budget = 2 * full + shard  # two gathered buffers and one shard
    policy = AutoPolicy()
    config = ChunkConfig(chunk_numel=N, accelerator_bytes=budget, disk_bytes=0, device="cpu")
    m = ChunkManager(config, policy=policy, group=dist.group.WORLD)
    values = [torch.arange(N, dtype=torch.float32) + 1000 * i for i in range(3)]
    params = [torch.nn.Parameter(v.clone()) for v in values]
    c0, c1, c2 = m.register([(f"p{i}", p) for i, p in enumerate(params)])
    policy.set_schedule([[c0.chunk_id], [c1.chunk_id], [c0.chunk_id], [c2.chunk_id]])
    m.move(c2, ACC)  # c2's shard takes room, but c2 is used last
    out: dict[str, object] = {}
    m.set_moment(0)
    m.access(["p0"])
    out["issued at 0"] = m.gather_ahead([c1])
    out["c1 at 0"] = (c1.tier.value, c1.in_flight)
    out["c2 at 0"] = c2.tier.value  # evicted: used after c1
    out["within budget at 0"] = m.books.tiers[ACC].used_bytes <= budget
    m.release(["p0"])  # c0's shard stays on the compute tier: nothing is copied off it
    out["host -> acc after 0"] = _moved(m, "host", "accelerator")
    out["acc -> host after 0"] = _moved(m, "accelerator", "host")
    m.set_moment(1)
    m.access(["p1"])
    out["p1 equal"] = torch.equal(params[1].data, values[1])
    out["issued at 1"] = m.gather_ahead([c2])
    out["c0 at 1"] = c0.tier.value
    out["c2 at 1"] = (c2.tier.value, c2.is_gathered)
    m.release(["p1"])  # c1's slice is copied back into its host shard
    out["acc -> host after 1"] = _moved(m, "accelerator", "host")
    m.set_moment(2)
    m.access(["p0"])
    out["p0 equal"] = torch.equal(params[0].data, values[0])
    m.release(["p0"])
    m.close()
    return out


def _moved(m: ChunkManager, src: str, dst: str) -> int:
    row = m.books.stats().moves.get((src, dst))
    return 0 if row is None else row.num_bytes


def reduce_in_flight_makes_room() -> dict[str, object]:
    """Two one-parameter chunks on 2 ranks and room for one gathered buffer and one shard: c0 is
    reduce-scattered without waiting, then c1 is accessed. The reduce-scatter in flight holds
    c0's buffer; evicting c0 finishes it and frees both. What the access found, and the values."""
    world, rank = dist.get_world_size(), dist.get_rank()
    shard, full = 4 * N // world, 4 * N  # fp32 bytes
    config = ChunkConfig(chunk_numel=N, accelerator_bytes=full + shard, disk_bytes=0, device="cpu")
    m = ChunkManager(config, policy=AutoPolicy(), group=dist.group.WORLD)
    params = [torch.nn.Parameter(torch.arange(N, dtype=torch.float32) + 1000 * i) for i in range(2)]
    c0, _ = m.register([(f"p{i}", p) for i, p in enumerate(params)])
    m.access(["p0"])
    params[0].data.fill_(rank + 1.0)  # this rank's "gradient", written into the buffer
    m.release(["p0"], state=TensorState.READY_FOR_REDUCE, reshard=False)
    m.reduce(c0, async_op=True)
    out: dict[str, object] = {"in flight": c0.in_flight}
    m.access(["p1"])
    out["c0 in flight after"] = c0.in_flight
    out["within budget"] = m.books.tiers[ACC].used_bytes <= full + shard
    out["p1 equal"] = torch.equal(params[1].data, torch.arange(N, dtype=torch.float32) + 1000)
    m.release(["p1"])
    out["c0 shard"] = c0.shard.clone()  # type: ignore[union-attr]
    out["mean"] = sum(r + 1.0 for r in range(world)) / world
    m.close()
    return out


def coalesced_gathers(coalesce: bool) -> dict[str, object]:
    """Three one-parameter chunks on 2 ranks, room for all: one ``gather_ahead`` of the three,
    with torch's coalescing manager used or not ([Note: coalesced gathers]). The collectives it
    started (torch profiler's ``c10d::`` operators), and the values each access then sees."""
    from colossal_chunk import _collectives

    saved, _collectives.COALESCING = _collectives.COALESCING, coalesce
    try:
        policy = AutoPolicy()
        config = ChunkConfig(chunk_numel=N, disk_bytes=0, device="cpu")
        m = ChunkManager(config, policy=policy, group=dist.group.WORLD)
        values = [torch.arange(N, dtype=torch.float32) * (i + 1) for i in range(4)]
        params = [torch.nn.Parameter(v.clone()) for v in values]
        chunks = m.register([(f"p{i}", p) for i, p in enumerate(params)])
        policy.set_schedule([[c.chunk_id] for c in chunks])
        m.set_moment(0)
        m.access(["p0"])
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            issued = m.gather_ahead(chunks[1:])
        ops = {e.key: e.count for e in prof.key_averages() if e.key.startswith("c10d::")}
        out: dict[str, object] = {"issued": issued, "ops": ops}
        out["in flight"] = [c.in_flight for c in chunks[1:]]
        m.release(["p0"])
        equal = []
        for i in (3, 1, 2):  # any chunk's wait finishes the collective for the others
            m.set_moment(i)
            m.access([f"p{i}"])
            equal.append(torch.equal(params[i].data, values[i]))
            m.release([f"p{i}"])
        out["equal"] = equal
        m.close()
        return out
    finally:
        _collectives.COALESCING = saved
