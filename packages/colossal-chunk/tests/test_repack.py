"""Re-packing chunks in first-use order keeps every value of every kind; state counts are exact."""

import torch
from torch import nn

from colossal_chunk import ChunkConfig, ChunkManager
from colossal_contracts import TensorState


def _params() -> list[tuple[str, nn.Parameter]]:
    g = torch.Generator().manual_seed(0)
    return [(n, nn.Parameter(torch.randn(40, generator=g))) for n in ("a", "b", "c", "d")]


def test_repack_in_first_use_order_keeps_values_of_every_kind():
    named = _params()
    want = {n: p.detach().clone() for n, p in named}
    with ChunkManager(ChunkConfig(chunk_numel=80, accelerator_bytes=1000)) as m:
        m.register(named)
        m.add_parallel("master", torch.float64, copy_params=True)
        assert [list(c.records) for c in m.registry.param_chunks()] == [["a", "b"], ["c", "d"]]
        m.access(["b"])  # states and residency must not matter
        m.release(["b"])
        m.repack(["d", "a", "c"])  # "b" was never used: it follows in registration order
        assert m.registry.registration_order() == ["d", "a", "c", "b"]
        assert [list(c.records) for c in m.registry.param_chunks()] == [["d", "a"], ["c", "b"]]
        for n, p in named:
            m.access([n])
            assert torch.equal(p.data, want[n])
            m.release([n])
            twin = m.registry.parallel_chunk("master", m.chunk_of(n))
            assert torch.equal(twin.shard_view(n)[0], want[n].double())
        assert sum(t.used_bytes for t in m.books.tiers.values()) == sum(
            c.shard_bytes for c in m.chunks.values()
        )


def test_state_counts_match_the_records():
    with ChunkManager(ChunkConfig(chunk_numel=200)) as m:
        (c,) = m.register(_params())
        m.access(["a", "c"])
        assert c.count(TensorState.COMPUTE) == 2 and c.pinned and not c.movable
        m.release(["a"], state=TensorState.READY_FOR_REDUCE)
        for s in TensorState:
            assert c.count(s) == sum(r.state is s for r in c.records.values())
        m.release(["c"])
        assert not c.pinned and not c.movable and c.count(TensorState.HOLD) == 3
