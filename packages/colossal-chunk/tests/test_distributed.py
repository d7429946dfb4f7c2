"""Sharded chunks on 2 and 4 gloo ranks: gather and reduce-scatter against unsharded references."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import _checks_chunk_dist as checks


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("chunk_numel", [41, 64])
def test_gathered_chunks_equal_unsharded_tensors(world, n, chunk_numel):
    counts = world(n).run(checks.gathered_chunks_equal_unsharded, 7, chunk_numel)
    assert len(set(counts)) == 1 and counts[0] >= 2


@pytest.mark.parametrize("n", [2, 4])
def test_reduce_scattered_grads_equal_all_reduced_slices(world, n):
    assert world(n).run(checks.reduce_scattered_grads_equal_all_reduced_slices, 3, 50) == [True] * n


@pytest.mark.parametrize("n", [2, 4])
def test_random_accesses_keep_values_and_budgets(world, n):
    evictions = world(n).run(checks.random_accesses_under_budget, 11, 40)
    assert min(evictions) > 0


def test_views_leave_a_released_buffer_before_its_bytes_leave_the_books(world):
    # before [Note: books follow storage] the views held a whole chunk the books had let go
    over = world(2).run(checks.views_leave_a_buffer_before_its_bytes_leave_the_books, 5, 64)
    assert max(over) <= 0, over
