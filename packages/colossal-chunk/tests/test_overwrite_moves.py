"""``Chunk.awaits_overwrite``: a move of a shard a reduce-scatter will overwrite copies nothing."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import _checks_overwrite as checks


def test_evicting_a_reduce_target_copies_nothing_and_the_result_lands(world):
    w = world(2)
    for r in w.run(checks.evicting_a_reduce_target_copies_nothing):
        # in uncopied, out uncopied while the reduce was in flight, in again copied
        assert r == {
            "copies": [False, False, True],
            "awaited": True,
            "after": False,
            "landed": True,
            "kept": True,
        }
    assert w.run(checks.accumulating_reduce_keeps_the_copy) == [[True, True, True]] * 2
