"""[Note: streaming re-pack]: a re-pack keeps every value of every kind with chunks on disk (new
chunks take the ids of old ones still there) and never holds a copy of the model."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from colossal_chunk import ChunkConfig, ChunkManager
from colossal_contracts import TierName

N = 1024  # elements per chunk
SHARD = N * 4
ACC, HOST, DISK = TierName.ACCELERATOR, TierName.HOST, TierName.DISK


def _params(count: int, numel: int) -> list[tuple[str, torch.nn.Parameter]]:
    g = torch.Generator().manual_seed(0)
    return [(f"p{i}", torch.nn.Parameter(torch.randn(numel, generator=g))) for i in range(count)]


def _order(count: int) -> list[str]:
    """Neighbours swapped: every new chunk takes tensors from two old ones."""
    idx = [i ^ 1 for i in range(count)]
    return [f"p{i}" for i in idx[1:] + idx[:1]]


def test_a_repack_with_chunks_on_disk_keeps_every_value(tmp_path):
    named = _params(12, N // 2)
    want = {n: p.detach().clone() for n, p in named}
    cfg = ChunkConfig(
        N,
        accelerator_bytes=2 * SHARD,
        host_bytes=3 * SHARD,  # the rest on disk
        read_ahead_bytes=0,
        disk_dir=tmp_path / "d",
        device="cpu",
    )
    (tmp_path / "d").mkdir()
    with ChunkManager(cfg) as m:
        m.register(named)
        m.add_parallel("master", torch.float64, copy_params=True)
        m.add_parallel("exp_avg", torch.float32)
        for c in m.chunks.values():  # something to keep in the zero-initialised kind
            if c.kind == "exp_avg":
                for name in c.records:
                    view, a, b = c.shard_view(name)
                    view.copy_(want[name].reshape(-1)[a:b] * 3)
        assert any(c.tier is DISK for c in m.chunks.values())
        m.repack(_order(12))
        assert m.registry.registration_order() == _order(12)
        assert sorted(m.chunks) == list(range(len(m.chunks)))  # ids as a fresh register gives
        for c in m.registry.param_chunks():
            group = m.groups[c.chunk_id]
            assert list(group.twins) == ["master", "exp_avg"]
        for n, _ in named:
            m.access([n])
            assert torch.equal(dict(named)[n].data, want[n])
            m.release([n])
            master = m.registry.parallel_chunk("master", m.chunk_of(n)).shard_view(n)[0]
            assert torch.equal(master, want[n].double())
            exp_avg = m.registry.parallel_chunk("exp_avg", m.chunk_of(n)).shard_view(n)[0]
            assert torch.equal(exp_avg, want[n] * 3)
        used = sum(t.used_bytes for t in m.books.tiers.values())
        assert used == sum(c.shard_bytes for c in m.chunks.values())


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or not Path("/proc/self/clear_refs").exists(),
    reason="reads the kernel's resident high-water mark",
)
def test_a_repack_holds_no_copy_of_the_model():
    numel = 1 << 20  # 4 MiB tensors, 8 MiB chunks: 64 MiB of parameters and 64 of masters
    with ChunkManager(ChunkConfig(2 * numel, accelerator_bytes=1 << 30, device="cpu")) as m:
        m.register(_params(16, numel))
        m.add_parallel("master", torch.float32, copy_params=True)
        Path("/proc/self/clear_refs").write_text("5")  # the high-water mark starts again here
        before = _vm("VmRSS")
        m.repack(_order(16))
        grew = _vm("VmHWM") - before
    # a copy of the model would be 128 MiB; new chunks come as old ones go
    assert grew < 48 * 2**20, f"the re-pack's resident peak grew by {grew / 2**20:.0f} MiB"


def _vm(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(field)
