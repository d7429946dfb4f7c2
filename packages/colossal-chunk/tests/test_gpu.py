"""On a real CUDA device: pinned host payloads, real device copies, side-stream prefetch."""

import pytest
import torch

from colossal_chunk import AutoPolicy, ChunkConfig, ChunkManager, OrderStats
from colossal_contracts import TierName

pytestmark = pytest.mark.gpu


def test_cuda_tiers_moves_and_side_stream_prefetch():
    n, numel = 6, 1 << 16
    params = [
        (f"p{i}", torch.nn.Parameter(torch.full((numel,), float(i)), requires_grad=False))
        for i in range(n)
    ]
    order = [(f"p{i}",) for i in range(n)] + [(f"p{i}",) for i in reversed(range(n))]
    cap = 3 * numel * 4
    cfg = ChunkConfig(numel, accelerator_bytes=cap, device="cuda")
    with ChunkManager(cfg, policy=AutoPolicy(OrderStats(order))) as mgr:
        mgr.register(params)
        assert mgr.books.tiers[TierName.HOST].pin_memory
        assert mgr.chunk_of("p0").shard.is_pinned()
        for _ in range(3):
            for m, names in enumerate(order):
                mgr.set_moment(m)
                mgr.access(names)
                p = dict(params)[names[0]]
                assert p.data.is_cuda
                assert torch.all(p.data == float(names[0][1:])).item()
                p.data.mul_(1.0)  # compute on the default stream
                mgr.release(names)
                mgr.residency.prefetch(1)
        stats = mgr.books.stats()
        assert stats.tiers["accelerator"].peak_bytes <= cap
        assert not stats.tiers["accelerator"].emulated
        assert stats.moved("host", "accelerator").count > 0
        for c in mgr.registry.param_chunks():
            mgr.move(c, TierName.DISK)
        for i, (_, p) in enumerate(params):
            assert torch.all(p.data == float(i))


def test_a_streaming_repack_on_cuda_keeps_every_value(tmp_path):
    """[Note: streaming re-pack] with chunks on the device, pinned host payloads and disk."""
    numel = 1 << 14
    g = torch.Generator().manual_seed(0)
    named = [(f"p{i}", torch.nn.Parameter(torch.randn(numel // 2, generator=g))) for i in range(12)]
    want = {n: p.detach().clone() for n, p in named}
    shard = numel * 4
    cfg = ChunkConfig(
        numel,
        accelerator_bytes=2 * shard,
        host_bytes=3 * shard,
        read_ahead_bytes=0,
        disk_dir=tmp_path,
        device="cuda",
    )
    with ChunkManager(cfg) as mgr:
        mgr.register(named)
        mgr.add_parallel("master", torch.float64, copy_params=True)
        for c in mgr.registry.param_chunks()[:2]:
            mgr.move(c, TierName.ACCELERATOR)
        assert {c.tier for c in mgr.chunks.values()} >= {TierName.ACCELERATOR, TierName.DISK}
        order = [f"p{i ^ 1}" for i in range(12)]
        mgr.repack(order)
        assert mgr.registry.registration_order() == order
        for n, p in named:
            mgr.access([n])
            assert p.data.is_cuda and torch.equal(p.data.cpu(), want[n])
            mgr.release([n])
            master = mgr.registry.parallel_chunk("master", mgr.chunk_of(n)).shard_view(n)[0]
            assert torch.equal(master.cpu(), want[n].double())
