import pytest
import torch

from colossal_chunk import AutoPolicy, ChunkConfig, ChunkManager, OrderStats, StaticPolicy
from colossal_chunk._order import module_order
from colossal_chunk.policies import ChunkSummary, PolicyContext, trace_order
from colossal_chunk.policies._base import SimpleChunkInfo
from colossal_contracts import CapacityError, ConfigError, MemStatsSource, PlacementPolicy, TierName


class FakeStats:
    """A hand-written MemStatsSource, as colossal-memtrace would give."""

    def __init__(self, order, peaks):
        self.order, self.peaks = order, peaks

    def num_moments(self):
        return len(self.order)

    def non_model_peak(self, moment, tier):
        return self.peaks[moment] if TierName(tier) is TierName.ACCELERATOR else 0

    def compute_order(self):
        return self.order


def test_policies_satisfy_the_contract():
    assert isinstance(FakeStats([], []), MemStatsSource)
    assert isinstance(OrderStats([]), MemStatsSource)
    for p in (AutoPolicy(), StaticPolicy()):
        assert isinstance(p, PlacementPolicy)


def test_auto_budget_is_capacity_minus_the_next_periods_non_model_peak():
    stats = FakeStats([("a",), ("b",), ("c",)], [100, 300, 50])
    pol = AutoPolicy(lookahead=1)
    assert pol.model_budget(1000, 0) == 800  # warmup: fixed share
    pol.update(stats)
    assert pol.model_budget(1000, 0) == 800  # not bound to chunks yet: still warmup
    pol.bind(PolicyContext((ChunkSummary(0, "param", 8),), {"a": 0, "b": 0, "c": 0}, 1000))
    assert pol.warm
    assert pol.model_budget(1000, 0) == 1000 - 300  # moments 0 and 1
    assert pol.model_budget(1000, 2) == 1000 - 100  # moment 2 and (wrapping) 0
    assert pol.model_budget(200, 1) == 0


def test_auto_evicts_the_chunk_used_furthest_in_the_future():
    pol = AutoPolicy()
    pol.set_schedule([(0,), (1,), (2,), (3,), (1,), (0,)])
    cands = [SimpleChunkInfo(c, 10) for c in (0, 2, 3)]
    assert pol.choose_evictions(cands, 10, moment=3) == [3]  # 3 next used at 3 + 6 = 9
    cands = cands[:2]
    # at moment 3 (chunk 3 in use): 0 is next used at 5, 2 at 2 + 6 = 8 (next step)
    assert pol.choose_evictions(cands, 10, moment=3) == [2]
    assert pol.choose_evictions(cands, 20, moment=3) == [2, 0]
    assert pol.upcoming(3, 2) == [1, 0]


def test_auto_in_the_manager_keeps_room_for_non_model_data():
    params = [(f"p{i}", torch.nn.Parameter(torch.ones(16))) for i in range(4)]
    order = [("p0",), ("p1",), ("p2",), ("p3",)]
    cap = 4 * 64
    # non-model data peaks at 2 chunks' worth in moment 2: only 2 chunks may stay resident then
    stats = FakeStats(order, [0, 0, 128, 0])
    with ChunkManager(
        ChunkConfig(16, accelerator_bytes=cap, device="cpu"), policy=AutoPolicy(stats, lookahead=0)
    ) as mgr:
        mgr.register(params)
        for m, (name,) in enumerate(order):
            mgr.set_moment(m)
            mgr.access([name])
            acc = mgr.books.stats().tiers["accelerator"].used_bytes
            assert acc <= cap - stats.peaks[m]
            mgr.release([name])
        assert mgr.books.stats().moved("accelerator", "host").count >= 1


def test_capacity_error_names_sizes_and_fixes():
    params = [(f"p{i}", torch.nn.Parameter(torch.ones(16))) for i in range(3)]
    with ChunkManager(ChunkConfig(16, accelerator_bytes=100, device="cpu")) as mgr:
        mgr.register(params)
        mgr.access(["p0"])  # 64 bytes pinned
        with pytest.raises(CapacityError) as err:
            mgr.access(["p1"])
        msg = str(err.value)
        assert "64 bytes" in msg and "100" in msg
        assert "accelerator_bytes" in msg and "chunk_numel" in msg


def test_static_fitting_offloads_just_enough():
    ctx = PolicyContext(
        tuple(ChunkSummary(i, "param" if i < 4 else "master", 10) for i in range(8)), {}, 60
    )
    pol = StaticPolicy.fitting(ctx, working_bytes=20)
    pol.bind(ctx)
    resident = 80 - 10 * len(pol.offloaded)
    assert resident <= 40 and resident >= 30
    with pytest.raises(ConfigError, match="offload_param_frac"):
        StaticPolicy(1.5)


def test_module_order_and_traced_order_agree_on_a_sequential_model():
    m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    traced = trace_order(m, lambda: m(torch.randn(3, 4)).sum())
    assert traced == module_order(m)
    assert traced[0] == ("0.weight", "0.bias") and len(traced) == 4


def test_manager_reports_model_data_per_tier():
    params = [(f"p{i}", torch.nn.Parameter(torch.ones(16))) for i in range(3)]
    with ChunkManager(ChunkConfig(16, accelerator_bytes=128, host_bytes=64, device="cpu")) as mgr:
        mgr.register(params)
        assert mgr.books.model_data_bytes("host") == 64
        assert mgr.books.model_data_bytes(TierName.DISK) == 128
        mgr.access(["p2"])
        assert mgr.books.model_data_bytes("accelerator") == 64
        assert sum(mgr.books.model_data_bytes(t) for t in TierName) == 3 * 64
