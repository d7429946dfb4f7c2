"""A two-block transformer trained 5 steps with 1D tensor parallelism (and with sequence
parallelism) matches the single-process run, on 2 and 4 ranks."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import _checks_parallel_tp1d as checks

TOL = 1e-5


@pytest.mark.parametrize("sp", [False, True], ids=["1d", "1d+sp"])
@pytest.mark.parametrize("n", [2, 4])
def test_training_matches_single_process(world, n, sp):
    results = world(n).run(checks.train_transformer, sp)
    for rank, res in enumerate(results):
        ref, par = res["losses_ref"], res["losses_par"]
        assert len(par) == 5
        assert ref[-1] < ref[0]  # it does learn
        for step, (a, b) in enumerate(zip(par, ref)):
            assert abs(a - b) <= TOL * abs(b), f"rank {rank} step {step}: {a} vs {b}"
        assert len(res["param_errs"]) == res["num_ref_params"]  # every parameter compared
        for name, err in res["param_errs"].items():
            assert err <= TOL, f"rank {rank} {name}: relative error {err:.2e}"
    # every rank saw the same loss and moved the same bytes
    assert len({tuple(r["losses_par"]) for r in results}) == 1
    assert all(r["bytes"] == results[0]["bytes"] for r in results)
    ops = {op for _, op in results[0]["bytes"][0]}
    assert ops == ({"all_gather", "reduce_scatter", "all_reduce"} if sp else {"all_reduce"})
