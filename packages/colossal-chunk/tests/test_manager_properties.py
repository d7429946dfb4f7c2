"""Property tests of ChunkManager: budgets hold, tensors are on the compute tier in COMPUTE while
used, data survives host and disk bit-exactly, illegal transitions raise."""

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from colossal_chunk import AutoPolicy, ChunkConfig, ChunkManager, StaticPolicy
from colossal_chunk.policies import LruPolicy
from colossal_contracts import (
    LEGAL_TRANSITIONS,
    CapacityError,
    StateTransitionError,
    TensorState,
    TierName,
)

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int32]
shapes = st.lists(st.integers(1, 6), min_size=1, max_size=3).map(tuple)


@st.composite
def scenarios(draw):
    n = draw(st.integers(1, 10))
    params = [(draw(shapes), draw(st.sampled_from(DTYPES[:2]))) for _ in range(n)]
    biggest = max(torch.Size(s).numel() for s, _ in params)
    chunk_numel = draw(st.integers(biggest, 4 * biggest + 8))
    chunk_bytes = chunk_numel * 4
    acc = draw(st.integers(chunk_bytes // 2, chunk_bytes * (n + 1)))
    host = draw(st.integers(0, chunk_bytes * (n + 1)))
    accesses = draw(
        st.lists(st.lists(st.integers(0, n - 1), min_size=1, max_size=3), min_size=1, max_size=12)
    )
    policy = draw(st.sampled_from(["lru", "static", "auto-warmup", "auto-traced"]))
    frac = draw(st.floats(0, 1))
    seed = draw(st.integers(0, 2**16))
    return params, chunk_numel, acc, host, accesses, policy, frac, seed


def _make_params(specs, seed):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i, (shape, dtype) in enumerate(specs):
        t = torch.randn(shape, generator=g).to(dtype)
        out.append((f"p{i}", torch.nn.Parameter(t, requires_grad=False)))
    return out


def _policy(kind, frac, accesses, mgr_names):
    if kind == "lru":
        return LruPolicy()
    if kind == "static":
        return StaticPolicy(frac, frac)
    if kind == "auto-warmup":
        return AutoPolicy()
    return AutoPolicy(_Trace([tuple(mgr_names[i] for i in a) for a in accesses]))


class _Trace:
    """A tiny MemStatsSource: a fixed compute order and no non-model data."""

    def __init__(self, order, peaks=None):
        self.order = order
        self.peaks = peaks or [0] * len(order)

    def num_moments(self):
        return len(self.order)

    def non_model_peak(self, moment, tier):
        return self.peaks[moment]

    def compute_order(self):
        return self.order


def _check_tiers(mgr):
    for t in mgr.books.tiers.values():
        assert t.used_bytes <= t.capacity_bytes
        assert t.peak_bytes <= t.capacity_bytes


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_budgets_states_and_round_trips(tmp_path_factory, scenario):
    specs, chunk_numel, acc, host, accesses, kind, frac, seed = scenario
    params = _make_params(specs, seed)
    names = [n for n, _ in params]
    ref = {n: p.detach().clone() for n, p in params}
    policy = _policy(kind, frac, accesses, names)
    cfg = ChunkConfig(
        chunk_numel,
        accelerator_bytes=acc,
        host_bytes=host,
        device="cpu",
        disk_dir=tmp_path_factory.mktemp("disk"),
    )
    with ChunkManager(cfg, policy=policy) as mgr:
        mgr.register(params)
        for name, p in params:  # registration keeps values and puts .data into the chunk
            assert torch.equal(p.data, ref[name])
        limit = int(acc * 0.8) if kind == "auto-warmup" else acc
        g = torch.Generator().manual_seed(seed + 1)
        for moment, idx in enumerate(accesses):
            mgr.set_moment(moment)
            chosen = [params[i] for i in dict.fromkeys(idx)]
            chunks = {mgr.chunk_of(p).chunk_id: mgr.chunk_of(p) for _, p in chosen}
            working = sum(c.shard_bytes for c in chunks.values())
            if working > limit:
                with pytest.raises(CapacityError, match="accelerator_bytes"):
                    mgr.access([p for _, p in chosen])
                assert not any(c.pinned for c in mgr.chunks.values())
                _check_tiers(mgr)
                event("working set over budget")
                continue
            mgr.access([p for _, p in chosen])
            _check_tiers(mgr)
            for name, p in chosen:
                c = mgr.chunk_of(p)
                assert c.tier is TierName.ACCELERATOR
                assert c.state(name) is TensorState.COMPUTE
                assert p.data.device == mgr.books.tiers[TierName.ACCELERATOR].device
                assert p.data.data_ptr() == c.view(name).data_ptr()
                assert torch.equal(p.data, ref[name])
                new = torch.randn(p.shape, generator=g).to(p.dtype)
                p.data.copy_(new)  # "compute" writes the tensor in place
                ref[name] = new
            mgr.release([p for _, p in chosen])
            _check_tiers(mgr)
        for c in list(mgr.chunks.values()):  # every chunk through disk and host, then back
            mgr.move(c, TierName.DISK)
        _check_tiers(mgr)
        for name, p in params:
            assert torch.equal(p.data, ref[name]), name
        for c in list(mgr.chunks.values()):
            if mgr.books.tiers[TierName.HOST].free_bytes >= c.shard_bytes:
                mgr.move(c, TierName.HOST)
        for name, p in params:
            assert torch.equal(p.data, ref[name]), name
        stats = mgr.books.stats()
        event(f"moves to disk: {stats.moved('accelerator', 'disk').count > 0}")
        event(f"evictions: {stats.moved('accelerator', 'host').count > 0}")
        assert stats.bytes_moved == sum(m.num_bytes for m in stats.moves.values())
        disk_dir = mgr.books.tiers[TierName.DISK].store.directory
    assert not list(disk_dir.iterdir())  # close() removed every payload file


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(list(TensorState)), st.sampled_from(list(TensorState)))
def test_illegal_transitions_raise_through_the_manager(old, new):
    p = torch.nn.Parameter(torch.ones(4))
    with ChunkManager(ChunkConfig(8, device="cpu", disk_bytes=0)) as mgr:
        mgr.register([("w", p)])
        chunk = mgr.chunk_of(p)
        chunk.records["w"].state = old  # place the tensor in ``old`` directly
        if old is new or new in LEGAL_TRANSITIONS[old]:
            chunk.set_state("w", new)
            assert chunk.state("w") is new
        else:
            with pytest.raises(StateTransitionError, match=f"{old.name} -> {new.name}"):
                chunk.set_state("w", new)
            assert chunk.state("w") is old


def test_release_without_access_is_illegal():
    p = torch.nn.Parameter(torch.ones(4))
    with ChunkManager(ChunkConfig(8, device="cpu", disk_bytes=0)) as mgr:
        mgr.register([("w", p)])
        with pytest.raises(StateTransitionError, match="HOLD -> READY_FOR_REDUCE"):
            mgr.release([p], state=TensorState.READY_FOR_REDUCE)
        mgr.access([p])
        with pytest.raises(StateTransitionError, match="COMPUTE"):
            mgr.move(mgr.chunk_of(p), TierName.HOST)
