import sys
from pathlib import Path

import pytest

import colossal_testing

sys.path.insert(0, str(Path(__file__).parent))
import _checks_world as checks


def test_public_names():
    for name in colossal_testing.__all__:
        assert getattr(colossal_testing, name) is not None


def test_all_reduce_and_reuse(world):
    w = world(2)
    assert w.run(checks.rank_sum) == [3, 3]
    assert w.run(checks.rank_sum) == [3, 3]  # same processes, second task


def test_failure_is_reported_and_world_recovers(world):
    w = world(2)
    with pytest.raises(colossal_testing.RankError, match="boom on one"):
        w.run(checks.fail_on_rank_one)
    assert w.run(checks.rank_sum) == [3, 3]
