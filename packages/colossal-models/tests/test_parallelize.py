"""GPT and PaLM under every tensor-parallel mode against the unsharded model (one world per size).

Cases are data: (model, mode, sequence_parallel, activation_checkpointing) per world size.
"""

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import _checks_models_tp as checks

CASES = {
    2: [
        ("gpt", "1d", False, False),
        ("gpt", "1d", True, False),
        ("palm", "1d", False, False),
        ("palm", "1d", True, True),
        ("llama", "1d", True, False),
    ],
    4: [
        ("gpt", "1d", True, True),
        ("palm", "1d", False, False),
        ("llama", "1d", True, False),  # 2 key/value heads shared by 4 ranks
        ("gpt", "2d", False, False),
        ("palm", "2d", False, True),
        ("palm-seq", "2d", False, False),
    ],
    8: [
        ("gpt", "2.5d", False, False),
        ("palm", "2.5d", False, False),
        ("gpt", "3d", False, False),
        ("palm", "3d", False, True),
        ("palm-seq", "3d", False, False),
    ],
}


@pytest.mark.parametrize("size", sorted(CASES))
def test_sharded_models_match_the_unsharded_one(world, size):
    results = world(size).run(checks.run_cases, CASES[size])
    for case, *others in zip(CASES[size], *results):
        r = case_result = others[0]
        name = "/".join(str(c) for c in case)
        for other in others[1:]:  # every rank reports the same loss
            assert other["loss"] == r["loss"] and other["losses"]["par"] == r["losses"]["par"], name
        ref, par = case_result["loss"]
        assert math.isclose(ref, par, rel_tol=1e-5), (name, ref, par)
        assert r["logits_err"] < 1e-4, (name, r["logits_err"])
        assert r["num_params_checked"] > 0
        assert r["numel"][1] < r["numel"][0] * 0.75, (name, r["numel"])  # each rank holds a shard
        assert (r["sp_layers"] > 0) == case[2] and (r["ac_blocks"] == 2) == case[3], name
        assert max(o["grad_err"] for o in others) < 1e-4, (name, [o["grad_err"] for o in others])
        for a, b in zip(r["losses"]["ref"], r["losses"]["par"]):
            assert math.isclose(a, b, rel_tol=1e-4), (name, r["losses"])
        assert r["losses"]["ref"][-1] < r["losses"]["ref"][0]  # it trained
        # gathering the shards gives back the unsharded weights exactly, and after training a
        # model that computes the sharded model's loss
        assert all(o["gather_exact"] for o in others), name
        assert max(o["merged_err"] for o in others) < 1e-5, (
            name,
            [o["merged_err"] for o in others],
        )


@pytest.mark.parametrize(("size", "model", "mode"), [(4, "palm", "1d"), (8, "gpt", "2d")])
def test_data_parallel_replicas_of_a_sharded_model(world, size, model, mode):
    results = world(size).run(checks.run_dp_case, model, mode)
    for r in results:
        ref, par = r["loss"]
        assert math.isclose(ref, par, rel_tol=1e-5), r
        assert r["grad_err"] < 1e-4, r


def test_plan_misuse_is_a_clear_error(world):
    one_d = world(2).run(checks.plan_errors)[0]
    assert "does not match the mesh's tp_mode '1d'" in one_d["mode"]
    assert "knows GPT and PaLM" in one_d["model"]
    assert "3 heads cannot be split over the 2 ranks" in one_d["heads"]
    assert "3 key/value heads neither split over nor divide the 2" in one_d["kv"]
    assert one_d["sp"] == "no error" and one_d["rmsnorm"] == "no error"  # both fine in 1d
    two_d = world(4).run(checks.plan_errors)[0]
    assert "sequence parallelism is the 1d mode's" in two_d["sp"]
    assert "no RMSNorm" in two_d["rmsnorm"]
