"""The simulator against brute force, and policies in the simulator against the manager."""

import itertools
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from colossal_chunk import AutoPolicy, ChunkConfig, ChunkManager, OrderStats, StaticPolicy
from colossal_chunk.policies import LruPolicy, simulate, simulate_policy
from colossal_contracts import CapacityError, ConfigError


def _brute_force_min(steps, size, cap):
    """Fewest loads over all eviction choices (equal sizes), by exhaustive search."""
    best = [None]

    def go(t, resident, loads):
        if best[0] is not None and loads >= best[0]:
            return
        if t == len(steps):
            best[0] = loads
            return
        step = set(steps[t])
        missing = step - resident
        room = cap // size - len(resident)
        over = len(missing) - room
        others = sorted(resident - step)
        if over <= 0:
            go(t + 1, resident | missing, loads + len(missing))
            return
        for out in itertools.combinations(others, over):
            go(t + 1, (resident - set(out)) | missing, loads + len(missing))

    go(0, frozenset(), 0)
    return best[0]


@settings(max_examples=60, deadline=None)
@given(
    st.integers(2, 5).flatmap(
        lambda k: st.tuples(
            st.just(k),
            st.lists(
                st.lists(st.integers(0, k - 1), min_size=1, max_size=2), min_size=1, max_size=9
            ),
            st.integers(2, k),
        )
    )
)
def test_belady_matches_brute_force_on_equal_sizes(case):
    k, steps, slots = case
    res = simulate(steps, [10] * k, slots * 10)
    assert res.loads == _brute_force_min([tuple(s) for s in steps], 10, slots * 10)
    assert res.peak_bytes <= slots * 10


def test_a_step_larger_than_the_capacity_raises():
    with pytest.raises(CapacityError, match="20 bytes"):
        simulate([(0, 1)], [10, 10], 15)


@settings(max_examples=40, deadline=None)
@given(
    st.integers(2, 7).flatmap(
        lambda k: st.tuples(
            st.just(k),
            st.lists(
                st.lists(st.integers(0, k - 1), min_size=1, max_size=2), min_size=2, max_size=12
            ),
            st.integers(2, k),
        )
    )
)
def test_traced_auto_policy_is_belady_and_prefetch_moves_no_more(case):
    k, steps, slots = case
    sizes, cap, n_iter = [10] * k, slots * 10, 8
    opt = simulate(steps, sizes, cap, iterations=n_iter)
    auto = AutoPolicy()
    auto.set_schedule(steps)
    plain = simulate_policy(auto, steps, sizes, cap, iterations=n_iter)
    fetched = simulate_policy(auto, steps, sizes, cap, iterations=n_iter, prefetch=1)
    steady = slice(1, n_iter - 1)  # prefetch shifts loads across iteration boundaries
    assert sum(plain.per_iteration[steady]) == sum(opt.per_iteration[steady])
    assert sum(fetched.per_iteration[steady]) <= sum(opt.per_iteration[steady]) + 2 * max(sizes)
    assert max(plain.peak_bytes, fetched.peak_bytes) <= cap


def test_static_moves_its_offloaded_share_every_use():
    steps = [0, 1, 2, 3, 3, 2, 1, 0]
    res = simulate_policy(StaticPolicy(0.5, 0.5), steps, [10] * 4, 40, iterations=2)
    # chunks 2 and 3 are offloaded: 2 uses each per iteration, in and out every time (80 bytes);
    # the first iteration also loads the resident chunks 0 and 1 once, cold
    assert res.per_iteration == (100, 80)
    assert simulate(steps, [10] * 4, 40, iterations=2).per_iteration == (40, 0)


def _manager_replay(policy, steps, n_chunks, numel, cap, n_iter, prefetch):
    params = [
        (f"p{i}", torch.nn.Parameter(torch.full((numel,), float(i)), requires_grad=False))
        for i in range(n_chunks)
    ]
    cfg = ChunkConfig(numel, accelerator_bytes=cap, device="cpu", disk_bytes=0)
    with ChunkManager(cfg, policy=policy) as mgr:
        mgr.register(params)
        assert len(mgr.chunks) == n_chunks
        per_iter = []
        for _ in range(n_iter):
            mgr.books.reset_stats()
            for m, step in enumerate(steps):
                mgr.set_moment(m)
                ps = [params[i][1] for i in step]
                mgr.access(ps)
                for i in step:
                    assert torch.all(params[i][1].data == i)
                mgr.release(ps)
                if prefetch:
                    mgr.residency.prefetch(prefetch)
            per_iter.append(mgr.books.stats().bytes_moved)
            assert mgr.books.stats().tiers["accelerator"].peak_bytes <= cap
    return per_iter


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("kind", ["auto", "auto+prefetch", "static", "lru"])
def test_the_manager_moves_exactly_what_the_simulator_predicts(seed, kind):
    rng = random.Random(seed)
    k = rng.randint(3, 6)
    steps = [tuple(rng.sample(range(k), rng.randint(1, 2))) for _ in range(rng.randint(4, 10))]
    numel, slots = 16, rng.randint(2, k)
    cap = slots * numel * 4

    def policy():
        if kind.startswith("auto"):
            return AutoPolicy(OrderStats([tuple(f"p{i}" for i in s) for s in steps]))
        return StaticPolicy(0.5) if kind == "static" else LruPolicy()

    prefetch = 1 if kind == "auto+prefetch" else 0
    measured = _manager_replay(policy(), steps, k, numel, cap, 3, prefetch)
    p = policy()
    if kind.startswith("auto"):
        p.set_schedule(steps)
    sim = simulate_policy(p, steps, [numel * 4] * k, cap, iterations=3, prefetch=prefetch)
    assert measured == list(sim.per_iteration)


def test_per_step_capacity_evicts_where_room_shrinks():
    steps = [0, 1, 2, 0, 1, 2]
    flat = simulate(steps, [10] * 3, 30)
    assert simulate(steps, [10] * 3, [30] * 6) == flat
    assert flat.bytes_moved == 30  # everything fits: three cold loads
    squeezed = simulate(steps, [10] * 3, [30, 30, 30, 10, 30, 30])
    assert squeezed.evictions == 2 and squeezed.loads == 5  # step 3 leaves room for one chunk
    with pytest.raises(ConfigError, match="one each"):
        simulate(steps, [10] * 3, [30, 30])


def test_evicting_an_unwritten_chunk_moves_no_bytes():
    steps = [0, 1, 2, 0, 1, 2]  # room for one chunk: every step evicts the previous one
    every = simulate(steps, [10] * 3, 10)
    assert simulate(steps, [10] * 3, 10, written=steps) == every  # all written: the default
    read_only = simulate(steps, [10] * 3, 10, written=[()] * 6)
    assert read_only.evictions == every.evictions == 5 and read_only.loads == every.loads
    assert read_only.bytes_out == 0 and read_only.bytes_in == every.bytes_in == 60
    only_1 = simulate(steps, [10] * 3, 10, written=[(), 1, (), (), (), ()])
    assert only_1.bytes_out == 10  # chunk 1, written at step 1, is copied out once (step 2)
    pol = AutoPolicy()
    pol.set_schedule([(c,) for c in steps])
    got = simulate_policy(pol, steps, [10] * 3, 10, written=[(), 1, (), (), (), ()])
    assert got.bytes_out == 10 and got.bytes_in == 60
    with pytest.raises(ConfigError, match="does not use"):
        simulate(steps, [10] * 3, 10, written=[1, (), (), (), (), ()])
    with pytest.raises(ConfigError, match="one each"):
        simulate(steps, [10] * 3, 10, written=[()])
