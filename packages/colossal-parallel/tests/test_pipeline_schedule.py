"""Pipeline schedules and stage partitioning as pure data (no processes): every micro-batch
runs forward then backward through every virtual stage, no order deadlocks, the simulated idle
fraction equals the bubble formula, and 1F1B bounds the micro-batches alive per rank."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from colossal_contracts import ConfigError
from colossal_parallel.pipeline import (
    PipelineSchedule,
    ideal_idle_fraction,
    idle_fractions,
    partition_layers,
    simulate,
    stage_rank,
)

KINDS = [("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("interleaved", 3)]


def _max_alive(actions) -> int:
    alive = peak = 0
    for a in actions:
        alive += 1 if a.kind == "F" else -1
        peak = max(peak, alive)
    return peak


@pytest.mark.parametrize(("kind", "v"), KINDS)
@pytest.mark.parametrize("p", [1, 2, 4])
@pytest.mark.parametrize("m", [4, 8, 16])
def test_schedules_cover_every_microbatch_and_match_the_bubble_formula(kind, v, p, m):
    s = PipelineSchedule(kind, m, v)
    for r in range(p):
        acts = s.actions(p, r)
        assert sorted(acts) == sorted([(k, i, c) for k in "FB" for i in range(m) for c in range(v)])
        for i in range(m):  # within a rank: forward of a chunk before its backward
            for c in range(v):
                assert acts.index(("F", i, c)) < acts.index(("B", i, c))
        if kind == "gpipe":
            assert _max_alive(acts) == m  # every micro-batch alive at the turn
        elif kind == "1f1b":
            assert _max_alive(acts) == min(p - r, m)  # bounded by the pipeline depth
    timeline = simulate(s, p, t_forward=1.0, t_backward=2.0)
    want = ideal_idle_fraction(kind, p, m, v)
    for got in idle_fractions(timeline):
        assert got == pytest.approx(want, abs=1e-12)


def test_interleaving_shrinks_the_bubble_v_times():
    p, m = 4, 8
    plain = ideal_idle_fraction("1f1b", p, m)
    inter = ideal_idle_fraction("interleaved", p, m, 2)
    assert plain == pytest.approx(3 / 11)
    assert inter == pytest.approx(1.5 / 9.5)


def test_stage_order_is_round_robin_over_ranks():
    assert [stage_rank(s, 4) for s in range(8)] == [(s % 4, s // 4) for s in range(8)]


@given(n=st.integers(1, 30), k=st.integers(1, 30))
def test_partition_by_count_is_contiguous_and_even(n, k):
    if k > n:
        with pytest.raises(ConfigError, match="at least one layer"):
            partition_layers(n, k)
        return
    runs = partition_layers(n, k)
    assert [i for r in runs for i in r] == list(range(n))
    assert max(map(len, runs)) - min(map(len, runs)) <= 1


@given(costs=st.lists(st.integers(0, 20), min_size=1, max_size=9), k=st.integers(1, 4))
def test_partition_by_cost_minimises_the_largest_stage(costs, k):
    n = len(costs)
    if k > n:
        return
    runs = partition_layers(n, k, costs)
    assert [i for r in runs for i in r] == list(range(n)) and all(len(r) for r in runs)
    got = max(sum(costs[i] for i in r) for r in runs)

    def best(i: int, stages: int) -> float:  # brute force over every split
        if stages == 1:
            return sum(costs[i:])
        return min(max(sum(costs[i:j]), best(j, stages - 1)) for j in range(i + 1, n - stages + 2))

    assert got == best(0, k)


def test_partition_balances_a_heavy_layer():
    assert partition_layers(5, 2, [1, 1, 1, 1, 10]) == [range(0, 4), range(4, 5)]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"kind": "zb"}, "must be one of"),
        ({"kind": "interleaved", "num_virtual": 1}, "num_virtual >= 2"),
        ({"kind": "1f1b", "num_virtual": 2}, "kind='interleaved'"),
        ({"num_microbatches": 0}, "positive int"),
    ],
)
def test_bad_schedules_raise(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        PipelineSchedule(**kwargs)


def test_schedule_validation_names_the_fix():
    with pytest.raises(ConfigError, match="multiple of the pipeline size"):
        PipelineSchedule("interleaved", 6, 2).validate(4)
    with pytest.raises(ConfigError, match="do not divide the batch"):
        PipelineSchedule("1f1b", 3).validate(2, batch_size=8)
    with pytest.raises(ConfigError, match="partition costs"):
        partition_layers(3, 2, [1.0, 2.0])
