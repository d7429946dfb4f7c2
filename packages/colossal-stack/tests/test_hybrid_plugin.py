"""HybridParallelPlugin and GeminiPlugin(tp_size=...) through the Booster: layouts of tensor
(1d/2d/2.5d/3d), pipeline, sequence and data parallelism with ZeRO-1/2 or Gemini, clipping on in
each, against single-process AdamW (checks in ``_checks_hybrid.py``), and bad settings refused
before any process group exists.

[Note: hybrid tolerances] The parallel algorithm is exact: run in float64 (model and reference),
the layouts of ``CASES_8`` match AdamW within ``FLOAT64_TOL`` = 1e-12 in losses and weights
(measured <= 4e-16 and <= 3.3e-14 after 10 steps). In fp32 the losses stay within the issue's 1e-5
(measured <= 1.5e-7), the weights not always: AdamW divides each gradient element by its own
running magnitude, so the ~1e-7 rounding of a different summation order becomes ~1e-5 of the
weights within a few steps. That is fp32's limit, not the layouts': single-process fp32 AdamW
ends 1.7e-6 (2 blocks) to 7.3e-6 (8 blocks) from the float64 result, and every layout ends at
the same distance from it (1.1e-6 to 1.6e-5); two fp32 runs differ by up to the sum. The worst
measured against fp32 AdamW is 1.6e-5 (ring sp2 x dp4), so ``FP32_WEIGHT_TOL`` = 5e-5, for
every fp32 layout: the ring's merged softmax reorders sums as tensor parallelism does (ring sp2 x
dp2 measured 1.3e-5 on an AVX-512 CPU, and under 1e-5 on others).
See docs/parallel/hybrid.md for every figure.
"""

from __future__ import annotations

import pytest
from _checks_hybrid import (
    bad_settings,
    gemini_case,
    gemini_lazy_case,
    low_precision_case,
    train_case,
)

from colossal_zero import GeminiConfig

STEPS = 10
STEPS_64 = 3  # the float64 runs show exactness; a few steps do (each adds rounding in fp32 only)
LOSS_TOL = 1e-5
FP32_WEIGHT_TOL = 5e-5
FLOAT64_TOL = 1e-12

CASES_4 = {
    "tp2-dp2-zero1": {"tp_size": 2, "zero_stage": 1},
    "tp2-pp2": {"tp_size": 2, "pp_size": 2, "microbatches": 2},
    "pp2-dp2-zero1": {"pp_size": 2, "microbatches": 4, "zero_stage": 1},
    "ring-sp2-dp2": {"sequence_parallel": "ring", "sp_size": 2},
    # sequence parallelism with ZeRO: ZeRO shards over dp x sp ([Note: hybrid gradients])
    "ring-sp2-dp2-zero2": {"sequence_parallel": "ring", "sp_size": 2, "zero_stage": 2},
    "ulysses-sp2-dp2-zero1": {"sequence_parallel": "ulysses", "sp_size": 2, "zero_stage": 1},
    # ... and inside a pipeline with ZeRO-2 (the loss scaled by sp in the schedule's backward)
    "ring-sp2-pp2-zero2": {
        "sequence_parallel": "ring",
        "sp_size": 2,
        "pp_size": 2,
        "microbatches": 2,
        "zero_stage": 2,
    },
    "megatron-tp2-dp2-zero2": {
        "tp_size": 2,
        "sequence_parallel": "megatron",
        "zero_stage": 2,
    },
}

# name -> (plugin settings, GPT layers, the mesh the plugin reports); the 8-rank matrix,
# clipping on in every case (the grid modes on 2 blocks: their 8 ranks each run every block)
CASES_8: dict[str, tuple[dict, int, str]] = {
    "1d-tp2-dp4-zero1": ({"tp_size": 2, "zero_stage": 1}, 4, "dp4 x tp2(1d), zero1"),
    "2d-tp4-dp2-zero2": (
        {"tp_size": 4, "tp_mode": "2d", "zero_stage": 2},
        2,
        "dp2 x tp4(2d), zero2",
    ),
    "2.5d-tp8-q2-d2": ({"tp_size": 8, "tp_mode": "2.5d", "tp_depth": 2}, 2, "dp1 x tp8(2.5d)"),
    "3d-tp8": ({"tp_size": 8, "tp_mode": "3d"}, 2, "dp1 x tp8(3d)"),
    "tp2-pp2-dp2-1f1b-zero1": (
        {"tp_size": 2, "pp_size": 2, "microbatches": 2, "schedule": "1f1b", "zero_stage": 1},
        4,
        "dp2 x tp2(1d) x pp2(1f1b, m=2), zero1",
    ),
    # ZeRO-2 inside a pipeline: the tied embedding summed after ZeRO's in-backward reduction
    "zero2-pp2-tp2-dp2": (
        {"tp_size": 2, "pp_size": 2, "microbatches": 2, "zero_stage": 2},
        4,
        "dp2 x tp2(1d) x pp2(1f1b, m=2), zero2",
    ),
    # 4 stages x 2 virtual chunks: one block per chunk
    "pp4-dp2-interleaved": (
        {"pp_size": 4, "microbatches": 4, "schedule": "interleaved"},
        8,
        "dp2 x pp4(interleaved, m=4)",
    ),
    "ring-sp2-dp4": ({"sequence_parallel": "ring", "sp_size": 2}, 4, "dp4 x sp2(ring)"),
    # long sequences with tp and pp: ring/Ulysses over sp beside 1d tp and the stages
    "ring-sp2-tp2-dp2": (
        {"sequence_parallel": "ring", "sp_size": 2, "tp_size": 2},
        4,
        "dp2 x tp2(1d) x sp2(ring)",
    ),
    "ulysses-sp2-pp2-dp2-1f1b": (
        {"sequence_parallel": "ulysses", "sp_size": 2, "pp_size": 2, "microbatches": 2},
        4,
        "dp2 x pp2(1f1b, m=2) x sp2(ulysses)",
    ),
    # a grid mode inside pipeline stages: the activation between stages keeps its 2d layout
    "2d-tp4-pp2-interleaved": (
        {"tp_size": 4, "tp_mode": "2d", "pp_size": 2, "microbatches": 4, "schedule": "interleaved"},
        4,
        "dp1 x tp4(2d) x pp2(interleaved, m=4)",
    ),
    # with activation checkpointing: ring attention recomputed in backward, inside the stages
    "ring-sp2-pp2-tp2-ac": (
        {"sequence_parallel": "ring", "sp_size": 2, "pp_size": 2, "tp_size": 2, "microbatches": 2}
        | {"activation_checkpointing": True},
        4,
        "dp1 x tp2(1d) x pp2(1f1b, m=2) x sp2(ring)",
    ),
    # ring over sp and Megatron's split over tp inside the stages: boundaries are T/(sp*tp) long
    "ring-megatron-sp2-tp2-pp2": (
        {"sequence_parallel": "ring+megatron", "sp_size": 2, "pp_size": 2, "tp_size": 2}
        | {"microbatches": 2},
        4,
        "dp1 x tp2(1d, megatron sp) x pp2(1f1b, m=2) x sp2(ring)",
    ),
}
# One case per mechanism, in float64 with zero_stage=0 (the ZeRO and Gemini layouts below run
# with precision="fp64", which keeps their states in float64 too);
# 2.5d with d=2 runs 2d's SUMMA on each depth layer, so 2d is covered by it.
FLOAT64_CASES = ("2.5d-tp8-q2-d2", "3d-tp8", "tp2-pp2-dp2-1f1b-zero1", "pp4-dp2-interleaved")
FLOAT64_CASES += ("ring-sp2-dp4", "ring-sp2-tp2-dp2", "ulysses-sp2-pp2-dp2-1f1b")
FLOAT64_CASES += ("ring-sp2-pp2-tp2-ac", "2d-tp4-pp2-interleaved")
FLOAT64_CASES += ("ring-megatron-sp2-tp2-pp2",)

STATIC_160K = GeminiConfig(placement="static", accelerator_bytes=160 << 10)
# float64 chunks: twice the fp32 cases' budget
STATIC_320K_FP64 = GeminiConfig(placement="static", precision="fp64", accelerator_bytes=320 << 10)
GEMINI_TP2 = {"tp_size": 2, "config": STATIC_160K}
# ZeRO-3 over dp with ring sequence parallelism: chunks sharded over dp x sp
GEMINI_SP2 = {"sequence_parallel": "ring", "sp_size": 2, "config": STATIC_160K}
# ... and with 1D tp too: the chunks of each tp shard sharded over dp x sp
GEMINI_SP2_TP2 = GEMINI_SP2 | {"tp_size": 2}


def _check(out: list[dict], weight_tol: float, loss_tol: float = LOSS_TOL) -> None:
    for r in out:
        assert r["num_params"] > 0
        assert r["loss_err"] <= loss_tol, r
        assert r["weight_err"] <= weight_tol, (r["worst"], r["weight_err"])


@pytest.mark.parametrize("name", list(CASES_4))
def test_four_rank_layouts_match_adamw(world, name):
    settings = CASES_4[name]
    out = world(4).run(train_case, settings, STEPS)
    _check(out, FP32_WEIGHT_TOL)
    assert out[0]["stats"]["mesh"]


@pytest.mark.parametrize("name", list(CASES_8))
def test_eight_rank_layouts_match_adamw(world, name):
    settings, layers, mesh = CASES_8[name]
    out = world(8).run(train_case, settings, STEPS, layers)
    _check(out, FP32_WEIGHT_TOL)
    stats = out[0]["stats"]
    assert stats["mesh"] == mesh
    if settings.get("tp_size", 1) > 1:  # grid modes count each sub-axis; the total is theirs
        assert stats["comm_tp_bytes_total"] > 0


@pytest.mark.parametrize("name", FLOAT64_CASES)
def test_eight_rank_layouts_are_exact_in_float64(world, name):
    settings, layers, _ = CASES_8[name]
    out = world(8).run(train_case, {**settings, "zero_stage": 0}, STEPS_64, layers, "float64")
    _check(out, FLOAT64_TOL, FLOAT64_TOL)


def test_eight_rank_zero2_pp2_tp2_is_exact_in_fp64(world):
    """ZeRO-2 inside 1F1B stages beside 1d tp, with precision="fp64": buckets, their
    reduce-scatters, Adam's moments and the clip norm in float64 ([Note: fp64 precision] in
    colossal-zero), so the layout equals float64 AdamW as the zero_stage=0 ones do."""
    settings, layers, mesh = CASES_8["zero2-pp2-tp2-dp2"]
    fp64 = {**settings, "precision": "fp64"}
    out = world(8).run(train_case, fp64, STEPS_64, layers, "float64")
    _check(out, FLOAT64_TOL, FLOAT64_TOL)
    assert out[0]["stats"]["mesh"] == mesh
    assert all(r["dtypes"] == ["torch.float64"] for r in out)


# Gemini (ZeRO-3) with ring sp2 beside tp2 on 8 ranks: dp2 x tp2 x sp2, chunks in float64,
# sharded over dp x sp; the budget (twice the fp32 cases') still moves chunks
GEMINI_SP2_TP2_FP64 = GEMINI_SP2_TP2 | {"config": STATIC_320K_FP64}


def test_eight_rank_gemini_ring_sp2_tp2_dp2_is_exact_in_fp64(world, tmp_path):
    out = world(8).run(gemini_case, GEMINI_SP2_TP2_FP64, STEPS_64 + 1, str(tmp_path), 2, "float64")
    _check(out, FLOAT64_TOL, FLOAT64_TOL)
    for r in out:
        assert r["stats"]["mesh"] == "dp2 x tp2(1d) x sp2(ring), gemini"
        assert r["dtypes"] == ["torch.float64"]
        assert r["resume_err"] <= FLOAT64_TOL  # the checkpoint keeps float64
    assert out[0]["export_err"] <= FLOAT64_TOL


# ring/Ulysses over sp2 with Megatron sequence parallelism over tp2 (dp1): float64 shows the
# composition exact; ZeRO-2 shards over dp x sp beside it (precision="fp64": exact too)
LONG_MEGATRON = {
    "ring+megatron": ({}, STEPS_64, "float64", FLOAT64_TOL, FLOAT64_TOL),
    "ulysses+megatron": ({}, STEPS_64, "float64", FLOAT64_TOL, FLOAT64_TOL),
    "ring+megatron-zero2": (
        {"zero_stage": 2, "precision": "fp64"},
        STEPS_64,
        "float64",
        FLOAT64_TOL,
        FLOAT64_TOL,
    ),
}


@pytest.mark.parametrize("name", list(LONG_MEGATRON))
def test_long_sequence_with_megatron_sp_matches_adamw(world, name):
    """Each rank's T/2 slice is split again over the tp ranks outside attention
    (reduce-scattered, all-gathered): the counted tp collectives show it."""
    extra, steps, dtype, weight_tol, loss_tol = LONG_MEGATRON[name]
    kind = name.split("-")[0]
    settings = {"sequence_parallel": kind, "sp_size": 2, "tp_size": 2, **extra}
    out = world(4).run(train_case, settings, steps, 2, dtype)
    _check(out, weight_tol, loss_tol)
    zero = ", zero2" if extra else ""
    long = kind.split("+")[0]
    assert out[0]["stats"]["mesh"] == f"dp1 x tp2(1d, megatron sp) x sp2({long}){zero}"
    assert all({"all_gather", "reduce_scatter"} <= set(r["tp_ops"]) for r in out)
    assert all(r["stats"]["comm_sp_bytes_total"] > 0 for r in out)


# ... and in bf16/fp16 with ZeRO-1/2 (tp2 x sp2, dp1), judged as colossal-zero's low-precision
# tests judge them ([Note: bf16 tolerance] there): losses within 3e-2 of fp32 AdamW's, every
# tensor's fp32 master within a quarter of fp32 training's displacement of it
LOW_PRECISION_TOL, LOW_PRECISION_DRIFT = 3e-2, 0.25
LONG_MEGATRON_LOW = {
    "ring+megatron-zero1-bf16": (1, "bf16"),
    "ulysses+megatron-zero2-bf16": (2, "bf16"),
    "ring+megatron-zero2-fp16": (2, "fp16"),
    "ulysses+megatron-zero1-fp16": (1, "fp16"),
}


@pytest.mark.parametrize("name", list(LONG_MEGATRON_LOW))
def test_long_sequence_with_megatron_sp_in_low_precision(world, name):
    stage, precision = LONG_MEGATRON_LOW[name]
    kind = name.split("-")[0]
    settings = {"sequence_parallel": kind, "sp_size": 2, "tp_size": 2}
    settings |= {"zero_stage": stage, "precision": precision}
    out = world(4).run(low_precision_case, settings, 4)
    dtype = {"bf16": "torch.bfloat16", "fp16": "torch.float16"}[precision]
    for r in out:
        assert r["loss_err"] <= LOW_PRECISION_TOL, r
        assert r["drift"] <= LOW_PRECISION_DRIFT, (r["worst"], r["drift"])
        assert r["dtypes"] == [dtype] and not r["skipped"]
        assert {"all_gather", "reduce_scatter"} <= set(r["tp_ops"])
    long = kind.split("+")[0]
    mesh = f"dp1 x tp2(1d, megatron sp) x sp2({long}), zero{stage}"
    assert out[0]["mesh"] == mesh


# ... and inside pipeline stages, in the 8-rank world (sp2 x tp2 x pp2), every schedule:
# interleaved with ZeRO-1 in bf16, 1F1B with ZeRO-2 in fp16, GPipe with ZeRO-2 in bf16
# (boundaries T/(sp*tp) long, in the compute dtype)
LONG_MEGATRON_PP_LOW = {
    "ring+megatron-pp2-interleaved-zero1-bf16": (
        {"sequence_parallel": "ring+megatron", "schedule": "interleaved", "microbatches": 4}
        | {"zero_stage": 1, "precision": "bf16"},
        "dp1 x tp2(1d, megatron sp) x pp2(interleaved, m=4) x sp2(ring), zero1",
    ),
    "ulysses+megatron-pp2-1f1b-zero2-fp16": (
        {"sequence_parallel": "ulysses+megatron", "microbatches": 2}
        | {"zero_stage": 2, "precision": "fp16"},
        "dp1 x tp2(1d, megatron sp) x pp2(1f1b, m=2) x sp2(ulysses), zero2",
    ),
    "ring+megatron-pp2-gpipe-zero2-bf16": (
        {"sequence_parallel": "ring+megatron", "schedule": "gpipe", "microbatches": 2}
        | {"zero_stage": 2, "precision": "bf16"},
        "dp1 x tp2(1d, megatron sp) x pp2(gpipe, m=2) x sp2(ring), zero2",
    ),
}


@pytest.mark.parametrize("name", list(LONG_MEGATRON_PP_LOW))
def test_long_sequence_with_megatron_sp_in_stages_in_low_precision(world, name):
    extra, mesh = LONG_MEGATRON_PP_LOW[name]
    settings = {"sp_size": 2, "tp_size": 2, "pp_size": 2, **extra}
    out = world(8).run(low_precision_case, settings, 4, 4)
    for r in out:
        assert r["loss_err"] <= LOW_PRECISION_TOL, r
        assert r["drift"] <= LOW_PRECISION_DRIFT, (r["worst"], r["drift"])
        assert not r["skipped"]
    assert out[0]["mesh"] == mesh


def test_gemini_tp2_dp2_moves_chunks_matches_adamw_and_resumes(world, tmp_path):
    out = world(4).run(gemini_case, GEMINI_TP2, STEPS, str(tmp_path))
    _check(out, 1e-5)  # measured 3.6e-7: 2 layers, see [Note: hybrid tolerances]
    for r in out:
        assert r["stats"]["bytes_moved_total"] > 0  # the budget forced chunk moves
        assert r["stats"]["mesh"] == "dp2 x tp2(1d), gemini"
        assert r["stats"]["comm_tp_bytes_total"] > 0
        assert r["resume_err"] <= 1e-6  # same layout: measured 0 (bit-identical)
    first = out[0]
    assert first["folders"] == [] and first["layout_index"]  # any tp size resumes it
    assert first["export_names"] and first["export_err"] <= 1e-5


@pytest.mark.parametrize("precision", ["fp32", "fp64"])
def test_gemini_ring_sp2_dp2_matches_adamw_and_resumes(world, tmp_path, precision):
    if precision == "fp64":  # float64 chunks: twice the budget; exact, so 1e-12 throughout
        settings = GEMINI_SP2 | {"config": STATIC_320K_FP64}
        out = world(4).run(gemini_case, settings, STEPS_64 + 1, str(tmp_path), 2, "float64")
        _check(out, FLOAT64_TOL, FLOAT64_TOL)
        assert out[0]["resume_err"] <= FLOAT64_TOL and out[0]["export_err"] <= FLOAT64_TOL
    else:
        out = world(4).run(gemini_case, GEMINI_SP2, STEPS, str(tmp_path))
        _check(out, FP32_WEIGHT_TOL)
    for r in out:
        assert r["stats"]["mesh"] == "dp2 x sp2(ring), gemini"
        assert r["stats"]["comm_sp_bytes_total"] > 0  # the ring passed keys and values
        assert r["resume_err"] <= 1e-6  # same layout, layout-independent checkpoint
    assert out[0]["layout_index"] and out[0]["export_err"] <= 1e-5


def test_gemini_ring_sp2_tp2_matches_adamw_and_resumes(world, tmp_path):
    out = world(4).run(gemini_case, GEMINI_SP2_TP2, STEPS, str(tmp_path))
    _check(out, FP32_WEIGHT_TOL)
    for r in out:
        assert r["stats"]["mesh"] == "dp1 x tp2(1d) x sp2(ring), gemini"
        assert r["stats"]["comm_sp_bytes_total"] > 0 and r["stats"]["comm_tp_bytes_total"] > 0
        assert r["resume_err"] <= 1e-6  # same layout, layout-independent checkpoint
    assert out[0]["layout_index"] and out[0]["export_err"] <= 1e-5


def test_bad_settings_are_one_line_config_errors(world):
    out = world(4).run(bad_settings)[0]
    assert "does not divide the world size 4" in out["not dividing"]
    assert "q*q" in out["non-square 2d"]
    assert "GeminiPlugin" in out["zero 3"] and "--tp" in out["zero 3"]
    assert "at most 2 stages" in out["stages > layers"]
    assert "tp_size=3 does not divide the world size 4" in out["gemini not dividing"]
    assert "q*q*q" in out["gemini non-cube 3d"]
    assert "tp_mode must be one of" in out["gemini tp mode"]
    assert "GPT and PaLM" in out["gemini model"]
    assert "ZeRO-1's Adam supports neither amsgrad nor maximize" in out["zero amsgrad"]
    assert all("\n" not in v for v in out.values())


@pytest.mark.parametrize(
    "ranks,settings",
    [(2, {"tp_size": 2}), (4, {"tp_size": 2, "sequence_parallel": "ring", "sp_size": 2})],
    ids=["tp2", "ring-sp2-tp2"],
)
def test_gemini_tp_trains_a_lazily_built_model_as_an_eager_one(world, ranks, settings):
    out = world(ranks).run(gemini_lazy_case, settings, 3)
    for r in out:
        assert r["lazy"] == r["eager"]  # lazy init replays construction bit for bit


# Gemini over dp2 with 2d tp4 on 8 ranks: every grid operator hands its parameter to a custom
# autograd Function, which Gemini's operator hooks see only through colossal-parallel's
# torch_function_op ([Note: operators a mode sees]); before, the first backward failed (the
# tied head's gather recorded the weight at rest, an empty tensor on its dp-sharded chunk).
# Its checkpoint resumes and exports in float64 too (its index once listed the grid
# LayerNorms' frozen zero biases without blocks: [Note: parameters without pieces] in
# colossal.checkpoint._layout; other layouts resume it in test_grid_checkpoint.py)
STATIC_160K_FP64 = GeminiConfig(placement="static", precision="fp64", accelerator_bytes=160 << 10)
GEMINI_DP2_TP4_2D = GEMINI_TP2 | {"tp_size": 4, "tp_mode": "2d", "config": STATIC_160K_FP64}


@pytest.mark.slow
@pytest.mark.outside_ci  # about a minute on two cores: nox -s layouts; CI trains this layout a
def test_gemini_dp2_with_2d_tp4_is_exact_in_fp64(world, tmp_path):  # step in test_layouts_build
    out = world(8).run(gemini_case, GEMINI_DP2_TP4_2D, STEPS_64 + 1, str(tmp_path), 2, "float64")
    _check(out, FLOAT64_TOL, FLOAT64_TOL)
    for r in out:
        assert r["stats"]["mesh"] == "dp2 x tp4(2d), gemini"
        assert r["stats"]["bytes_moved_total"] > 0  # the budget forced chunk moves
        assert r["resume_err"] <= FLOAT64_TOL  # the checkpoint keeps float64
    assert out[0]["export_err"] <= FLOAT64_TOL
