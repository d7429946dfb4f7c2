"""Run on every rank by test_gathers_ahead.py: ``gather_ahead`` under a budget
([Note: gathers ahead])."""

import torch
import torch.distributed as dist

from colossal_chunk import AutoPolicy, ChunkConfig, ChunkManager
from colossal_contracts import TierName

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
    out["within budget at 0"] = m.tiers[ACC].used_bytes <= budget
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
    row = m.stats().moves.get((src, dst))
    return 0 if row is None else row.num_bytes
