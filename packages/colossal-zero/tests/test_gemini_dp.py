"""Gemini on 2 and 4 data-parallel ranks (gloo) against plain AdamW on one process, and sharded
checkpoints across data-parallel sizes."""

from __future__ import annotations

import _checks_zero as checks
import pytest
import torch
from _zero_model import assert_like_fp32, build, reference
from test_gemini import BATCH, STEPS, assert_losses_close, rel_err

from colossal_zero import GeminiConfig, consolidate

# Gathered chunks cost shard + full buffer: budgets that still force moves in every step (with
# parameters packed in first-use order after warmup, 220 kB no longer did on 4 ranks).
DP = GeminiConfig(precision="fp32", accelerator_bytes=220_000, chunk_numel=8192)
DP4 = GeminiConfig(precision="fp32", accelerator_bytes=180_000, chunk_numel=8192)


@pytest.mark.parametrize("n", [2, 4])
def test_data_parallel_fp32_matches_single_process_adamw(world, n):
    out = world(n).run(checks.run_gemini, DP if n == 2 else DP4, STEPS, BATCH)
    ref_losses, ref_weights = reference(STEPS, BATCH)
    for losses, weights, moved in out:
        assert_losses_close(losses, ref_losses, 1e-5)
        assert rel_err(weights, ref_weights) <= 1e-5
        assert all(m > 0 for m in moved)


def test_tied_head_leaves_room_between_its_readers(world):
    # [Note: released after backward]: under 100 kB a chunk in use (64 kB: shard, buffer and
    # gradient shard) and a gathered buffer (32 kB) fit, but not a third chunk; the tied head's
    # chunk, pinned from the head's backward to the embedding's, made one (CapacityError)
    cfg = GeminiConfig(precision="fp32", accelerator_bytes=100_000, chunk_numel=8192)
    losses, weights, _ = world(2).run(checks.run_gemini, cfg, STEPS, BATCH)[0]
    ref_losses, ref_weights = reference(STEPS, BATCH)
    assert_losses_close(losses, ref_losses, 1e-5)
    assert rel_err(weights, ref_weights) <= 1e-5


def test_data_parallel_accumulation_and_clipping(world):
    out = world(2).run(checks.run_gemini, DP, 6, BATCH, accum=2, clip=0.5)
    ref_losses, ref_weights = reference(6, BATCH, accum=2, clip=0.5)
    losses, weights, _ = out[0]
    assert_losses_close(losses, ref_losses, 1e-5)
    assert rel_err(weights, ref_weights) <= 1e-5


def test_data_parallel_bf16_within_autocast_tolerance(world):
    cfg = GeminiConfig(precision="bf16", accelerator_bytes=120_000, chunk_numel=8192)
    losses, weights, _ = world(2).run(checks.run_gemini, cfg, 10, BATCH)[0]
    ref_losses, _ = reference(10, BATCH, autocast=True)
    assert_losses_close(losses, ref_losses, 3e-2)
    assert_like_fp32(weights, 10, BATCH)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_save_load_continue_across_data_parallel_sizes(world, tmp_path, precision):
    cfg = GeminiConfig(precision=precision, accelerator_bytes=220_000, chunk_numel=8192)
    steps, save_at = 6, 3
    uninterrupted = world(2).run(
        checks.save_and_continue, cfg, str(tmp_path), steps, BATCH, save_at
    )
    same = world(2).run(checks.load_and_continue, cfg, str(tmp_path), steps, BATCH, save_at)
    assert same[0] == uninterrupted[0]  # same layout: exactly the same losses
    for n in (4, 1):
        if n == 1:
            resumed = checks.load_and_continue(cfg, str(tmp_path), steps, BATCH, save_at)
        else:
            resumed = world(n).run(
                checks.load_and_continue, cfg, str(tmp_path), steps, BATCH, save_at
            )[0]
        assert_losses_close(resumed, uninterrupted[0], 1e-5 if precision == "fp32" else 1e-2)
    # the consolidated export loads into the plain module with strict=True
    plain = build(seed=99)
    plain.load_state_dict(consolidate(tmp_path), strict=True)
    x, y = checks.batches(save_at + 1, BATCH)[save_at]
    if precision == "fp32":
        assert abs(plain(x, y).item() - uninterrupted[0][0]) <= 1e-5 * uninterrupted[0][0]
    assert plain.wte.weight is plain.wte.weight  # tied names load into one parameter
    assert torch.isfinite(plain.wte.weight).all()


def test_ranks_that_use_different_parameters_raise_on_every_rank_instead_of_hanging(world):
    msgs = world(2).run(checks.diverging_forward, DP, BATCH)
    for msg in msgs:
        assert "ranks diverged" in msg, msg
        assert "rank 0: all-gather of chunk" in msg and "rank 1:" in msg
        assert "blocks.1" in msg  # names what rank 0 wanted and rank 1 skipped
    assert msgs[0] == msgs[1]
