"""``Chunk.start_reduce_scatter``: the async reduce-scatter ZeRO-2 overlaps with backward."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import _checks_chunk_async as checks


def test_one_rank_accumulates_in_place():
    assert checks.two_micro_batches_accumulate_into_the_shard()


@pytest.mark.parametrize("n", [2, 4])
def test_async_reduce_scatter_accumulates_averaged_micro_batches(world, n):
    assert world(n).run(checks.two_micro_batches_accumulate_into_the_shard) == [True] * n
