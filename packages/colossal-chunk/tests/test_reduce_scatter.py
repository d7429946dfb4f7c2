"""A chunk's reduce-scatter on gloo runs as one all-to-all and a local sum ([Note: reduce-scatter
on gloo] in ``_reduce_scatter.py``): the same result as gloo's own collective."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
import _checks_reduce_scatter as checks


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_integer_sums_are_exact_and_equal_to_gloos_own(world, n, dtype):
    for out in world(n).run(checks.against_native, dtype, True):
        assert out["kind"] == "SummedAllToAll"  # gloo, host tensors: the all-to-all path
        assert out["exact"] and out["equal"]


@pytest.mark.parametrize("n", [2, 4])
def test_random_sums_are_within_rounding_of_gloos_own(world, n):
    for out in world(n).run(checks.against_native, torch.float32, False):
        # n terms of |x| < ~5 in fp32: rounding bounded by n * 5 * 2^-23, far below 1e-5
        assert out["err"] < 1e-5 and out["native err"] < 1e-5


def test_a_buffer_not_world_size_times_the_slice_is_refused(world):
    for msg in world(2).run(checks.refuses_a_buffer_of_the_wrong_size):
        assert "world size x the slice" in msg and "7 elements into 3" in msg


def test_the_receive_buffer_is_unseen_by_dispatch_modes(world):
    """Workspace: a tracer of live tensors must not count it as non-model data."""
    for ops in world(2).run(checks.unseen_by_dispatch_modes):
        assert ops == [], ops
