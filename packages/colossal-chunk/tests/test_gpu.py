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
