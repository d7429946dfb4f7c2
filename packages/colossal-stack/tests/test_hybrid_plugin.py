"""HybridParallelPlugin through the Booster: layouts of tensor, pipeline, sequence and data
parallelism with ZeRO-1/2, clipping on, against single-process AdamW (checks in
``_checks_hybrid.py``), and bad settings refused before any process group exists.

Tolerances: losses within 1e-5; weights within 1e-5 without tensor parallelism and 5e-5 with it
(tensor parallelism's all-reduces sum in another order; AdamW turns ~1e-7 gradient differences
into ~1e-5 weight differences after a few steps, see colossal-models' [Note: pipeline vs tp])."""

from __future__ import annotations

import pytest
from _checks_hybrid import bad_settings, train_case

STEPS = 10

CASES_4 = {
    "tp2-dp2-zero1": {"tp_size": 2, "zero_stage": 1},
    "tp2-pp2": {"tp_size": 2, "pp_size": 2, "microbatches": 2},
    "pp2-dp2-zero1": {"pp_size": 2, "microbatches": 4, "zero_stage": 1},
    "ring-sp2-dp2": {"sequence_parallel": "ring", "sp_size": 2},
    "megatron-tp2-dp2-zero2": {
        "tp_size": 2,
        "sequence_parallel": "megatron",
        "zero_stage": 2,
    },
}


def _check(out: list[dict], tp: bool) -> None:
    for r in out:
        assert r["num_params"] > 0
        assert r["loss_err"] <= 1e-5, r
        assert r["weight_err"] <= (5e-5 if tp else 1e-5), (r["worst"], r["weight_err"])


@pytest.mark.parametrize("name", list(CASES_4))
def test_four_rank_layouts_match_adamw(world, name):
    settings = CASES_4[name]
    out = world(4).run(train_case, settings, STEPS)
    _check(out, settings.get("tp_size", 1) > 1)
    assert out[0]["stats"]["mesh"]


def test_bad_settings_are_one_line_config_errors(world):
    out = world(4).run(bad_settings)[0]
    assert "does not divide the world size 4" in out["not dividing"]
    assert "q*q" in out["non-square 2d"]
    assert "GeminiPlugin" in out["zero 3"] and "--tp" in out["zero 3"]
    assert "at most 2 stages" in out["stages > layers"]
    assert all("\n" not in v for v in out.values())
