"""Gathered buffers' mappings and receive buffers kept for the next gather or reduce-scatter
when the compute tier has no budget ([Note: gathered buffer cache] in ``_gathered_cache.py``):
reused only when nothing else views them, reserved memory (neither live tensors nor model data)
while kept, and never kept under a budget."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import _checks_gathered_cache as checks

N = checks.N


@pytest.mark.parametrize("budgeted", [False, True])
def test_a_gather_takes_the_buffer_the_last_release_freed_only_without_a_budget(world, budgeted):
    budget = 2 * 4 * N if budgeted else None  # room for both gathered buffers
    for out in world(2).run(checks.gathers_reuse_a_released_buffer, budget):
        assert out["p0 equal"] and out["p1 equal"]
        assert out["kept bytes"] == (0 if budgeted else out["full"])
        assert out["reused"] is not budgeted
        # kept: reserved memory, as a caching allocator's, neither model data nor a tensor
        assert out["model bytes over used"] == 0 and not out["kept among model tensors"]
        assert out["kept after close"] == 0


def test_a_buffer_something_still_views_is_not_reused(world):
    for out in world(2).run(checks.a_buffer_still_viewed_is_not_reused):
        assert out["kept bytes"] == 0 and not out["reused"]
        assert out["p1 equal"] and out["held equal"]
        assert out["kept once unviewed"] == 2 * 4 * N  # both buffers
        assert out["p0 equal"]


def test_a_reduce_scatter_takes_the_receive_buffer_the_last_one_freed(world):
    for out in world(2).run(checks.reduce_scatters_reuse_their_receive_buffer):
        first, second = out["receive buffers"]
        assert len(first) == 1 and first == second  # the second took the first's memory
        assert out["kept"] == [4 * N, 4 * N]
        for got, want in zip(out["means"], out["expected"], strict=True):
            assert got == [want] * len(got)
